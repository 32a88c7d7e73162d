// `rpa bench`'s oneDNN peer (testing/onednn_peer.h) against the reference on
// tiny batches: the comparison the bench prints is between two correct
// implementations. Skipped, with the reason, in a build without oneDNN.
// Times nothing.
#include "testing/onednn_peer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "rpa/options.h"
#include "rpa/reference.h"
#include "testing/synthetic_batch.h"

namespace rpa::testing {
namespace {

// The bench's bar (unit-scale inputs; the peer rounds P to bf16 before PV):
// 2e-2 plus one bf16 ulp of the reference value (ToleranceRatio <= 1).
constexpr double kPeerTolerance = 2e-2;

struct PeerCase {
  int64_t num_q_heads, num_kv_heads, head_dim, page_size;
  std::vector<SequenceShape> sequences;
  int64_t padding_rows;
};

class OnednnPeerTest : public ::testing::TestWithParam<PeerCase> {
 protected:
  void SetUp() override {
    const OnednnPeerInfo info = GetOnednnPeerInfo();
    if (!info.available) GTEST_SKIP() << "oneDNN peer not built: " << info.reason;
  }
};

TEST_P(OnednnPeerTest, AgreesWithTheReference) {
  const PeerCase& c = GetParam();
  BatchSpec spec;
  spec.num_q_heads = c.num_q_heads;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.page_size = c.page_size;
  spec.sequences = c.sequences;
  int64_t total = 0;
  for (const SequenceShape& s : c.sequences) total += s.q_len;
  spec.max_num_batched_tokens = total + c.padding_rows;
  spec.seed = 11;
  const SyntheticBatch batch = MakeSyntheticBatch(spec);
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::vector<uint8_t> ref = batch.NewOutput();
  RefRaggedPagedAttention(
      batch.Q(), batch.KvPages(),
      PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
      batch.OutView(ref));
  for (int threads : {1, 2}) {
    OnednnPeer peer(batch, threads, options.sm_scale);
    EXPECT_FALSE(peer.MatmulImpl().empty());
    // Garbage in the output first: every row, padding too, must be written.
    std::vector<uint8_t> out(batch.NewOutput().size(), 0x7F);
    for (int call = 0; call < 2; ++call) {  // Reused primitives give the same result.
      peer.Run(batch.kv_pages.data(), out.data());
      const double err = MaxAbsDifference(batch, out, ref);
      EXPECT_LE(ToleranceRatio(batch, out, ref, kPeerTolerance), 1.0)
          << "threads=" << threads << " call=" << call << " max abs difference " << err;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, OnednnPeerTest,
    ::testing::Values(
        // GQA 4, chunked prefill, decode rows and a prefill, padding rows.
        PeerCase{8, 2, 64, 16, {{1, 40}, {5, 5}, {7, 30}, {33, 33}}, 3},
        // MHA, page_size 1, an odd head_dim.
        PeerCase{4, 4, 40, 1, {{3, 9}, {1, 1}, {12, 20}}, 0},
        // MQA, pages of 7, a sequence with no new rows.
        PeerCase{8, 1, 128, 7, {{2, 50}, {0, 10}, {17, 17}}, 1}));

// The check has teeth: the peer at twice the scale is far outside the bar.
TEST(OnednnPeerCheckTest, AWrongScaleFailsTheBar) {
  if (!GetOnednnPeerInfo().available) GTEST_SKIP() << GetOnednnPeerInfo().reason;
  BatchSpec spec;
  spec.num_q_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.sequences = {{9, 40}, {1, 30}};
  const SyntheticBatch batch = MakeSyntheticBatch(spec);
  AttentionOptions options;
  options.sm_scale = 0.125;
  std::vector<uint8_t> ref = batch.NewOutput();
  RefRaggedPagedAttention(
      batch.Q(), batch.KvPages(),
      PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
      batch.OutView(ref));
  OnednnPeer peer(batch, 1, 2 * options.sm_scale);
  std::vector<uint8_t> out = batch.NewOutput();
  peer.Run(batch.kv_pages.data(), out.data());
  EXPECT_GT(ToleranceRatio(batch, out, ref, kPeerTolerance), 2.0);
}

TEST(OnednnPeerInfoTest, SaysWhatItIsOrWhyNot) {
  const OnednnPeerInfo info = GetOnednnPeerInfo();
  if (info.available) {
    EXPECT_FALSE(info.version.empty());
    EXPECT_FALSE(info.isa.empty());
    EXPECT_FALSE(info.threading.empty());
  } else {
    EXPECT_FALSE(info.reason.empty());
  }
}

TEST(OnednnPeerInfoTest, RefusesWhatItDoesNotCover) {
  if (!GetOnednnPeerInfo().available) GTEST_SKIP() << GetOnednnPeerInfo().reason;
  BatchSpec spec;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 32;
  spec.kv_dtype = DType::kF16;
  spec.sequences = {{2, 4}};
  const SyntheticBatch batch = MakeSyntheticBatch(spec);
  EXPECT_THROW(OnednnPeer(batch, 1, 1.0), std::invalid_argument);
}

}  // namespace
}  // namespace rpa::testing
