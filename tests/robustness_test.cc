// Adversarial and limit inputs (issue 7): every bad one ends in rpa::Error
// with the output untouched, through the combined, split (NHD, HND) and
// paged_attention entry points; non-finite data propagates like the
// reference; zero-sized and misaligned views work; concurrent callers get
// the results of single calls. Findings are F<n>_ tests named
// after docs/robustness.md's F-numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "kernel/cpu_features.h"
#include "rpa/attention.h"
#include "rpa/error.h"
#include "rpa/kv_cache.h"
#include "rpa/merge.h"
#include "rpa/reference.h"
#include "testing/amx_emulation.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"

namespace rpa {
namespace {

using testing::BatchSpec;
using testing::CacheViews;
using testing::LikeReference;
using testing::MakeSyntheticBatch;
using testing::SequenceShape;
using testing::SyntheticBatch;
using testing::ViewsOf;

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr uint8_t kSentinel = 0xA5;

// One call of one entry point on a batch whose metadata may be edited.
struct Call {
  std::string name;
  std::function<void(const SyntheticBatch&, const AttentionOptions&, const MutableTensorView&)> run;
};

std::vector<Call> RaggedCalls() {
  return {
      {"combined",
       [](const SyntheticBatch& b, const AttentionOptions& o, const MutableTensorView& out) {
         RaggedPagedAttention(b.Q(), b.KvPages(),
                              PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                              out);
       }},
      {"NHD",
       [](const SyntheticBatch& b, const AttentionOptions& o, const MutableTensorView& out) {
         const CacheViews c = ViewsOf(b.KvPages());
         RaggedPagedAttention(b.Q(), KVPages{c.k_nhd, c.v_nhd, KVLayout::kNHD},
                              PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                              out);
       }},
      {"HND",
       [](const SyntheticBatch& b, const AttentionOptions& o, const MutableTensorView& out) {
         const CacheViews c = ViewsOf(b.KvPages());
         RaggedPagedAttention(b.Q(), KVPages{c.k_hnd, c.v_hnd, KVLayout::kHND},
                              PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                              out);
       }},
  };
}

// paged_attention on a decode batch: lengths = kv_lens, one q row each.
void RunPaged(const SyntheticBatch& b, const PagedAttentionOptions& o,
              const MutableTensorView& out) {
  const CacheViews c = ViewsOf(b.KvPages());
  PagedAttention(b.Q(), c.k_paged, c.v_paged, b.KvLens(), b.PageIndices(), o, out);
}

SyntheticBatch SmallBatch(std::vector<SequenceShape> seqs, int64_t page_size = 4,
                          DType dtype = DType::kF32, DType kv_dtype = DType::kF32) {
  BatchSpec spec;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.page_size = page_size;
  spec.q_dtype = dtype;
  spec.kv_dtype = dtype == DType::kF32 ? kv_dtype : dtype;
  spec.sequences = std::move(seqs);
  spec.seed = 7;
  return MakeSyntheticBatch(spec);
}

// A decode batch (q_len 1 each) with every row used: paged_attention's shape.
SyntheticBatch DecodeBatch() { return SmallBatch({{1, 5}, {1, 9}, {1, 1}}); }

// docs/contract.md §1's bound for the batch's K/V dtype.
double SpecTolerance(const SyntheticBatch& b) { return testing::KvTolerance(b.spec.kv_dtype); }

// An output of q's shape filled with NaN (0xFF bytes are NaN in f32, bf16 and
// f16), fresh for each call compared with the reference: an element the call
// leaves unwritten compares as NaN and fails, where a buffer reused from an
// earlier call would already hold the right answer.
std::vector<uint8_t> NanOutput(const SyntheticBatch& b) {
  return std::vector<uint8_t>(b.q.size(), 0xFF);
}

// Runs `fn` on a sentinel-filled output; expects rpa::Error of `kind` and
// the output bit-identical.
template <class Fn>
void ExpectRejected(const SyntheticBatch& b, ErrorKind kind, const std::string& what, Fn fn) {
  std::vector<uint8_t> out(b.q.size(), kSentinel);
  const std::vector<uint8_t> before = out;
  try {
    fn(b.OutView(out));
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << what << ": " << e.what();
    if (kind != ErrorKind::kLayout) {  // name=value (layout messages name no value).
      EXPECT_NE(std::string(e.what()).find('='), std::string::npos) << e.what();
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-rpa exception: " << e.what();
  }
  EXPECT_EQ(out, before) << what << ": out written on error";
}

void ExpectRaggedRejected(const SyntheticBatch& b, ErrorKind kind, const std::string& what,
                          const AttentionOptions& options = {}) {
  for (const Call& call : RaggedCalls()) {
    ExpectRejected(b, kind, what + " [" + call.name + "]",
                   [&](const MutableTensorView& out) { call.run(b, options, out); });
  }
  ExpectRejected(b, kind, what + " [reference]", [&](const MutableTensorView& out) {
    RefRaggedPagedAttention(b.Q(), b.KvPages(),
                            PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                            options, out);
  });
}

// ---- Page indices.

TEST(RobustnessTest, PageIndexOutOfRangeIsRejectedEverywhere) {
  const SyntheticBatch base = DecodeBatch();
  for (int32_t bad : {-1, static_cast<int32_t>(base.total_num_pages), kInt32Max, kInt32Min}) {
    SCOPED_TRACE(bad);
    SyntheticBatch b = base;
    b.page_indices[1 * b.pages_per_seq + 1] = bad;  // Sequence 1 reads column 1.
    ExpectRaggedRejected(b, ErrorKind::kPageIndex, "page index " + std::to_string(bad));
    ExpectRejected(b, ErrorKind::kPageIndex, "paged", [&](const MutableTensorView& out) {
      RunPaged(b, {}, out);
    });
  }
}

TEST(RobustnessTest, PageIndicesBeyondKvLenAreNeverRead) {
  SyntheticBatch b = DecodeBatch();
  // Sequence 2 (kv_len 1) reads column 0 only: garbage after it is fine.
  for (int64_t col = 1; col < b.spec.pages_per_seq; ++col) {
    b.page_indices[2 * b.spec.pages_per_seq + col] = kInt32Min;
  }
  std::vector<uint8_t> ref = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                          b.OutView(ref));
  for (const Call& call : RaggedCalls()) {
    std::vector<uint8_t> out = NanOutput(b);
    call.run(b, {}, b.OutView(out));
    EXPECT_LE(testing::MaxAbsDifference(b, out, ref), SpecTolerance(b)) << call.name;
  }
  std::vector<uint8_t> out = NanOutput(b);
  RunPaged(b, {}, b.OutView(out));
  EXPECT_LE(testing::MaxAbsDifference(b, out, ref), SpecTolerance(b)) << "paged";
}

// ---- Lengths that would overflow 32-bit size arithmetic.

TEST(RobustnessTest, KvLenNearInt32MaxIsACleanError) {
  const SyntheticBatch base = SmallBatch({{1, 300}, {2, 2}}, /*page_size=*/256);
  for (int32_t kv_len : {kInt32Max, kInt32Max - 1, kInt32Max - 255, kInt32Max - 256}) {
    SCOPED_TRACE(kv_len);
    SyntheticBatch b = base;
    b.kv_lens[0] = kv_len;
    ExpectRaggedRejected(b, ErrorKind::kMetadata, "kv_len " + std::to_string(kv_len));
    // The message carries the 64-bit page count: no wrap-around.
    std::vector<uint8_t> scratch(b.q.size());
    try {
      RaggedPagedAttention(b.Q(), b.KvPages(),
                           PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                           b.OutView(scratch));
    } catch (const Error& e) {
      const int64_t pages = (int64_t{kv_len} + 255) / 256;
      EXPECT_NE(std::string(e.what()).find("min_pages_per_seq=" + std::to_string(pages)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(RobustnessTest, PagedLengthNearInt32MaxIsACleanError) {
  SyntheticBatch b = DecodeBatch();
  for (int32_t len : {kInt32Max, kInt32Max - 3, -1, kInt32Min}) {
    SCOPED_TRACE(len);
    SyntheticBatch c = b;
    c.kv_lens[0] = len;
    ExpectRejected(c, ErrorKind::kMetadata, "paged length", [&](const MutableTensorView& out) {
      RunPaged(c, {}, out);
    });
  }
}

// ---- cu_q_lens and num_seqs.

TEST(RobustnessTest, CuQLensBeyondQRowsIsRejected) {
  const SyntheticBatch base = SmallBatch({{3, 5}, {2, 7}});
  const int32_t rows = static_cast<int32_t>(base.num_tokens);
  struct Edit {
    int index;
    int32_t value;
    ErrorKind kind;
  };
  for (const Edit& e : {Edit{2, rows + 1, ErrorKind::kMetadata},
                        Edit{2, kInt32Max, ErrorKind::kMetadata},
                        Edit{1, kInt32Max, ErrorKind::kMetadata},  // Then decreasing.
                        Edit{1, kInt32Min, ErrorKind::kMetadata},
                        Edit{0, -1, ErrorKind::kMetadata},
                        Edit{0, kInt32Min, ErrorKind::kMetadata}}) {
    SCOPED_TRACE(::testing::Message() << "cu_q_lens[" << e.index << "]=" << e.value);
    SyntheticBatch b = base;
    b.cu_q_lens[e.index] = e.value;
    ExpectRaggedRejected(b, e.kind, "cu_q_lens");
  }
}

TEST(RobustnessTest, NumSeqsOutOfRangeIsRejected) {
  const SyntheticBatch base = SmallBatch({{3, 5}, {2, 7}});
  for (int32_t n : {-1, kInt32Min, 3, kInt32Max}) {
    SCOPED_TRACE(n);
    SyntheticBatch b = base;
    b.num_seqs[0] = n;
    ExpectRaggedRejected(b, ErrorKind::kMetadata, "num_seqs " + std::to_string(n));
  }
}

TEST(RobustnessTest, QLenBeyondKvLenAndNegativeKvLenAreRejected) {
  const SyntheticBatch base = SmallBatch({{3, 5}, {2, 7}});
  SyntheticBatch b = base;
  b.kv_lens[0] = 2;  // q_len 3.
  ExpectRaggedRejected(b, ErrorKind::kMetadata, "q_len > kv_len");
  b = base;
  b.kv_lens[1] = -1;
  ExpectRaggedRejected(b, ErrorKind::kMetadata, "kv_len -1");
}

TEST(RobustnessTest, HugeTileOptionsAreRejectedOrHarmless) {
  const SyntheticBatch b = SmallBatch({{3, 5}, {2, 7}});
  std::vector<uint8_t> ref = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                          b.OutView(ref));
  for (int64_t q_block : {int64_t{1}, int64_t{7}, int64_t{4096}}) {
    for (int64_t vmem : {int64_t{1}, std::numeric_limits<int64_t>::max()}) {
      SCOPED_TRACE(::testing::Message() << q_block << " " << vmem);
      AttentionOptions o;
      o.num_queries_per_block = q_block;
      o.vmem_limit_bytes = vmem;
      o.num_threads = 2;
      for (const Call& call : RaggedCalls()) {
        std::vector<uint8_t> out = NanOutput(b);
        call.run(b, o, b.OutView(out));
        EXPECT_LE(testing::MaxAbsDifference(b, out, ref), SpecTolerance(b)) << call.name;
      }
    }
  }
}

// Finding F5 (fixed): a caller's num_queries_per_block sized the scratch by
// itself, not by the batch: INT32_MAX on a 3-token batch asked for ~1 TB.
TEST(RobustnessTest, F5_HugeNumQueriesPerBlockIsHarmless) {
  const SyntheticBatch b = SmallBatch({{3, 5}, {2, 7}});
  std::vector<uint8_t> ref = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                          b.OutView(ref));
  for (int64_t q_block : {int64_t{kInt32Max}, std::numeric_limits<int64_t>::max()}) {
    AttentionOptions o;
    o.num_queries_per_block = q_block;
    std::vector<uint8_t> out = NanOutput(b);
    RaggedPagedAttention(b.Q(), b.KvPages(),
                         PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                         b.OutView(out));
    EXPECT_LE(testing::MaxAbsDifference(b, out, ref), SpecTolerance(b)) << q_block;
  }
}

// Finding F6 (fixed): with pages_per_sequence 0 every pages_per_compute_block
// divides it (JAX's rule), and a huge one overflowed int64 in the plan
// (kv_block = pages_per_block * page_size), undefined behaviour that UBSan
// reports (test-asan); expected: rows of length 0 give zeros.
TEST(RobustnessTest, F6_PagedHugeComputeBlockWithNoPages) {
  const int64_t H = 2, D = 8, S = 9;
  std::vector<float> q(2 * H * D, 1.0f), out(2 * H * D, 7.0f), kv(H * 3 * S * D, 0.0f);
  const int32_t lengths[2] = {0, 0}, pages[1] = {0};
  PagedAttentionOptions o;
  o.pages_per_compute_block = int64_t{1} << 62;
  PagedAttention(TensorView(q.data(), DType::kF32, {2, H, D}),
                 TensorView(kv.data(), DType::kF32, {H, 3, S, D}),
                 TensorView(kv.data(), DType::kF32, {H, 3, S, D}),
                 TensorView(lengths, DType::kI32, {2}), TensorView(pages, DType::kI32, {2, 0}), o,
                 MutableTensorView(out.data(), DType::kF32, {2, H, D}));
  EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
}

// ---- Non-finite data inside the valid range.

// The library against the reference with NaN in the same places and
// infinities of the same sign (testing::LikeReference).
void ExpectLikeReference(const SyntheticBatch& b, const AttentionOptions& o, double tol) {
  std::vector<uint8_t> ref = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                          b.OutView(ref));
  for (const Call& call : RaggedCalls()) {
    std::vector<uint8_t> out = b.NewOutput();
    call.run(b, o, b.OutView(out));
    const auto* g = reinterpret_cast<const float*>(out.data());
    const auto* w = reinterpret_cast<const float*>(ref.data());
    int shown = 0;
    for (size_t i = 0; i < out.size() / 4 && shown < 3; ++i) {
      if (!LikeReference(g[i], w[i], tol)) {
        ADD_FAILURE() << call.name << " out[flat " << i << "] = " << g[i] << ", reference "
                      << w[i];
        ++shown;
      }
    }
  }
}

// Element d of K (v = false) or V of kv head h at key t of sequence seq.
float* KvElement(SyntheticBatch& b, int64_t seq, int64_t t, int64_t h, bool v, int64_t d) {
  const BatchSpec& s = b.spec;
  const int64_t page = b.page_indices[seq * b.pages_per_seq + t / s.page_size];
  const int64_t index = ((page * s.page_size + t % s.page_size) * 2 * s.num_kv_heads +
                         2 * h + (v ? 1 : 0)) * s.head_dim + d;
  return reinterpret_cast<float*>(b.kv_pages.data()) + index;
}

TEST(RobustnessTest, NanBeyondKvLenAndInPaddingRowsNeverLeaks) {
  BatchSpec spec;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.page_size = 4;
  spec.q_dtype = spec.kv_dtype = DType::kF32;
  spec.sequences = {{3, 6}, {1, 9}};
  spec.max_num_batched_tokens = 7;  // 3 padding rows.
  spec.nan_beyond_kv_len = true;
  SyntheticBatch b = MakeSyntheticBatch(spec);
  auto* q = reinterpret_cast<float*>(b.q.data());
  for (int64_t i = 4 * 4 * 16; i < 7 * 4 * 16; ++i) q[i] = NAN;  // Padding rows.
  ExpectLikeReference(b, {}, SpecTolerance(b));
}

TEST(RobustnessTest, InfInValuesPropagatesLikeTheReference) {
  SyntheticBatch b = SmallBatch({{2, 6}, {1, 9}});
  *KvElement(b, 1, 3, 0, /*v=*/true, 5) = INFINITY;  // Seen by sequence 1's query.
  ExpectLikeReference(b, {}, SpecTolerance(b));
}

// Finding F1 (fixed): a NaN logit was dropped (output 0 or finite) where the
// reference gives NaN.
TEST(RobustnessTest, F1_NanInKeyPropagatesLikeTheReference) {
  SyntheticBatch b = SmallBatch({{2, 6}, {1, 9}});
  *KvElement(b, 0, 1, 1, /*v=*/false, 3) = NAN;  // Key 1 of sequence 0: seen by all its rows.
  ExpectLikeReference(b, {}, SpecTolerance(b));
}

TEST(RobustnessTest, F1_NanInQueryPropagatesLikeTheReference) {
  SyntheticBatch b = SmallBatch({{2, 6}, {1, 9}});
  reinterpret_cast<float*>(b.q.data())[2 * 4 * 16 + 5] = NAN;  // Token 2, head 0.
  ExpectLikeReference(b, {}, SpecTolerance(b));
}

// Finding F3 (fixed): an infinite logit under a soft cap is c * tanh(+-inf) =
// +-c in the reference; the kernel gave 0 (on the bf16 dot path q's low
// part was inf - inf = NaN, then dropped as in F1).
TEST(RobustnessTest, F3_InfQueryUnderSoftCapLikeTheReference) {
  // f32 q over bf16 K/V: the bf16 dot path splits q into hi + lo parts.
  SyntheticBatch b = SmallBatch({{2, 6}, {1, 9}}, 4, DType::kF32, DType::kBF16);
  reinterpret_cast<float*>(b.q.data())[2 * 4 * 16 + 5] = INFINITY;
  AttentionOptions o;
  o.soft_cap = 5.0;
  o.sliding_window = 1;
  std::vector<uint8_t> ref = b.NewOutput(), out = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                          b.OutView(ref));
  RaggedPagedAttention(b.Q(), b.KvPages(),
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                       b.OutView(out));
  EXPECT_LE(testing::MaxAbsDifference(b, out, ref), SpecTolerance(b));
}

// Finding F7 (closed: the skip rule, docs/contract.md §1): +inf and -inf in one q row
// make inf - inf in q . k. Where the row sees every key, the kernel agrees
// with the reference on every path: widening (bf16), quantized (int8, a
// scale folded into the logit scale), Highway (f32), under a soft cap.
TEST(RobustnessTest, F7_InfinitiesInAQueryThatSeesEveryKeyLikeTheReference) {
  for (const DType kv : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E5M2}) {
    SCOPED_TRACE(std::string(ToString(kv)));
    SyntheticBatch b = SmallBatch({{2, 6}, {1, 9}}, 4, DType::kF32, kv);
    float* q = reinterpret_cast<float*>(b.q.data());
    q[1 * 4 * 16 + 0] = -INFINITY;  // Token 1 (position 5 of 6), head 0.
    q[1 * 4 * 16 + 2] = INFINITY;
    q[2 * 4 * 16 + 16 + 3] = INFINITY;  // Token 2 (position 8 of 9), head 1.
    AttentionOptions o;
    o.soft_cap = 5.0;
    o.k_scale = 1.0 / 256;
    // the contract's 8-bit bound for every K/V dtype here, as this test has always
    // allowed (not SpecTolerance(b)): the rows with infinities compare as NaN
    // or infinity, the others within 5e-2.
    ExpectLikeReference(b, o, 5e-2);
    o.soft_cap.reset();
    ExpectLikeReference(b, o, 5e-2);
  }
}

// Finding F8 (fixed): a row that masks no key (decode) whose every logit is
// -inf is NaN in the reference (exp(-inf - -inf)); under a finite mask_value
// <= -1e4 the kernel wrote 0, as if masked keys had been skipped.
TEST(RobustnessTest, F8_EveryLogitMinusInfInADecodeRowIsNan) {
  SyntheticBatch b = SmallBatch({{2, 6}, {1, 9}});
  reinterpret_cast<float*>(b.q.data())[2 * 4 * 16 + 5] = INFINITY;  // Token 2, head 0.
  for (int64_t t = 0; t < 9; ++t) *KvElement(b, 1, t, 0, /*v=*/false, 5) = -1.0f;
  ExpectLikeReference(b, {}, SpecTolerance(b));  // mask_value: JAX's finite default.
  PagedAttentionOptions o;
  const SyntheticBatch decode = DecodeBatch();
  SyntheticBatch d = decode;
  reinterpret_cast<float*>(d.q.data())[1 * 4 * 16 + 5] = INFINITY;  // Row 1, head 0.
  for (int64_t t = 0; t < 9; ++t) *KvElement(d, 1, t, 0, /*v=*/false, 5) = -1.0f;
  std::vector<uint8_t> out = d.NewOutput();
  RunPaged(d, o, d.OutView(out));
  const float* row = reinterpret_cast<const float*>(out.data()) + 1 * 4 * 16;
  for (int64_t i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(row[i])) << i << ": " << row[i];
}

// Finding F9 (fixed): a key of logit -inf has weight 0, and 0 * inf is NaN
// where its V is infinite; the flash-decoding merge skipped every chunk
// whose logits were all -inf, and with it that NaN.
TEST(RobustnessTest, F9_InfValueUnderMinusInfLogitInASplitChunkIsNan) {
  SyntheticBatch b = SmallBatch({{1, 200}});
  reinterpret_cast<float*>(b.q.data())[5] = 1.0f;  // Token 0, head 0.
  // Keys 0-99: logit -inf for head 0, so the first chunks see nothing else.
  for (int64_t t = 0; t < 100; ++t) *KvElement(b, 0, t, 0, /*v=*/false, 5) = -INFINITY;
  *KvElement(b, 0, 10, 0, /*v=*/true, 3) = INFINITY;
  AttentionOptions o;
  o.num_threads = 4;  // 1 task of 200 keys: split into chunks.
  o.num_kv_pages_per_block = 1;
  ExpectLikeReference(b, o, SpecTolerance(b));
  std::vector<uint8_t> out = b.NewOutput();
  RaggedPagedAttention(b.Q(), b.KvPages(),
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                       b.OutView(out));
  EXPECT_TRUE(std::isnan(reinterpret_cast<const float*>(out.data())[3]));
}

// bf16 q and K/V through amx_prefill on the hardware's tiles where the CPU
// has AMX, and on the tile model wherever AVX-512 BF16 is, against the
// reference (NaN where it is NaN, else within the bf16 bound).
void ExpectAmxLikeReference(const SyntheticBatch& b, const AttentionOptions& o) {
  const PageTable table{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()};
  std::vector<uint8_t> ref = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(), table, o, b.OutView(ref));
  const int64_t count = static_cast<int64_t>(ref.size() / SizeOf(DType::kBF16));
  auto check = [&](const char* path) {
    std::vector<uint8_t> out = b.NewOutput();
    RaggedPagedAttention(b.Q(), b.KvPages(), table, o, b.OutView(out));
    int shown = 0;
    for (int64_t i = 0; i < count && shown < 3; ++i) {
      const double got = LoadAsF32(DType::kBF16, out.data(), i);
      const double want = LoadAsF32(DType::kBF16, ref.data(), i);
      if (!LikeReference(got, want, SpecTolerance(b) * (1 + std::fabs(want)))) {
        ADD_FAILURE() << path << " out[flat " << i << "] = " << got << ", reference " << want;
        ++shown;
      }
    }
  };
  if (internal::DetectedCpuFeatures().amx_bf16) check("AMX tiles");
  if (internal::DetectedCpuFeatures().avx512bf16) {
    const testing::ScopedAmxEmulation emulate;
    check("AMX tile model");
  }
}

SyntheticBatch Bf16Batch(int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t page_size,
                         std::vector<SequenceShape> seqs) {
  BatchSpec spec;
  spec.num_q_heads = q_heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.q_dtype = spec.kv_dtype = DType::kBF16;
  spec.sequences = std::move(seqs);
  spec.seed = 7;
  return MakeSyntheticBatch(spec);
}

// Finding F14 (fixed): amx_prefill's PV ran whole 16-row tiles, so in a
// task over several kv heads (the middle class at 9-15 rows per kv head)
// a tile's padding rows were the next head's accumulators, and their zero
// weights times a NaN in this head's V made the next head's rows NaN (found
// by ragged_attention_fuzzer on the first AMX machine, 2026-12-06:
// fuzz/regressions/ragged_amx_tail_rows_nan_value).
TEST(RobustnessTest, F14_NanValueStaysInItsKvHeadOnAmx) {
  if (!internal::DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "no AMX tiles or tile model here";
  SyntheticBatch b = Bf16Batch(4, 2, 32, 5, {{6, 15}});
  // V of kv head 0, key 1 (seen by every row), dim 18.
  StoreFromF32(DType::kBF16, b.kv_pages.data(), ((b.page_indices[0] * 5 + 1) * 4 + 1) * 32 + 18,
               NAN);
  AttentionOptions o;
  o.num_queries_per_block = 6;  // 12 rows per kv head: the middle class, one task.
  ExpectAmxLikeReference(b, o);
}

// Finding F15 (fixed): in a task over several kv heads, the last head's
// 16-row AMX tiles reached past the scratch's rows (padded for the task's
// rows, not for the last head's rows rounded up), and its logits overwrote
// the accumulators that follow them (found by ragged_attention_fuzzer the
// same day: fuzz/regressions/ragged_amx_last_head_tile_overrun). Every
// shape of the middle class's multi-head tasks: 9-15 rows per kv head, 1-4
// kv heads.
TEST(RobustnessTest, F15_LastKvHeadsTilesStayInTheScratch) {
  if (!internal::DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "no AMX tiles or tile model here";
  for (int64_t kv_heads = 1; kv_heads <= 4; ++kv_heads) {
    for (int32_t rows = 9; rows <= 15; ++rows) {
      SCOPED_TRACE("kv_heads " + std::to_string(kv_heads) + " rows per kv head " +
                   std::to_string(rows));
      const SyntheticBatch b = Bf16Batch(kv_heads, kv_heads, 10, 7, {{rows, 18}});
      AttentionOptions o;
      o.num_queries_per_block = rows;
      ExpectAmxLikeReference(b, o);
    }
  }
}

// Finding F10 (fixed): the same with every logit of the row -inf and a
// finite sink: the reference's shift is the sink, every weight 0, and the
// infinite V makes the output NaN; the merge gave 0 whenever no chunk had a
// finite logit.
TEST(RobustnessTest, F10_InfValueUnderAllMinusInfLogitsWithASinkIsNan) {
  SyntheticBatch b = SmallBatch({{1, 200}});
  reinterpret_cast<float*>(b.q.data())[5] = 1.0f;  // Token 0, head 0.
  for (int64_t t = 0; t < 200; ++t) *KvElement(b, 0, t, 0, /*v=*/false, 5) = -INFINITY;
  *KvElement(b, 0, 10, 0, /*v=*/true, 3) = INFINITY;
  const std::vector<float> sinks = {0.5f, -1.0f, 0.0f, 2.0f};
  AttentionOptions o;
  o.sinks = TensorView(sinks.data(), DType::kF32, {4});
  o.num_kv_pages_per_block = 1;
  for (const int threads : {1, 4}) {  // One task, and chunks merged.
    o.num_threads = threads;
    ExpectLikeReference(b, o, SpecTolerance(b));
    std::vector<uint8_t> out = b.NewOutput();
    RaggedPagedAttention(b.Q(), b.KvPages(),
                         PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                         b.OutView(out));
    EXPECT_TRUE(std::isnan(reinterpret_cast<const float*>(out.data())[3])) << threads;
  }
}

// Finding F2 (fixed): a sliding window beyond INT32_MAX (valid: it masks
// nothing) was truncated to 32 bits in the kernel and masked every key.
TEST(RobustnessTest, F2_SlidingWindowBeyondInt32MasksNothing) {
  const SyntheticBatch b = SmallBatch({{3, 5}, {2, 7}});
  std::vector<uint8_t> ref = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                          b.OutView(ref));
  for (int64_t w : {int64_t{1} << 32, std::numeric_limits<int64_t>::max()}) {
    AttentionOptions o;
    o.sliding_window = w;
    std::vector<uint8_t> out = NanOutput(b);
    RaggedPagedAttention(b.Q(), b.KvPages(),
                         PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
                         b.OutView(out));
    EXPECT_LE(testing::MaxAbsDifference(b, out, ref), SpecTolerance(b))
        << "sliding_window=" << w;
  }
}

// ---- Zero-sized tensors.

TEST(RobustnessTest, ZeroSizedTensorsGiveZerosOrNothing) {
  const float q_dummy = 0.0f, kv_dummy = 0.0f;
  const int32_t zero1[1] = {0}, zeros3[3] = {0, 0, 0}, pages[4] = {0, 0, 0, 0};
  const int64_t H = 2, D = 8, S = 4;
  // 0 tokens, 0 pages, 0 sequences (max_num_seqs 0).
  {
    float out_dummy = 1.0f;
    const TensorView q(&q_dummy, DType::kF32, {0, H, D});
    const TensorView kv(&kv_dummy, DType::kF32, {0, S, 2, D});
    const TensorView k(&kv_dummy, DType::kF32, {0, S, 1, D});
    const TensorView kh(&kv_dummy, DType::kF32, {0, 1, S, D});
    const MutableTensorView out(&out_dummy, DType::kF32, {0, H, D});
    const TensorView kv_lens(zero1, DType::kI32, {0}), pi(pages, DType::kI32, {0, 2});
    const TensorView cu(zero1, DType::kI32, {1}), n(zero1, DType::kI32, {1});
    EXPECT_NO_THROW(RaggedPagedAttention(q, kv, PageTable{kv_lens, pi, cu, n}, {}, out));
    EXPECT_NO_THROW(RaggedPagedAttention(q, KVPages{k, k, KVLayout::kNHD},
                                         PageTable{kv_lens, pi, cu, n}, {}, out));
    EXPECT_NO_THROW(RaggedPagedAttention(q, KVPages{kh, kh, KVLayout::kHND},
                                         PageTable{kv_lens, pi, cu, n}, {}, out));
    EXPECT_EQ(out_dummy, 1.0f);
    const TensorView kp(&kv_dummy, DType::kF32, {1, 0, S, D});
    EXPECT_NO_THROW(PagedAttention(q, kp, kp, kv_lens, pi, {}, out));
  }
  // Rows and sequences but 0 pages: every kv_len (and q_len) 0 -> zeros.
  {
    std::vector<float> q(3 * H * D, 1.0f), out(3 * H * D, 7.0f);
    const TensorView qv(q.data(), DType::kF32, {3, H, D});
    const TensorView kv(&kv_dummy, DType::kF32, {0, S, 2, D});
    const TensorView k(&kv_dummy, DType::kF32, {0, S, 1, D});
    const TensorView kh(&kv_dummy, DType::kF32, {0, 1, S, D});
    const TensorView kv_lens(zeros3, DType::kI32, {2}), pi(pages, DType::kI32, {2, 2});
    const TensorView cu(zeros3, DType::kI32, {3}), n(zeros3 + 1, DType::kI32, {1});
    const int32_t two[1] = {2};
    const TensorView n2(two, DType::kI32, {1});
    const MutableTensorView ov(out.data(), DType::kF32, {3, H, D});
    for (const TensorView& num : {n, n2}) {
      out.assign(out.size(), 7.0f);
      RaggedPagedAttention(qv, kv, PageTable{kv_lens, pi, cu, num}, {}, ov);
      EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
      out.assign(out.size(), 7.0f);
      RaggedPagedAttention(qv, KVPages{k, k, KVLayout::kNHD}, PageTable{kv_lens, pi, cu, num}, {},
                           ov);
      EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
      out.assign(out.size(), 7.0f);
      RaggedPagedAttention(qv, KVPages{kh, kh, KVLayout::kHND}, PageTable{kv_lens, pi, cu, num}, {},
                           ov);
      EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
    }
    // paged_attention: three rows of length 0.
    const TensorView kp(&kv_dummy, DType::kF32, {1, 0, S, D});
    const TensorView lengths(zeros3, DType::kI32, {3});
    const TensorView pi3(pages, DType::kI32, {3, 1});
    out.assign(out.size(), 7.0f);
    PagedAttention(qv, kp, kp, lengths, pi3, {}, ov);
    EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
    // A page that would be read from an empty cache is an error.
    const int32_t one[3] = {1, 0, 0};
    const TensorView lengths1(one, DType::kI32, {3});
    out.assign(out.size(), 7.0f);
    EXPECT_THROW(PagedAttention(qv, kp, kp, lengths1, pi3, {}, ov), Error);
    EXPECT_EQ(out, std::vector<float>(out.size(), 7.0f));
  }
}

// ---- Misaligned views.

// The batch's tensors copied `shift` bytes into fresh buffers: the same call
// on them gives bit-identical results.
void ExpectShiftInvariant(DType dtype, size_t shift) {
  const SyntheticBatch b = SmallBatch({{3, 5}, {2, 7}, {1, 4}}, 3, dtype);
  std::vector<uint8_t> want = b.NewOutput();
  RaggedPagedAttention(b.Q(), b.KvPages(),
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                       b.OutView(want));
  std::vector<uint8_t> q(b.q.size() + shift), kv(b.kv_pages.size() + shift),
      out(want.size() + shift, kSentinel);
  std::memcpy(q.data() + shift, b.q.data(), b.q.size());
  std::memcpy(kv.data() + shift, b.kv_pages.data(), b.kv_pages.size());
  TensorView qv = b.Q(), kvv = b.KvPages();
  qv.data = q.data() + shift;
  kvv.data = kv.data() + shift;
  MutableTensorView ov = b.OutView(out);
  ov.data = out.data() + shift;
  const CacheViews c = ViewsOf(kvv);
  RaggedPagedAttention(qv, kvv, PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                       {}, ov);
  EXPECT_EQ(0, std::memcmp(out.data() + shift, want.data(), want.size())) << "combined";
  // Each layout writes into a sentinel-filled buffer, not the last one's result.
  std::fill(out.begin(), out.end(), kSentinel);
  RaggedPagedAttention(qv, KVPages{c.k_nhd, c.v_nhd, KVLayout::kNHD},
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {}, ov);
  EXPECT_EQ(0, std::memcmp(out.data() + shift, want.data(), want.size())) << "NHD";
  std::fill(out.begin(), out.end(), kSentinel);
  RaggedPagedAttention(qv, KVPages{c.k_hnd, c.v_hnd, KVLayout::kHND},
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {}, ov);
  EXPECT_EQ(0, std::memcmp(out.data() + shift, want.data(), want.size())) << "HND";
}

TEST(RobustnessTest, ViewsOffsetByOneElementGiveIdenticalResults) {
  ExpectShiftInvariant(DType::kF32, 4);
  ExpectShiftInvariant(DType::kBF16, 2);
  ExpectShiftInvariant(DType::kF16, 2);
}

// Finding F4 (fixed by rejecting): a view at an odd byte address (possible
// from NumPy or a raw buffer) was read with misaligned typed loads,
// undefined behaviour. Now a clean kLayout error with out untouched.
TEST(RobustnessTest, F4_ViewsAtOddByteAddressesAreRejected) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(ToString(dtype));
    const SyntheticBatch b = SmallBatch({{3, 5}, {2, 7}}, 3, dtype);
    std::vector<uint8_t> q(b.q.size() + 1), kv(b.kv_pages.size() + 1);
    std::memcpy(q.data() + 1, b.q.data(), b.q.size());
    std::memcpy(kv.data() + 1, b.kv_pages.data(), b.kv_pages.size());
    TensorView qv = b.Q(), kvv = b.KvPages();
    qv.data = q.data() + 1;
    kvv.data = kv.data() + 1;
    ExpectRejected(b, ErrorKind::kLayout, "odd q", [&](const MutableTensorView& out) {
      RaggedPagedAttention(qv, b.KvPages(),
                           PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                           out);
    });
    ExpectRejected(b, ErrorKind::kLayout, "odd kv_pages", [&](const MutableTensorView& out) {
      RaggedPagedAttention(
          b.Q(), kvv, PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {}, out);
    });
    const CacheViews c = ViewsOf(kvv);
    ExpectRejected(b, ErrorKind::kLayout, "odd NHD", [&](const MutableTensorView& out) {
      RaggedPagedAttention(b.Q(), KVPages{c.k_nhd, c.v_nhd, KVLayout::kNHD},
                           PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                           out);
    });
  }
}

// The F4 message for a view of `name` whose data is not aligned to its
// `bytes`-byte elements.
std::string MisalignedMessage(const std::string& name, size_t bytes) {
  return name + " must be aligned to its " + std::to_string(bytes) +
         "-byte elements; its data starts at an address that is not. Pass " + name +
         " in a buffer aligned to its dtype (a copy is), not at an odd byte offset.";
}

// Expects fn() to throw rpa::Error of kind kLayout with exactly `message`.
template <class Fn>
void ExpectMisaligned(const std::string& message, Fn fn) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kLayout) << e.what();
    EXPECT_EQ(std::string(e.what()), message);
  }
}

// Finding F4, continued (fixed): the fused cache write's new_k / new_v
// skipped the check, so a view at an odd byte address still reached typed
// loads there. Now the same kLayout error, cache and out untouched.
TEST(RobustnessTest, F4_KvWriteNewRowsAtOddByteAddressesAreRejected) {
  const SyntheticBatch b = SmallBatch({{3, 5}, {2, 7}}, 3);
  const TensorView kv = b.KvPages();
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(ToString(dtype));
    // Zeros: a valid value in every dtype; one spare byte for the odd view.
    std::vector<uint8_t> rows(b.num_tokens * b.spec.num_kv_heads * b.spec.head_dim *
                                  SizeOf(dtype) + 1);
    const TensorView aligned(rows.data(), dtype,
                             {b.num_tokens, b.spec.num_kv_heads, b.spec.head_dim});
    TensorView odd = aligned;
    odd.data = rows.data() + 1;
    std::vector<uint8_t> cache = b.kv_pages, out(b.q.size(), kSentinel);
    const MutableTensorView cache_view(cache.data(), kv.dtype,
                                       {kv.shape[0], kv.shape[1], kv.shape[2], kv.shape[3]});
    for (const bool k : {true, false}) {
      ExpectMisaligned(MisalignedMessage(k ? "new_k" : "new_v", SizeOf(dtype)), [&] {
        RaggedPagedAttentionWithKVWrite(
            b.Q(), k ? odd : aligned, k ? aligned : odd, cache_view,
            PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {}, b.OutView(out));
      });
    }
    EXPECT_TRUE(cache == b.kv_pages) << "cache written on error";
    EXPECT_TRUE(out == std::vector<uint8_t>(b.q.size(), kSentinel)) << "out written on error";
  }
}

// Finding F4, continued (fixed): MergeStates' inputs and outputs skipped the
// check too. Each of the six, one byte off, is the same kLayout error, with
// out and lse untouched.
TEST(RobustnessTest, F4_MergeStatesViewsAtOddByteAddressesAreRejected) {
  constexpr int64_t kTokens = 2, kHeads = 3, kDim = 4;
  const char* const names[] = {"out_a", "lse_a", "out_b", "lse_b", "out", "lse"};
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(ToString(dtype));
    for (int odd = 0; odd < 6; ++odd) {
      SCOPED_TRACE(names[odd]);
      // Even entries are outputs [tokens, heads, dim] in `dtype`, odd ones
      // LSEs [tokens, heads] in f32; each buffer has one spare byte.
      std::vector<std::vector<uint8_t>> buffers(6);
      std::vector<MutableTensorView> views;
      for (int i = 0; i < 6; ++i) {
        const bool lse = i % 2 == 1;
        const DType d = lse ? DType::kF32 : dtype;
        buffers[i].assign(kTokens * kHeads * (lse ? 1 : kDim) * SizeOf(d) + 1, 0);
        views.push_back(lse ? MutableTensorView(buffers[i].data(), d, {kTokens, kHeads})
                            : MutableTensorView(buffers[i].data(), d, {kTokens, kHeads, kDim}));
      }
      views[odd].data = buffers[odd].data() + 1;
      const std::vector<std::vector<uint8_t>> before = buffers;
      ExpectMisaligned(MisalignedMessage(names[odd], SizeOf(views[odd].dtype)), [&] {
        MergeStates(views[0], views[1], views[2], views[3], views[4], views[5]);
      });
      EXPECT_TRUE(buffers == before) << "written on error";
    }
  }
}

// ---- Concurrency.

// Many threads call the library at once on shared read-only inputs with
// their own outputs and thread counts; each result equals a single call's.
TEST(ConcurrencyTest, ParallelCallersGetSingleCallResults) {
  const SyntheticBatch b = SmallBatch({{5, 9}, {1, 13}, {3, 3}, {1, 30}}, 4, DType::kBF16);
  const SyntheticBatch d = DecodeBatch();
  constexpr int kThreadCounts = 4;
  std::vector<std::vector<uint8_t>> want(kThreadCounts + 1), want_paged(kThreadCounts + 1);
  auto options = [](int i) {
    AttentionOptions o;
    if (i > 0) o.num_threads = i;
    return o;
  };
  auto paged_options = [](int i) {
    PagedAttentionOptions o;
    if (i > 0) o.num_threads = i;
    return o;
  };
  for (int i = 0; i <= kThreadCounts; ++i) {
    want[i] = b.NewOutput();
    RaggedPagedAttention(b.Q(), b.KvPages(),
                         PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                         options(i), b.OutView(want[i]));
    want_paged[i] = d.NewOutput();
    RunPaged(d, paged_options(i), d.OutView(want_paged[i]));
  }
  std::vector<uint8_t> want_ref = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                          b.OutView(want_ref));

  constexpr int kCallers = 8;
  constexpr int kIterations = 40;
  std::vector<int> mismatches(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      std::vector<uint8_t> out = b.NewOutput(), out_paged = d.NewOutput();
      for (int it = 0; it < kIterations; ++it) {
        const int i = (c + it) % (kThreadCounts + 1);  // Thread counts interleave.
        const CacheViews views = ViewsOf(b.KvPages());
        // Sentinels, so a call that wrote nothing cannot pass on the last one's result.
        std::fill(out.begin(), out.end(), kSentinel);
        std::fill(out_paged.begin(), out_paged.end(), kSentinel);
        switch ((c + it) % 4) {
          case 0:
            RaggedPagedAttention(b.Q(), b.KvPages(),
                                 PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                                 options(i), b.OutView(out));
            break;
          case 1:
            RaggedPagedAttention(b.Q(), KVPages{views.k_nhd, views.v_nhd, KVLayout::kNHD},
                                 PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                                 options(i), b.OutView(out));
            break;
          case 2:
            RaggedPagedAttention(b.Q(), KVPages{views.k_hnd, views.v_hnd, KVLayout::kHND},
                                 PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                                 options(i), b.OutView(out));
            break;
          default:
            RunPaged(d, paged_options(i), d.OutView(out_paged));
            if (out_paged != want_paged[i]) ++mismatches[c];
            if (it % 3 == 0) {
              RefRaggedPagedAttention(
                  b.Q(), b.KvPages(),
                  PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, {},
                  b.OutView(out));
              if (out != want_ref) ++mismatches[c];
            }
            continue;
        }
        if (out != want[i]) ++mismatches[c];
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(mismatches[c], 0) << "caller " << c;
}

// Fused KV writes from many threads, each into its own copy of the cache,
// while others read the shared one.
TEST(ConcurrencyTest, ParallelFusedWritesIntoSeparateCaches) {
  const SyntheticBatch b = SmallBatch({{2, 6}, {1, 9}, {3, 3}});
  const int64_t rows = b.num_tokens, H = b.spec.num_kv_heads, D = b.spec.head_dim;
  std::vector<float> new_k(rows * H * D), new_v(rows * H * D);
  for (size_t i = 0; i < new_k.size(); ++i) {
    new_k[i] = std::sin(0.37f * static_cast<float>(i));
    new_v[i] = std::cos(0.11f * static_cast<float>(i));
  }
  const TensorView nk(new_k.data(), DType::kF32, {rows, H, D});
  const TensorView nv(new_v.data(), DType::kF32, {rows, H, D});
  auto run = [&](std::vector<uint8_t>& cache, std::vector<uint8_t>& out, int threads) {
    MutableTensorView kv = {};
    const TensorView view = b.KvPages();
    kv.data = cache.data();
    kv.dtype = view.dtype;
    kv.rank = view.rank;
    kv.shape = view.shape;
    kv.strides = view.strides;
    AttentionOptions o;
    o.num_threads = threads;
    RaggedPagedAttentionWithKVWrite(
        b.Q(), nk, nv, kv, PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, o,
        b.OutView(out));
  };
  std::vector<uint8_t> want_cache = b.kv_pages, want_out = b.NewOutput();
  run(want_cache, want_out, 1);
  std::vector<uint8_t> want_out3 = b.NewOutput(), cache3 = b.kv_pages;
  run(cache3, want_out3, 3);
  std::vector<int> bad(6, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < 6; ++c) {
    threads.emplace_back([&, c] {
      for (int it = 0; it < 8; ++it) {
        std::vector<uint8_t> cache = b.kv_pages, out = b.NewOutput();
        const int n = (c + it) % 2 ? 1 : 3;
        run(cache, out, n);
        if (cache != want_cache || out != (n == 1 ? want_out : want_out3)) ++bad[c];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < 6; ++c) EXPECT_EQ(bad[c], 0) << "caller " << c;
}

}  // namespace
}  // namespace rpa
