// Every validation message of docs/contract.md §3, one test each: the exact text (JAX's
// words, then our fix sentence), the ErrorKind, which entry points raise it
// (a static check fires from StaticValidateInputs too; a dynamic one only
// once the metadata is read), and that nothing was written: `out` (and `lse`)
// and the KV cache are byte-identical to before the call.
//
// Expected texts are written out literally so that any drift, in JAX's part or
// in ours, fails here. JAX's texts are from
// jax/experimental/pallas/ops/tpu/ragged_paged_attention/kernel.py and
// jax/experimental/pallas/ops/tpu/paged_attention/paged_attention_kernel.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "rpa/rpa.h"

namespace rpa {
namespace {

constexpr uint8_t kSentinel = 0xA5;  // Fills the outputs before every rejected call.

// How far a rejected input gets.
enum class Stage {
  kStatic,   // Shapes, dtypes, options: StaticValidateInputs raises it.
  kDynamic,  // Metadata values: DynamicValidateInputs raises it, Static does not.
  kOutput,   // The out view: only the entry points see it.
};

// Runs `call` on sentinel-filled outputs (`out`, and `lse` where given) and
// checks that it throws exactly `expected` of `kind`, leaving the outputs and
// the KV cache (`kv_bytes()`) as they were.
void ExpectThrowsUntouched(const char* path, const std::function<void()>& call,
                           ErrorKind kind, const std::string& expected,
                           std::initializer_list<std::vector<uint8_t>*> outputs,
                           const std::function<std::vector<uint8_t>()>& kv_bytes) {
  SCOPED_TRACE(path);
  for (std::vector<uint8_t>* out : outputs) std::fill(out->begin(), out->end(), kSentinel);
  const std::vector<uint8_t> kv_before = kv_bytes();
  try {
    call();
    ADD_FAILURE() << path << " accepted the input; expected: " << expected;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), expected);
    EXPECT_EQ(ToString(e.kind()), ToString(kind));
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << " threw a non-rpa::Error: " << e.what();
  }
  for (std::vector<uint8_t>* out : outputs) {
    EXPECT_TRUE(std::all_of(out->begin(), out->end(), [](uint8_t b) { return b == kSentinel; }))
        << path << " wrote to an output before rejecting the input";
  }
  EXPECT_TRUE(kv_bytes() == kv_before) << path << " wrote to the KV cache";
}

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// Page-table filler for columns no sequence reads: every kind of bad index.
int32_t Garbage(int64_t i) {
  constexpr int32_t kValues[] = {-1, 6, INT32_MAX, INT32_MIN, -1000000, 999999};
  return kValues[i % 6];
}

// ---------------------------------------------------------------------------
// The ragged API (combined, NHD, HND layouts).
//
// A valid tiny batch:
//   q            f32[8, 4, 8]       max_num_batched_tokens 8, 4 q heads, head_dim 8
//   kv_pages     f32[6, 4, 4, 8]    6 pages of 4 tokens, 2 kv heads (combined 4)
//   k/v_pages    f32[6, 4, 2, 8]    NHD, or f32[6, 2, 4, 8] HND
//   kv_lens      {5, 3, 0}          max_num_seqs 3
//   page_indices [3, 3]             row 0 {4, 1, g}, row 1 {2, g, g}, row 2 {g, g, g}
//   cu_q_lens    {0, 1, 4, 4}       a decode (q 1, kv 5) and a prefill (q 3, kv 3)
//   num_seqs     {2}                rows 4..7 are padding
// where g is garbage that is never read (-1, 6, INT32_MAX, INT32_MIN, ...).
class ValidateRaggedTest : public ::testing::Test {
 protected:
  static constexpr int64_t kTokens = 8;
  static constexpr int64_t kQHeads = 4;
  static constexpr int64_t kKvHeads = 2;
  static constexpr int64_t kHeadDim = 8;
  static constexpr int64_t kPageSize = 4;
  static constexpr int64_t kNumPages = 6;
  static constexpr int64_t kMaxSeqs = 3;

  void SetUp() override {
    for (size_t i = 0; i < q_data_.size(); ++i) q_data_[i] = 0.01f * static_cast<float>(i % 17);
    for (size_t i = 0; i < kv_data_.size(); ++i) kv_data_[i] = 0.02f * static_cast<float>(i % 13);
    for (size_t i = 0; i < k_data_.size(); ++i) k_data_[i] = 0.03f * static_cast<float>(i % 11);
    for (size_t i = 0; i < v_data_.size(); ++i) v_data_[i] = 0.05f * static_cast<float>(i % 7);
    q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, kQHeads, kHeadDim});
    kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, kPageSize, 2 * kKvHeads, kHeadDim});
    kv_lens_ = TensorView(kv_lens_data_.data(), DType::kI32, {kMaxSeqs});
    cu_q_lens_ = TensorView(cu_q_lens_data_.data(), DType::kI32, {kMaxSeqs + 1});
    num_seqs_ = TensorView(num_seqs_data_.data(), DType::kI32, {1});
    out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens, kQHeads, kHeadDim});
    SetPagesPerSeq(3);
  }

  // Switches to separate K and V caches in `layout`.
  void UseLayout(KVLayout layout) {
    layout_ = layout;
    if (layout == KVLayout::kNHD) {
      k_pages_ = TensorView(k_data_.data(), DType::kF32, {kNumPages, kPageSize, kKvHeads, kHeadDim});
      v_pages_ = TensorView(v_data_.data(), DType::kF32, {kNumPages, kPageSize, kKvHeads, kHeadDim});
    } else {
      k_pages_ = TensorView(k_data_.data(), DType::kF32, {kNumPages, kKvHeads, kPageSize, kHeadDim});
      v_pages_ = TensorView(v_data_.data(), DType::kF32, {kNumPages, kKvHeads, kPageSize, kHeadDim});
    }
  }

  // Rebuilds page_indices as [3, columns]: garbage everywhere, then the pages
  // the fixture's sequences read (where the table is wide enough).
  void SetPagesPerSeq(int64_t columns) {
    page_indices_data_.assign(static_cast<size_t>(kMaxSeqs * columns), 0);
    for (size_t i = 0; i < page_indices_data_.size(); ++i) {
      page_indices_data_[i] = Garbage(static_cast<int64_t>(i));
    }
    if (columns >= 1) {
      SetPage(0, 0, 4);
      SetPage(1, 0, 2);
    }
    if (columns >= 2) SetPage(0, 1, 1);
    page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {kMaxSeqs, columns});
  }
  void SetPage(int64_t seq, int64_t column, int32_t page) {
    page_indices_data_[static_cast<size_t>(seq * Columns() + column)] = page;
  }
  int64_t Columns() const { return static_cast<int64_t>(page_indices_data_.size()) / kMaxSeqs; }

  void CallStatic() const {
    if (layout_) {
      StaticValidateInputs(q_, KVPages{k_pages_, v_pages_, *layout_},
                           PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_}, options_);
    } else {
      StaticValidateInputs(q_, kv_pages_, PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_},
                           options_);
    }
  }
  void CallDynamic() const {
    if (layout_) {
      DynamicValidateInputs(q_, KVPages{k_pages_, v_pages_, *layout_},
                            PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_}, options_);
    } else {
      DynamicValidateInputs(q_, kv_pages_,
                            PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_}, options_);
    }
  }
  void CallFast() const {
    if (layout_) {
      RaggedPagedAttention(q_, KVPages{k_pages_, v_pages_, *layout_},
                           PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_}, options_,
                           out_);
    } else {
      RaggedPagedAttention(q_, kv_pages_, PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_},
                           options_, out_);
    }
  }
  void CallReference() const {
    if (layout_) {
      RefRaggedPagedAttention(q_, KVPages{k_pages_, v_pages_, *layout_},
                              PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_}, options_,
                              out_);
    } else {
      RefRaggedPagedAttention(
          q_, kv_pages_, PageTable{kv_lens_, page_indices_, cu_q_lens_, num_seqs_}, options_, out_);
    }
  }

  // The same call as a plan and a run (rpa/plan.h): sinks and lse go to the run.
  void CallPlanned() const {
    AttentionOptions plan_options = options_;
    plan_options.sinks.reset();
    plan_options.lse.reset();
    const RunExtras extras{options_.sinks, options_.lse, {}, {}};
    const PageTable table{kv_lens_, page_indices_, cu_q_lens_, num_seqs_};
    AttentionPlan plan;
    if (layout_) {
      const KVPages kv{k_pages_, v_pages_, *layout_};
      plan.Plan(ShapeOf(q_, kv), table, plan_options);
      plan.Run(q_, kv, out_, extras);
    } else {
      plan.Plan(ShapeOf(q_, kv_pages_), table, plan_options);
      plan.Run(q_, kv_pages_, out_, extras);
    }
  }

  std::vector<uint8_t> KvBytes() const {
    if (!layout_) return Bytes(kv_data_);
    std::vector<uint8_t> bytes = Bytes(k_data_);
    const std::vector<uint8_t> v = Bytes(v_data_);
    bytes.insert(bytes.end(), v.begin(), v.end());
    return bytes;
  }

  // The input is rejected with exactly `expected` by every path that gets as
  // far as `stage`, identically by the fast path and the reference, and
  // accepted by the validators that stop before it.
  void ExpectRejected(Stage stage, ErrorKind kind, const std::string& expected) {
    const auto kv = [this] { return KvBytes(); };
    if (stage == Stage::kStatic) {
      ExpectThrowsUntouched("StaticValidateInputs", [&] { CallStatic(); }, kind, expected,
                            {&out_data_, &lse_data_}, kv);
    } else {
      EXPECT_NO_THROW(CallStatic()) << "StaticValidateInputs must not raise a non-static check";
    }
    if (stage != Stage::kOutput) {
      ExpectThrowsUntouched("DynamicValidateInputs", [&] { CallDynamic(); }, kind, expected,
                            {&out_data_, &lse_data_}, kv);
    } else {
      EXPECT_NO_THROW(CallDynamic()) << "DynamicValidateInputs does not see out";
    }
    ExpectThrowsUntouched("RaggedPagedAttention", [&] { CallFast(); }, kind, expected,
                          {&out_data_, &lse_data_}, kv);
    ExpectThrowsUntouched("RefRaggedPagedAttention", [&] { CallReference(); }, kind, expected,
                          {&out_data_, &lse_data_}, kv);
    ExpectThrowsUntouched("AttentionPlan", [&] { CallPlanned(); }, kind, expected,
                          {&out_data_, &lse_data_}, kv);
  }

  // Every path accepts the input; the entry points fill out (padding rows
  // from cu_q_lens[num_seqs] on with zeros).
  void ExpectAccepted() {
    EXPECT_NO_THROW(CallStatic());
    EXPECT_NO_THROW(CallDynamic());
    for (int path = 0; path < 3; ++path) {
      SCOPED_TRACE(path == 0 ? "RaggedPagedAttention"
                   : path == 1 ? "RefRaggedPagedAttention" : "AttentionPlan");
      std::fill(out_data_.begin(), out_data_.end(), kSentinel);
      if (path == 0) {
        EXPECT_NO_THROW(CallFast());
      } else if (path == 1) {
        EXPECT_NO_THROW(CallReference());
      } else {
        EXPECT_NO_THROW(CallPlanned());
      }
      const int32_t live = num_seqs_data_[0];
      const int64_t used_end = live > 0 ? cu_q_lens_data_[static_cast<size_t>(live)] : 0;
      const int64_t row = kQHeads * kHeadDim;
      for (int64_t i = 0; i < kTokens * row; ++i) {
        float value;
        std::memcpy(&value, out_data_.data() + i * sizeof(float), sizeof(float));
        const int64_t token = i / row;
        if (token >= used_end || (live > 0 && token < cu_q_lens_data_[0])) {
          ASSERT_EQ(value, 0.0f) << "padding token " << token;
        } else {
          ASSERT_TRUE(std::isfinite(value)) << "token " << token;
        }
      }
    }
  }

  std::vector<float> q_data_ = std::vector<float>(kTokens * kQHeads * kHeadDim);
  std::vector<float> kv_data_ = std::vector<float>(kNumPages * kPageSize * 2 * kKvHeads * kHeadDim);
  std::vector<float> k_data_ = std::vector<float>(kNumPages * kPageSize * kKvHeads * kHeadDim);
  std::vector<float> v_data_ = std::vector<float>(kNumPages * kPageSize * kKvHeads * kHeadDim);
  std::vector<int32_t> kv_lens_data_ = {5, 3, 0};
  std::vector<int32_t> page_indices_data_;
  std::vector<int32_t> cu_q_lens_data_ = {0, 1, 4, 4};
  std::vector<int32_t> num_seqs_data_ = {2, 2};  // Two elements for the shape (2,) test.
  std::vector<int64_t> wide_data_ = {5, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // int64 metadata.
  std::vector<uint8_t> out_data_ = std::vector<uint8_t>(kTokens * kQHeads * kHeadDim * 4);
  std::vector<uint8_t> lse_data_ = std::vector<uint8_t>(kTokens * kQHeads * 4);  // f32[8, 4]
  std::vector<float> sinks_data_ = {0.5f, -INFINITY, -1.0f, 2.0f};

  TensorView q_, kv_pages_, k_pages_, v_pages_, kv_lens_, page_indices_, cu_q_lens_, num_seqs_;
  MutableTensorView out_;
  AttentionOptions options_;
  std::optional<KVLayout> layout_;  // None: the combined layout.
};

// ---- Valid inputs.

TEST_F(ValidateRaggedTest, AcceptsValidBatch) { ExpectAccepted(); }

TEST_F(ValidateRaggedTest, AcceptsZeroSequences) {
  num_seqs_data_[0] = 0;
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsZeroSequencesWithGarbageMetadata) {
  // Nothing past num_seqs is read: kv_lens, q lengths and pages are free.
  num_seqs_data_[0] = 0;
  kv_lens_data_ = {-5, INT32_MAX, -1};
  cu_q_lens_data_ = {0, 100, -3, 7};
  SetPagesPerSeq(1);
  SetPage(0, 0, -1);
  SetPage(1, 0, INT32_MAX);
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsQLenZeroWithKvLenZero) {
  kv_lens_data_ = {5, 0, 0};
  cu_q_lens_data_ = {0, 1, 1, 1};
  SetPage(1, 0, -1);  // Sequence 1 reads no page.
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsPagesPerSeqZeroWithAllKvLensZero) {
  kv_lens_data_ = {0, 0, 0};
  cu_q_lens_data_ = {0, 0, 0, 0};
  SetPagesPerSeq(0);
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsQRowsBeforeCuQLensZeroAsPadding) {
  cu_q_lens_data_ = {2, 3, 6, 6};
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsGarbagePageIndicesBeyondReadRange) {
  // kv_len 8 reads exactly columns 0 and 1; kv_len 4 exactly column 0.
  kv_lens_data_ = {8, 4, 0};
  SetPage(0, 2, INT32_MIN);
  SetPage(1, 1, -1);
  SetPage(1, 2, static_cast<int32_t>(kNumPages));
  for (int64_t column = 0; column < 3; ++column) SetPage(2, column, INT32_MAX);
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsGarbageKvLensBeyondNumSeqs) {
  // docs/contract.md §3: min_pages_per_seq is the max over the first num_seqs sequences.
  kv_lens_data_[2] = 1 << 30;
  ExpectAccepted();
  kv_lens_data_[2] = -7;
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsBoundaryOptions) {
  options_.sm_scale = 0.125;
  options_.sliding_window = 1;
  options_.soft_cap = -30.0;  // JAX rejects only 0.0.
  options_.mask_value = -INFINITY;
  options_.k_scale = 0.5;
  options_.v_scale = 2.0;
  options_.num_kv_pages_per_block = 3;  // == pages_per_seq.
  options_.num_queries_per_block = 1;
  options_.vmem_limit_bytes = 1;
  options_.num_threads = 1;
  ExpectAccepted();
  options_.num_kv_pages_per_block = 1;
  options_.sliding_window = INT64_MAX;
  options_.mask_value = 0.0;  // Not a large negative, but allowed.
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, AcceptsNonContiguousOuterStrides) {
  // Only the last dimension must be contiguous: every other page of the
  // 6-page cache and every other row of q and out (doubled outer strides,
  // halved extents).
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens / 2, kQHeads, kHeadDim},
                  {2 * kQHeads * kHeadDim, kHeadDim, 1});
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens / 2, kQHeads, kHeadDim},
                           {2 * kQHeads * kHeadDim, kHeadDim, 1});
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages / 2, kPageSize, 2 * kKvHeads, kHeadDim},
                         {2 * kPageSize * 2 * kKvHeads * kHeadDim, 2 * kKvHeads * kHeadDim, kHeadDim, 1});
  SetPage(0, 0, 2);
  SetPage(0, 1, 1);
  SetPage(1, 0, 0);
  cu_q_lens_data_ = {0, 1, 4, 4};
  EXPECT_NO_THROW(CallStatic());
  EXPECT_NO_THROW(CallDynamic());
  EXPECT_NO_THROW(CallFast());
  EXPECT_NO_THROW(CallReference());
}

// ---- Ranks and extents (ours: where JAX's tuple unpacking would fail).

TEST_F(ValidateRaggedTest, QRank2) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, kQHeads * kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "q.shape=(8, 32) must have 3 dimensions [max_num_batched_tokens, num_q_heads, "
                 "head_dim]. Pass q as a 3-dimensional array [max_num_batched_tokens, "
                 "num_q_heads, head_dim].");
}

TEST_F(ValidateRaggedTest, KvPagesRank3) {
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, kPageSize, 32});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "kv_pages.shape=(6, 4, 32) must have 4 dimensions [total_num_pages, page_size, "
                 "2 * num_kv_heads, head_dim]. Pass kv_pages as a 4-dimensional array "
                 "[total_num_pages, page_size, 2 * num_kv_heads, head_dim].");
}

TEST_F(ValidateRaggedTest, PageIndicesRank1) {
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {9});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "page_indices.shape=(9,) must have 2 dimensions [max_num_seqs, pages_per_seq]. "
                 "Pass page_indices as a 2-dimensional array [max_num_seqs, pages_per_seq].");
}

TEST_F(ValidateRaggedTest, CombinedKvHeadsOdd) {
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, kPageSize, 3, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_combined_kv_heads=3 (kv_pages.shape[2]) must be even. In the combined "
                 "layout head 2h holds K and head 2h + 1 holds V of kv head h; interleave K and "
                 "V so kv_pages.shape[2] = 2 * num_kv_heads.");
}

TEST_F(ValidateRaggedTest, NumQHeadsZero) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, 0, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_q_heads=0 must be positive. q must have at least one head: q.shape[1] >= 1.");
}

TEST_F(ValidateRaggedTest, CombinedKvHeadsZero) {
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, kPageSize, 0, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_kv_heads=0 must be positive. The cache must hold at least one kv head: "
                 "kv_pages.shape[2] >= 2.");
}

TEST_F(ValidateRaggedTest, HeadDimZero) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, kQHeads, 0});
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, kPageSize, 2 * kKvHeads, 0});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "head_dim=0 must be positive. kv_pages.shape[3] must be >= 1.");
}

TEST_F(ValidateRaggedTest, PageSizeZero) {
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, 0, 2 * kKvHeads, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "page_size=0 must be positive. Pages must hold at least one token; fix "
                 "kv_pages's page_size dimension.");
}

// ---- JAX's static checks, in JAX's order.

TEST_F(ValidateRaggedTest, NumSeqsShape2) {
  num_seqs_ = TensorView(num_seqs_data_.data(), DType::kI32, {2});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_seqs.shape=(2,) must be (1,). Pass num_seqs as a one-element int32 array "
                 "holding the number of live sequences.");
}

TEST_F(ValidateRaggedTest, NumSeqsShape1x1) {
  num_seqs_ = TensorView(num_seqs_data_.data(), DType::kI32, {1, 1});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_seqs.shape=(1, 1) must be (1,). Pass num_seqs as a one-element int32 "
                 "array holding the number of live sequences.");
}

TEST_F(ValidateRaggedTest, NumSeqsScalar) {
  num_seqs_ = TensorView(num_seqs_data_.data(), DType::kI32, {});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_seqs.shape=() must be (1,). Pass num_seqs as a one-element int32 array "
                 "holding the number of live sequences.");
}

TEST_F(ValidateRaggedTest, QHeadDimMismatch) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens / 2, kQHeads, 16});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "Q head_dim 16 must be the same as that of K/V 8. Q, K and V must share one "
                 "head_dim: q.shape[2] == kv_pages.shape[3].");
}

TEST_F(ValidateRaggedTest, KvLensShapeShort) {
  kv_lens_ = TensorView(kv_lens_data_.data(), DType::kI32, {2});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "Expected kv_lens.shape=(2,) to be (3,) where `max_num_seqs` is "
                 "`page_indices.shape[0]`. Give kv_lens one entry per row of page_indices.");
}

TEST_F(ValidateRaggedTest, KvLensShapeRank2) {
  kv_lens_ = TensorView(kv_lens_data_.data(), DType::kI32, {3, 1});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "Expected kv_lens.shape=(3, 1) to be (3,) where `max_num_seqs` is "
                 "`page_indices.shape[0]`. Give kv_lens one entry per row of page_indices.");
}

TEST_F(ValidateRaggedTest, CuQLensShapeShortKeepsJaxDoubleSpace) {
  cu_q_lens_ = TensorView(cu_q_lens_data_.data(), DType::kI32, {3});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "Expected cu_q_lens.shape=(3,) to be (4,)  where `max_num_seqs` is "
                 "`page_indices.shape[0]`. Give cu_q_lens one entry more than page_indices has "
                 "rows: cu_q_lens[i] is where sequence i's queries start.");
}

TEST_F(ValidateRaggedTest, KvLensInt64) {
  kv_lens_ = TensorView(wide_data_.data(), DType::kI64, {kMaxSeqs});
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "The dtype of `kv_lens`, `page_indices`, and `cu_q_lens` must be int32. Got "
                 "kv_lens.dtype=dtype('int64'), page_indices.dtype=dtype('int32'), "
                 "cu_q_lens.dtype=dtype('int32'). Cast them to int32 (for NumPy: "
                 ".astype(np.int32)).");
}

TEST_F(ValidateRaggedTest, PageIndicesInt64) {
  page_indices_ = TensorView(wide_data_.data(), DType::kI64, {kMaxSeqs, 3});
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "The dtype of `kv_lens`, `page_indices`, and `cu_q_lens` must be int32. Got "
                 "kv_lens.dtype=dtype('int32'), page_indices.dtype=dtype('int64'), "
                 "cu_q_lens.dtype=dtype('int32'). Cast them to int32 (for NumPy: "
                 ".astype(np.int32)).");
}

TEST_F(ValidateRaggedTest, AllMetadataInt64) {
  kv_lens_ = TensorView(wide_data_.data(), DType::kI64, {kMaxSeqs});
  page_indices_ = TensorView(wide_data_.data(), DType::kI64, {kMaxSeqs, 3});
  cu_q_lens_ = TensorView(wide_data_.data(), DType::kI64, {kMaxSeqs + 1});
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "The dtype of `kv_lens`, `page_indices`, and `cu_q_lens` must be int32. Got "
                 "kv_lens.dtype=dtype('int64'), page_indices.dtype=dtype('int64'), "
                 "cu_q_lens.dtype=dtype('int64'). Cast them to int32 (for NumPy: "
                 ".astype(np.int32)).");
}

TEST_F(ValidateRaggedTest, NumQHeadsNotDivisibleByNumKvHeads) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, 3, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_q_heads=3 must be divisible by num_kv_heads=2. Each kv head must serve the "
                 "same number of q heads (GQA): choose num_q_heads as a multiple of "
                 "num_kv_heads.");
}

TEST_F(ValidateRaggedTest, SlidingWindowZero) {
  options_.sliding_window = 0;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "sliding_window=0 must be positive. Pass the number of keys each query sees (its "
                 "own position included), or None for no window.");
}

TEST_F(ValidateRaggedTest, SlidingWindowNegative) {
  options_.sliding_window = -3;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "sliding_window=-3 must be positive. Pass the number of keys each query sees "
                 "(its own position included), or None for no window.");
}

TEST_F(ValidateRaggedTest, SoftCapZero) {
  options_.soft_cap = 0.0;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "soft_cap=0.0 must not be 0.0. Pass the cap c of c * tanh(logit / c) (e.g. "
                 "50.0), or None for no soft cap.");
}

TEST_F(ValidateRaggedTest, SoftCapNegativeZero) {
  options_.soft_cap = -0.0;  // Python: -0.0 == 0.0, and f"{soft_cap=}" prints -0.0.
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "soft_cap=-0.0 must not be 0.0. Pass the cap c of c * tanh(logit / c) (e.g. "
                 "50.0), or None for no soft cap.");
}

// The seed's error: a block size tuned for another page size.
TEST_F(ValidateRaggedTest, NumKvPagesPerBlock64WithPagesPerSeq32) {
  SetPagesPerSeq(32);
  options_.num_kv_pages_per_block = 64;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=64 must be in range (0, 32]. Pass None to let the "
                 "library choose, or at most pages_per_seq = page_indices.shape[1] = 32; "
                 "pages_per_seq depends on page_size (ceil(max_model_len / page_size)), so a "
                 "value tuned for another page size will not fit.");
}

TEST_F(ValidateRaggedTest, NumKvPagesPerBlock33WithPagesPerSeq32) {
  SetPagesPerSeq(32);
  options_.num_kv_pages_per_block = 33;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=33 must be in range (0, 32]. Pass None to let the "
                 "library choose, or at most pages_per_seq = page_indices.shape[1] = 32; "
                 "pages_per_seq depends on page_size (ceil(max_model_len / page_size)), so a "
                 "value tuned for another page size will not fit.");
}

TEST_F(ValidateRaggedTest, NumKvPagesPerBlock65WithPagesPerSeq32) {
  SetPagesPerSeq(32);
  options_.num_kv_pages_per_block = 65;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=65 must be in range (0, 32]. Pass None to let the "
                 "library choose, or at most pages_per_seq = page_indices.shape[1] = 32; "
                 "pages_per_seq depends on page_size (ceil(max_model_len / page_size)), so a "
                 "value tuned for another page size will not fit.");
}

TEST_F(ValidateRaggedTest, NumKvPagesPerBlockZeroWithPagesPerSeq32) {
  SetPagesPerSeq(32);
  options_.num_kv_pages_per_block = 0;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=0 must be in range (0, 32]. Pass None to let the "
                 "library choose, or at most pages_per_seq = page_indices.shape[1] = 32; "
                 "pages_per_seq depends on page_size (ceil(max_model_len / page_size)), so a "
                 "value tuned for another page size will not fit.");
}

TEST_F(ValidateRaggedTest, NumKvPagesPerBlockNegativeWithPagesPerSeq32) {
  SetPagesPerSeq(32);
  options_.num_kv_pages_per_block = -1;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=-1 must be in range (0, 32]. Pass None to let the "
                 "library choose, or at most pages_per_seq = page_indices.shape[1] = 32; "
                 "pages_per_seq depends on page_size (ceil(max_model_len / page_size)), so a "
                 "value tuned for another page size will not fit.");
}

TEST_F(ValidateRaggedTest, NumKvPagesPerBlockInRangeWithPagesPerSeq32Accepted) {
  SetPagesPerSeq(32);
  options_.num_kv_pages_per_block = 32;
  ExpectAccepted();
  options_.num_kv_pages_per_block = 1;
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, HugeNumQueriesPerBlockAcceptedByEveryPath) {
  options_.num_queries_per_block = int64_t{1} << 40;
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, NumKvPagesPerBlockWithPagesPerSeqZero) {
  kv_lens_data_ = {0, 0, 0};
  cu_q_lens_data_ = {0, 0, 0, 0};
  SetPagesPerSeq(0);
  options_.num_kv_pages_per_block = 1;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=1 must be in range (0, 0]. Pass None to let the library "
                 "choose, or at most pages_per_seq = page_indices.shape[1] = 0; pages_per_seq "
                 "depends on page_size (ceil(max_model_len / page_size)), so a value tuned for "
                 "another page size will not fit.");
}

TEST_F(ValidateRaggedTest, NumQueriesPerBlockZero) {
  options_.num_queries_per_block = 0;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_queries_per_block=0 must be positive. Pass None to let the library choose, "
                 "or a query-tile size >= 1.");
}

TEST_F(ValidateRaggedTest, VmemLimitBytesZero) {
  options_.vmem_limit_bytes = 0;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "vmem_limit_bytes=0 must be positive. Pass None for no limit, or a per-worker "
                 "scratch budget in bytes.");
}

// ---- Ours: dtypes.

TEST_F(ValidateRaggedTest, NumSeqsInt64) {
  num_seqs_ = TensorView(wide_data_.data(), DType::kI64, {1});
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "num_seqs.dtype=dtype('int64') must be int32. Cast num_seqs to int32.");
}

TEST_F(ValidateRaggedTest, QDtypeInt8Unsupported) {
  q_.dtype = DType::kI8;
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "q.dtype=dtype('int8') is not supported; q must be one of float32, bfloat16, "
                 "float16. Cast q to one of these dtypes.");
}

TEST_F(ValidateRaggedTest, QDtypeFp8Unsupported) {
  q_.dtype = DType::kF8E4M3FN;
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "q.dtype=dtype('float8_e4m3fn') is not supported; q must be one of float32, "
                 "bfloat16, float16. Cast q to one of these dtypes.");
}

TEST_F(ValidateRaggedTest, KvPagesDtypeInt32Unsupported) {
  kv_pages_.dtype = DType::kI32;
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "kv_pages.dtype=dtype('int32') is not supported; kv_pages must be one of "
                 "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8. Cast kv_pages to "
                 "one of these dtypes.");
}

TEST_F(ValidateRaggedTest, KvPagesDtypeFloat64Unsupported) {
  kv_pages_.dtype = DType::kF64;
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "kv_pages.dtype=dtype('float64') is not supported; kv_pages must be one of "
                 "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8. Cast kv_pages to "
                 "one of these dtypes.");
}

TEST_F(ValidateRaggedTest, KvPagesDtypeUint8Unsupported) {
  kv_pages_.dtype = DType::kU8;
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "kv_pages.dtype=dtype('uint8') is not supported; kv_pages must be one of "
                 "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8. Cast kv_pages to "
                 "one of these dtypes.");
}

// ---- Ours: non-finite scalars, in Python's float spelling.

TEST_F(ValidateRaggedTest, SmScaleNan) {
  options_.sm_scale = NAN;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "sm_scale=nan must be finite. Pass a finite float for sm_scale, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, SmScaleInf) {
  options_.sm_scale = INFINITY;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "sm_scale=inf must be finite. Pass a finite float for sm_scale, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, SmScaleMinusInf) {
  options_.sm_scale = -INFINITY;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "sm_scale=-inf must be finite. Pass a finite float for sm_scale, or None to "
                 "leave it out.");
}

TEST_F(ValidateRaggedTest, SoftCapNan) {
  options_.soft_cap = NAN;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "soft_cap=nan must be finite. Pass a finite float for soft_cap, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, SoftCapInf) {
  options_.soft_cap = INFINITY;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "soft_cap=inf must be finite. Pass a finite float for soft_cap, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, KScaleNan) {
  options_.k_scale = NAN;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "k_scale=nan must be finite. Pass a finite float for k_scale, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, KScaleInf) {
  options_.k_scale = INFINITY;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "k_scale=inf must be finite. Pass a finite float for k_scale, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, VScaleNan) {
  options_.v_scale = NAN;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "v_scale=nan must be finite. Pass a finite float for v_scale, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, VScaleMinusInf) {
  options_.v_scale = -INFINITY;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "v_scale=-inf must be finite. Pass a finite float for v_scale, or None to leave "
                 "it out.");
}

TEST_F(ValidateRaggedTest, MaskValueNan) {
  options_.mask_value = NAN;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "mask_value=nan must not be NaN or +inf. Pass a large negative float (JAX's "
                 "DEFAULT_MASK_VALUE is -2.381976426469702e+38) or -inf, or None for the "
                 "default.");
}

TEST_F(ValidateRaggedTest, MaskValuePlusInf) {
  options_.mask_value = INFINITY;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "mask_value=inf must not be NaN or +inf. Pass a large negative float (JAX's "
                 "DEFAULT_MASK_VALUE is -2.381976426469702e+38) or -inf, or None for the "
                 "default.");
}

TEST_F(ValidateRaggedTest, NumThreadsZero) {
  options_.num_threads = 0;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "num_threads=0 must be positive. Pass None to use RPA_NUM_THREADS or every core, "
                 "or a thread count >= 1.");
}

TEST_F(ValidateRaggedTest, NumThreadsNegative) {
  options_.num_threads = -2;
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "num_threads=-2 must be positive. Pass None to use RPA_NUM_THREADS or every "
                 "core, or a thread count >= 1.");
}

// ---- Ours: only the innermost dimension must be contiguous.

TEST_F(ValidateRaggedTest, QInnermostStrideNotOne) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens / 2, kQHeads, kHeadDim},
                  {64, 16, 2});
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens / 2, kQHeads, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "q must be contiguous in its last dimension; got q.strides=(64, 16, 2) (in "
                 "elements). Pass a view of q whose last stride is 1 (other strides are free), "
                 "or a contiguous copy.");
}

TEST_F(ValidateRaggedTest, KvPagesInnermostStrideNotOne) {
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {3, kPageSize, 2 * kKvHeads, kHeadDim},
                         {256, 64, 16, 2});
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "kv_pages must be contiguous in its last dimension; got kv_pages.strides=(256, "
                 "64, 16, 2) (in elements). Pass a view of kv_pages whose last stride is 1 (other "
                 "strides are free), or a contiguous copy.");
}

TEST_F(ValidateRaggedTest, KvLensStrideNotOne) {
  kv_lens_ = TensorView(wide_data_.data(), DType::kI32, {kMaxSeqs}, {2});
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "kv_lens must be contiguous in its last dimension; got kv_lens.strides=(2,) (in "
                 "elements). Pass a view of kv_lens whose last stride is 1 (other strides are "
                 "free), or a contiguous copy.");
}

TEST_F(ValidateRaggedTest, PageIndicesInnermostStrideNotOne) {
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {kMaxSeqs, 2}, {3, 0});
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "page_indices must be contiguous in its last dimension; got "
                 "page_indices.strides=(3, 0) (in elements). Pass a view of page_indices whose "
                 "last stride is 1 (other strides are free), or a contiguous copy.");
}

TEST_F(ValidateRaggedTest, CuQLensStrideNotOne) {
  cu_q_lens_ = TensorView(wide_data_.data(), DType::kI32, {kMaxSeqs + 1}, {-1});
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "cu_q_lens must be contiguous in its last dimension; got cu_q_lens.strides=(-1,) "
                 "(in elements). Pass a view of cu_q_lens whose last stride is 1 (other strides "
                 "are free), or a contiguous copy.");
}

TEST_F(ValidateRaggedTest, InnermostStrideOfExtentOneIsFree) {
  // NumPy and PyTorch give an extent-1 dimension arbitrary strides.
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, kQHeads * kHeadDim, 1}, {32, 1, 99});
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens, kQHeads * kHeadDim, 1},
                           {32, 1, 7});
  // head_dim 1, 32 q heads over 16 kv heads (combined 32).
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, kPageSize, 32, 1}, {128, 32, 1, 5});
  EXPECT_NO_THROW(CallStatic());
  EXPECT_NO_THROW(CallDynamic());
  EXPECT_NO_THROW(CallFast());
  EXPECT_NO_THROW(CallReference());
}

// ---- Ours: the output view (only the entry points see it).

TEST_F(ValidateRaggedTest, OutShapeMismatch) {
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens - 1, kQHeads, kHeadDim});
  ExpectRejected(Stage::kOutput, ErrorKind::kShape,
                 "out.shape=(7, 4, 8) must be the same as q.shape=(8, 4, 8). Allocate out like "
                 "q.");
}

TEST_F(ValidateRaggedTest, OutRankMismatch) {
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens, kQHeads * kHeadDim});
  ExpectRejected(Stage::kOutput, ErrorKind::kShape,
                 "out.shape=(8, 32) must be the same as q.shape=(8, 4, 8). Allocate out like q.");
}

TEST_F(ValidateRaggedTest, OutDtypeMismatch) {
  out_.dtype = DType::kBF16;
  ExpectRejected(Stage::kOutput, ErrorKind::kDtype,
                 "out.dtype=dtype('bfloat16') must be the same as q.dtype=dtype('float32'). "
                 "Allocate out like q.");
}

TEST_F(ValidateRaggedTest, OutInnermostStrideNotOne) {
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens, kQHeads, kHeadDim},
                           {32, 8, 0});
  ExpectRejected(Stage::kOutput, ErrorKind::kLayout,
                 "out must be contiguous in its last dimension; got out.strides=(32, 8, 0) (in "
                 "elements). Pass a view of out whose last stride is 1 (other strides are free), "
                 "or a contiguous copy.");
}

// ---- Ours: attention sinks and the log-sum-exp output (docs/contract.md §1 conventions).

TEST_F(ValidateRaggedTest, AcceptsSinksAndLse) {
  options_.sinks = TensorView(sinks_data_.data(), DType::kF32, {kQHeads});
  options_.lse = MutableTensorView(lse_data_.data(), DType::kF32, {kTokens, kQHeads});
  ExpectAccepted();
}

TEST_F(ValidateRaggedTest, SinksShapeMismatch) {
  options_.sinks = TensorView(sinks_data_.data(), DType::kF32, {kQHeads - 1});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "sinks.shape=(3,) must be (num_q_heads=4,). Pass one sink logit per q head, or "
                 "None for no sinks.");
}

TEST_F(ValidateRaggedTest, SinksRank2) {
  options_.sinks = TensorView(sinks_data_.data(), DType::kF32, {1, kQHeads});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "sinks.shape=(1, 4) must be (num_q_heads=4,). Pass one sink logit per q head, or "
                 "None for no sinks.");
}

TEST_F(ValidateRaggedTest, SinksDtypeBf16) {
  options_.sinks = TensorView(sinks_data_.data(), DType::kBF16, {kQHeads});
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "sinks.dtype=dtype('bfloat16') must be float32. Cast sinks to float32.");
}

TEST_F(ValidateRaggedTest, SinksStrideNotOne) {
  options_.sinks = TensorView(sinks_data_.data(), DType::kF32, {kQHeads / 2}, {2});
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, kQHeads / 2, kHeadDim});
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens, kQHeads / 2, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "sinks must be contiguous in its last dimension; got sinks.strides=(2,) (in "
                 "elements). Pass a view of sinks whose last stride is 1 (other strides are "
                 "free), or a contiguous copy.");
}

TEST_F(ValidateRaggedTest, SinksNan) {
  sinks_data_[2] = NAN;
  options_.sinks = TensorView(sinks_data_.data(), DType::kF32, {kQHeads});
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "sinks[2]=nan must not be NaN or +inf. Pass a finite logit, or -inf for a head "
                 "without a sink.");
}

TEST_F(ValidateRaggedTest, SinksPositiveInfinity) {
  sinks_data_[1] = INFINITY;
  options_.sinks = TensorView(sinks_data_.data(), DType::kF32, {kQHeads});
  ExpectRejected(Stage::kStatic, ErrorKind::kOption,
                 "sinks[1]=inf must not be NaN or +inf. Pass a finite logit, or -inf for a head "
                 "without a sink.");
}

TEST_F(ValidateRaggedTest, MisalignedViewIsRejected) {
  // A float32 view one byte into its buffer.
  q_ = TensorView(reinterpret_cast<const char*>(q_data_.data()) + 1, DType::kF32,
                  {kTokens - 1, kQHeads, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "q must be aligned to its 4-byte elements; its data starts at an address that is "
                 "not. Pass q in a buffer aligned to its dtype (a copy is), not at an odd byte "
                 "offset.");
}

TEST_F(ValidateRaggedTest, NegativeExtentIsRejected) {
  q_ = TensorView(q_data_.data(), DType::kF32, {-1, kQHeads, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "q.shape=(-1, 4, 8) must not have a negative dimension. Pass a valid view of q.");
}

TEST_F(ValidateRaggedTest, LseShapeMismatch) {
  options_.lse = MutableTensorView(lse_data_.data(), DType::kF32, {kTokens, kQHeads - 1});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "lse.shape=(8, 3) must be (max_num_batched_tokens=8, num_q_heads=4). Allocate "
                 "lse with one float32 per q row and q head: q.shape[:2].");
}

TEST_F(ValidateRaggedTest, LseRank3) {
  options_.lse = MutableTensorView(lse_data_.data(), DType::kF32, {kTokens, kQHeads, 1});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "lse.shape=(8, 4, 1) must be (max_num_batched_tokens=8, num_q_heads=4). "
                 "Allocate lse with one float32 per q row and q head: q.shape[:2].");
}

TEST_F(ValidateRaggedTest, LseDtypeF16) {
  options_.lse = MutableTensorView(lse_data_.data(), DType::kF16, {kTokens, kQHeads});
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "lse.dtype=dtype('float16') must be float32. Allocate lse as float32.");
}

TEST_F(ValidateRaggedTest, LseInnermostStrideNotOne) {
  options_.lse = MutableTensorView(lse_data_.data(), DType::kF32, {kTokens / 2, kQHeads}, {8, 2});
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens / 2, kQHeads, kHeadDim});
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {kTokens / 2, kQHeads, kHeadDim});
  cu_q_lens_data_ = {0, 1, 4, 4};
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 "lse must be contiguous in its last dimension; got lse.strides=(8, 2) (in "
                 "elements). Pass a view of lse whose last stride is 1 (other strides are free), "
                 "or a contiguous copy.");
}

TEST_F(ValidateRaggedTest, LseUntouchedOnDynamicError) {
  options_.lse = MutableTensorView(lse_data_.data(), DType::kF32, {kTokens, kQHeads});
  options_.sinks = TensorView(sinks_data_.data(), DType::kF32, {kQHeads});
  SetPage(0, 1, -1);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[0, 1]=-1 must be in range [0, total_num_pages=6) because sequence "
                 "0 reads it (kv_lens[0]=5, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
}

TEST_F(ValidateRaggedTest, LseUntouchedOnOutputError) {
  options_.lse = MutableTensorView(lse_data_.data(), DType::kF32, {kTokens, kQHeads});
  out_.dtype = DType::kBF16;
  ExpectRejected(Stage::kOutput, ErrorKind::kDtype,
                 "out.dtype=dtype('bfloat16') must be the same as q.dtype=dtype('float32'). "
                 "Allocate out like q.");
}

// ---- Dynamic checks: num_seqs.

TEST_F(ValidateRaggedTest, NumSeqsAboveMaxNumSeqs) {
  num_seqs_data_[0] = 4;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "num_seqs[0]=4 must be less or equal to max_num_seqs=3. num_seqs counts the live "
                 "rows of page_indices, kv_lens and cu_q_lens; pass at most "
                 "page_indices.shape[0].");
}

TEST_F(ValidateRaggedTest, NumSeqsInt32Max) {
  num_seqs_data_[0] = INT32_MAX;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "num_seqs[0]=2147483647 must be less or equal to max_num_seqs=3. num_seqs counts "
                 "the live rows of page_indices, kv_lens and cu_q_lens; pass at most "
                 "page_indices.shape[0].");
}

TEST_F(ValidateRaggedTest, NumSeqsNegative) {
  num_seqs_data_[0] = -1;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "num_seqs[0]=-1 must be greater or equal to 0. Pass the number of live "
                 "sequences, 0 for an empty batch.");
}

TEST_F(ValidateRaggedTest, NumSeqsEqualsMaxNumSeqsAccepted) {
  num_seqs_data_[0] = 3;
  kv_lens_data_[2] = 2;
  cu_q_lens_data_[3] = 6;
  SetPage(2, 0, 5);
  ExpectAccepted();
}

// ---- Dynamic checks: kv_lens and pages_per_seq.

TEST_F(ValidateRaggedTest, KvLenNegative) {
  kv_lens_data_[1] = -2;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "kv_lens[1]=-2 must be greater or equal to 0. kv_lens holds each sequence's "
                 "number of tokens in the cache.");
}

TEST_F(ValidateRaggedTest, PagesPerSeqTooSmall) {
  kv_lens_data_[0] = 13;  // ceil(13 / 4) = 4 > 3 columns.
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "pages_per_seq=3 must be greater or equal to min_pages_per_seq=4 given "
                 "max_kv_len=13 and page_size=4. Widen page_indices to ceil(max_kv_len / "
                 "page_size) columns, or shorten the sequences.");
}

TEST_F(ValidateRaggedTest, PagesPerSeqTooSmallKvLenInt32MaxDoesNotOverflow) {
  // In int32, kv_len + page_size - 1 would wrap negative and pass the check.
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, 256, 2 * kKvHeads, kHeadDim});
  kv_lens_data_[0] = INT32_MAX;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "pages_per_seq=3 must be greater or equal to min_pages_per_seq=8388608 given "
                 "max_kv_len=2147483647 and page_size=256. Widen page_indices to "
                 "ceil(max_kv_len / page_size) columns, or shorten the sequences.");
}

TEST_F(ValidateRaggedTest, PagesPerSeqTooSmallKvLenNearInt32Max) {
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, 256, 2 * kKvHeads, kHeadDim});
  kv_lens_data_[1] = INT32_MAX - 200;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "pages_per_seq=3 must be greater or equal to min_pages_per_seq=8388608 given "
                 "max_kv_len=2147483447 and page_size=256. Widen page_indices to "
                 "ceil(max_kv_len / page_size) columns, or shorten the sequences.");
}

TEST_F(ValidateRaggedTest, KvLenInt32MaxChecksEveryPageItReads) {
  // page_size 65536: kv_len INT32_MAX reads exactly 32768 pages. Only the
  // validators run on the valid case (the attention itself would be 2^31
  // tokens long).
  constexpr int64_t kBigPage = 65536;
  kv_pages_ = TensorView(kv_data_.data(), DType::kF32, {kNumPages, kBigPage, 2 * kKvHeads, kHeadDim});
  kv_lens_data_ = {INT32_MAX, 3, 0};
  SetPagesPerSeq(32767);
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "pages_per_seq=32767 must be greater or equal to min_pages_per_seq=32768 given "
                 "max_kv_len=2147483647 and page_size=65536. Widen page_indices to "
                 "ceil(max_kv_len / page_size) columns, or shorten the sequences.");
  SetPagesPerSeq(32769);
  for (int64_t column = 0; column < 32768; ++column) SetPage(0, column, 3);
  EXPECT_NO_THROW(CallStatic());
  EXPECT_NO_THROW(CallDynamic());  // Column 32768 holds garbage: never read.
  SetPage(0, 32767, 6);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[0, 32767]=6 must be in range [0, total_num_pages=6) because "
                 "sequence 0 reads it (kv_lens[0]=2147483647, page_size=65536). Point every page "
                 "a sequence's kv_len covers at a page of the cache; columns beyond "
                 "ceil(kv_len / page_size) are never read and may hold anything.");
}

// ---- Dynamic checks: cu_q_lens.

TEST_F(ValidateRaggedTest, CuQLensStartNegative) {
  cu_q_lens_data_ = {-1, 1, 4, 4};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "cu_q_lens[0]=-1 must be greater or equal to 0. cu_q_lens[i] is the q row where "
                 "sequence i starts; rows start at 0.");
}

TEST_F(ValidateRaggedTest, CuQLensStartNegativeWithZeroSequences) {
  num_seqs_data_[0] = 0;
  cu_q_lens_data_ = {-1, 1, 4, 4};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "cu_q_lens[0]=-1 must be greater or equal to 0. cu_q_lens[i] is the q row where "
                 "sequence i starts; rows start at 0.");
}

TEST_F(ValidateRaggedTest, CuQLensDecreasing) {
  cu_q_lens_data_ = {0, 2, 1, 1};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "cu_q_lens[2]=1 must be greater or equal to cu_q_lens[1]=2. cu_q_lens is the "
                 "running sum of the q lengths: it never decreases.");
}

TEST_F(ValidateRaggedTest, CuQLensDecreasingFromInt32Max) {
  // q_len = INT32_MIN - INT32_MAX must not wrap to a small positive.
  cu_q_lens_data_ = {INT32_MAX, INT32_MIN, 4, 4};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "cu_q_lens[1]=-2147483648 must be greater or equal to cu_q_lens[0]=2147483647. "
                 "cu_q_lens is the running sum of the q lengths: it never decreases.");
}

TEST_F(ValidateRaggedTest, TotalQTokensAboveMaxNumBatchedTokens) {
  kv_lens_data_[1] = 8;
  cu_q_lens_data_ = {0, 1, 9, 9};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "Total q tokens 9 must be less or equal to max_num_batched_tokens=8. "
                 "cu_q_lens[num_seqs] counts the q rows in use; make q taller or the batch "
                 "smaller.");
}

TEST_F(ValidateRaggedTest, TotalQTokensCountsFromCuQLensNotZero) {
  // Rows [5, 9): four rows, but the last one is past q's 8.
  cu_q_lens_data_ = {5, 6, 9, 9};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "Total q tokens 9 must be less or equal to max_num_batched_tokens=8. "
                 "cu_q_lens[num_seqs] counts the q rows in use; make q taller or the batch "
                 "smaller.");
}

TEST_F(ValidateRaggedTest, QLenAboveKvLen) {
  cu_q_lens_data_ = {0, 1, 5, 5};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "q_len=4 must be less or equal to kv_len=3 at sequence 1. A sequence's new "
                 "tokens are part of its history: kv_lens[i] counts them too.");
}

TEST_F(ValidateRaggedTest, QLenOneWithKvLenZero) {
  kv_lens_data_[0] = 0;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "q_len=1 must be less or equal to kv_len=0 at sequence 0. A sequence's new "
                 "tokens are part of its history: kv_lens[i] counts them too.");
}

// ---- Dynamic checks: page indices within the read range.

TEST_F(ValidateRaggedTest, PageIndexMinusOne) {
  SetPage(0, 1, -1);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[0, 1]=-1 must be in range [0, total_num_pages=6) because sequence "
                 "0 reads it (kv_lens[0]=5, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
}

TEST_F(ValidateRaggedTest, PageIndexEqualsTotalNumPages) {
  SetPage(1, 0, 6);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[1, 0]=6 must be in range [0, total_num_pages=6) because sequence "
                 "1 reads it (kv_lens[1]=3, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
}

TEST_F(ValidateRaggedTest, PageIndexInt32Max) {
  SetPage(0, 0, INT32_MAX);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[0, 0]=2147483647 must be in range [0, total_num_pages=6) because "
                 "sequence 0 reads it (kv_lens[0]=5, page_size=4). Point every page a sequence's "
                 "kv_len covers at a page of the cache; columns beyond ceil(kv_len / page_size) "
                 "are never read and may hold anything.");
}

TEST_F(ValidateRaggedTest, PageIndexInt32Min) {
  SetPage(0, 1, INT32_MIN);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[0, 1]=-2147483648 must be in range [0, total_num_pages=6) because "
                 "sequence 0 reads it (kv_lens[0]=5, page_size=4). Point every page a sequence's "
                 "kv_len covers at a page of the cache; columns beyond ceil(kv_len / page_size) "
                 "are never read and may hold anything.");
}

TEST_F(ValidateRaggedTest, PageIndexReadWithQLenZero) {
  // A sequence with no new tokens still has its history read: its pages count.
  kv_lens_data_ = {5, 3, 0};
  cu_q_lens_data_ = {0, 1, 1, 1};
  SetPage(1, 0, -1);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[1, 0]=-1 must be in range [0, total_num_pages=6) because sequence "
                 "1 reads it (kv_lens[1]=3, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
}

TEST_F(ValidateRaggedTest, PageIndexWithPaddedPageIndicesRows) {
  // A row stride wider than pages_per_seq: index [1, 0] lives at element 5.
  page_indices_data_ = {4, 1, 9, 9, 9, -1, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {kMaxSeqs, 3}, {5, 1});
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[1, 0]=-1 must be in range [0, total_num_pages=6) because sequence "
                 "1 reads it (kv_lens[1]=3, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
  page_indices_data_[5] = 2;
  ExpectAccepted();
}

// ---------------------------------------------------------------------------
// Separate K and V caches: the messages that name the cache or are split-only,
// and the dynamic checks through the split path.
class ValidateSplitTest : public ValidateRaggedTest,
                          public ::testing::WithParamInterface<KVLayout> {
 protected:
  void SetUp() override {
    ValidateRaggedTest::SetUp();
    UseLayout(GetParam());
  }
  bool Nhd() const { return GetParam() == KVLayout::kNHD; }
  // Both caches as `shape` (row-major).
  void SetCacheShape(std::initializer_list<int64_t> shape) {
    k_pages_ = TensorView(k_data_.data(), DType::kF32, shape);
    v_pages_ = TensorView(v_data_.data(), DType::kF32, shape);
  }
};

INSTANTIATE_TEST_SUITE_P(ValidateLayouts, ValidateSplitTest,
                         ::testing::Values(KVLayout::kNHD, KVLayout::kHND),
                         [](const ::testing::TestParamInfo<KVLayout>& layout) {
                           return std::string(ToString(layout.param));
                         });

TEST_P(ValidateSplitTest, AcceptsValidBatch) { ExpectAccepted(); }

TEST_P(ValidateSplitTest, KPagesRank3) {
  k_pages_ = TensorView(k_data_.data(), DType::kF32, {kNumPages, kPageSize, 16});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 Nhd() ? "k_pages.shape=(6, 4, 16) must have 4 dimensions [total_num_pages, "
                         "page_size, num_kv_heads, head_dim]. Pass k_pages as a 4-dimensional "
                         "array [total_num_pages, page_size, num_kv_heads, head_dim]."
                       : "k_pages.shape=(6, 4, 16) must have 4 dimensions [total_num_pages, "
                         "num_kv_heads, page_size, head_dim]. Pass k_pages as a 4-dimensional "
                         "array [total_num_pages, num_kv_heads, page_size, head_dim].");
}

TEST_P(ValidateSplitTest, VPagesRank3) {
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {kNumPages, kPageSize, 16});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 Nhd() ? "v_pages.shape=(6, 4, 16) must have 4 dimensions [total_num_pages, "
                         "page_size, num_kv_heads, head_dim]. Pass v_pages as a 4-dimensional "
                         "array [total_num_pages, page_size, num_kv_heads, head_dim]."
                       : "v_pages.shape=(6, 4, 16) must have 4 dimensions [total_num_pages, "
                         "num_kv_heads, page_size, head_dim]. Pass v_pages as a 4-dimensional "
                         "array [total_num_pages, num_kv_heads, page_size, head_dim].");
}

TEST_P(ValidateSplitTest, KAndVShapesDiffer) {
  v_pages_.shape[0] = 5;
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 Nhd() ? "k_pages and v_pages must have the same shape. Got (6, 4, 2, 8) and (5, "
                         "4, 2, 8). Pass K and V caches of one shape, with the same pages, page "
                         "size, heads and head_dim."
                       : "k_pages and v_pages must have the same shape. Got (6, 2, 4, 8) and (5, "
                         "2, 4, 8). Pass K and V caches of one shape, with the same pages, page "
                         "size, heads and head_dim.");
}

TEST_P(ValidateSplitTest, KAndVDtypesDiffer) {
  v_pages_.dtype = DType::kBF16;
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "k_pages.dtype=dtype('float32') must be the same as "
                 "v_pages.dtype=dtype('bfloat16'). Store K and V in one dtype.");
}

TEST_P(ValidateSplitTest, KvHeadsZero) {
  if (Nhd()) {
    SetCacheShape({kNumPages, kPageSize, 0, kHeadDim});
  } else {
    SetCacheShape({kNumPages, 0, kPageSize, kHeadDim});
  }
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_kv_heads=0 must be positive. The cache must hold at least one kv head: "
                 "k_pages needs >= 1 kv head.");
}

TEST_P(ValidateSplitTest, OddKvHeadCountAccepted) {
  // Only the combined layout needs an even head count; 4 q heads over 1.
  if (Nhd()) {
    SetCacheShape({kNumPages, kPageSize, 1, kHeadDim});
  } else {
    SetCacheShape({kNumPages, 1, kPageSize, kHeadDim});
  }
  ExpectAccepted();
}

TEST_P(ValidateSplitTest, HeadDimZero) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, kQHeads, 0});
  if (Nhd()) {
    SetCacheShape({kNumPages, kPageSize, kKvHeads, 0});
  } else {
    SetCacheShape({kNumPages, kKvHeads, kPageSize, 0});
  }
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "head_dim=0 must be positive. k_pages.shape[3] must be >= 1.");
}

TEST_P(ValidateSplitTest, PageSizeZero) {
  if (Nhd()) {
    SetCacheShape({kNumPages, 0, kKvHeads, kHeadDim});
  } else {
    SetCacheShape({kNumPages, kKvHeads, 0, kHeadDim});
  }
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "page_size=0 must be positive. Pages must hold at least one token; fix "
                 "k_pages's page_size dimension.");
}

TEST_P(ValidateSplitTest, QHeadDimMismatch) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens / 2, kQHeads, 16});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "Q head_dim 16 must be the same as that of K/V 8. Q, K and V must share one "
                 "head_dim: q.shape[2] == k_pages.shape[3].");
}

TEST_P(ValidateSplitTest, NumQHeadsNotDivisibleByNumKvHeads) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kTokens, 3, kHeadDim});
  ExpectRejected(Stage::kStatic, ErrorKind::kShape,
                 "num_q_heads=3 must be divisible by num_kv_heads=2. Each kv head must serve the "
                 "same number of q heads (GQA): choose num_q_heads as a multiple of "
                 "num_kv_heads.");
}

TEST_P(ValidateSplitTest, KPagesDtypeUnsupported) {
  k_pages_.dtype = DType::kF64;
  v_pages_.dtype = DType::kF64;
  ExpectRejected(Stage::kStatic, ErrorKind::kDtype,
                 "k_pages.dtype=dtype('float64') is not supported; k_pages must be one of "
                 "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8. Cast k_pages to "
                 "one of these dtypes.");
}

TEST_P(ValidateSplitTest, KPagesInnermostStrideNotOne) {
  k_pages_.strides[3] = 2;
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 Nhd() ? "k_pages must be contiguous in its last dimension; got "
                         "k_pages.strides=(64, 16, 8, 2) (in elements). Pass a view of k_pages "
                         "whose last stride is 1 (other strides are free), or a contiguous copy."
                       : "k_pages must be contiguous in its last dimension; got "
                         "k_pages.strides=(64, 32, 8, 2) (in elements). Pass a view of k_pages "
                         "whose last stride is 1 (other strides are free), or a contiguous copy.");
}

TEST_P(ValidateSplitTest, VPagesInnermostStrideNotOne) {
  v_pages_.strides[3] = 0;
  ExpectRejected(Stage::kStatic, ErrorKind::kLayout,
                 Nhd() ? "v_pages must be contiguous in its last dimension; got "
                         "v_pages.strides=(64, 16, 8, 0) (in elements). Pass a view of v_pages "
                         "whose last stride is 1 (other strides are free), or a contiguous copy."
                       : "v_pages must be contiguous in its last dimension; got "
                         "v_pages.strides=(64, 32, 8, 0) (in elements). Pass a view of v_pages "
                         "whose last stride is 1 (other strides are free), or a contiguous copy.");
}

TEST_P(ValidateSplitTest, NumKvPagesPerBlock64WithPagesPerSeq32) {
  SetPagesPerSeq(32);
  options_.num_kv_pages_per_block = 64;
  ExpectRejected(Stage::kStatic, ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=64 must be in range (0, 32]. Pass None to let the "
                 "library choose, or at most pages_per_seq = page_indices.shape[1] = 32; "
                 "pages_per_seq depends on page_size (ceil(max_model_len / page_size)), so a "
                 "value tuned for another page size will not fit.");
}

TEST_P(ValidateSplitTest, PagesPerSeqTooSmallUsesLayoutsPageSize) {
  // HND keeps page_size in dimension 2: the message must still say 4.
  kv_lens_data_[0] = 13;
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "pages_per_seq=3 must be greater or equal to min_pages_per_seq=4 given "
                 "max_kv_len=13 and page_size=4. Widen page_indices to ceil(max_kv_len / "
                 "page_size) columns, or shorten the sequences.");
}

TEST_P(ValidateSplitTest, PageIndexEqualsTotalNumPages) {
  SetPage(0, 1, 6);
  ExpectRejected(Stage::kDynamic, ErrorKind::kPageIndex,
                 "page_indices[0, 1]=6 must be in range [0, total_num_pages=6) because sequence "
                 "0 reads it (kv_lens[0]=5, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
}

TEST_P(ValidateSplitTest, QLenAboveKvLen) {
  cu_q_lens_data_ = {0, 1, 5, 5};
  ExpectRejected(Stage::kDynamic, ErrorKind::kMetadata,
                 "q_len=4 must be less or equal to kv_len=3 at sequence 1. A sequence's new "
                 "tokens are part of its history: kv_lens[i] counts them too.");
}

// ---------------------------------------------------------------------------
// JAX's decode-only paged_attention.
//
//   q            f32[2, 4, 8]      batch 2, 4 q heads, head_dim 8
//   k/v_pages    f32[2, 6, 4, 8]   2 kv heads, 6 pages of 4 tokens
//   lengths      {5, 3}
//   page_indices [2, 4]            row 0 {4, 1, g, g}, row 1 {2, g, g, g}
//   pages_per_compute_block 2
// Buffers hold up to 4 sequences so a test can widen the batch.
class ValidatePagedAttentionTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBatch = 2;
  static constexpr int64_t kQHeads = 4;
  static constexpr int64_t kKvHeads = 2;
  static constexpr int64_t kHeadDim = 8;
  static constexpr int64_t kNumPages = 6;
  static constexpr int64_t kPageSize = 4;
  static constexpr int64_t kPagesPerSequence = 4;

  void SetUp() override {
    for (size_t i = 0; i < q_data_.size(); ++i) q_data_[i] = 0.01f * static_cast<float>(i % 19);
    for (size_t i = 0; i < k_data_.size(); ++i) k_data_[i] = 0.02f * static_cast<float>(i % 5);
    for (size_t i = 0; i < v_data_.size(); ++i) v_data_[i] = 0.03f * static_cast<float>(i % 9);
    for (size_t i = 0; i < page_indices_data_.size(); ++i) {
      page_indices_data_[i] = Garbage(static_cast<int64_t>(i));
    }
    page_indices_data_[0] = 4;
    page_indices_data_[1] = 1;
    page_indices_data_[4] = 2;
    options_.pages_per_compute_block = 2;
    SetBatch(kBatch);
    k_pages_ = TensorView(k_data_.data(), DType::kF32, {kKvHeads, kNumPages, kPageSize, kHeadDim});
    v_pages_ = TensorView(v_data_.data(), DType::kF32, {kKvHeads, kNumPages, kPageSize, kHeadDim});
  }

  void SetBatch(int64_t batch) {
    q_ = TensorView(q_data_.data(), DType::kF32, {batch, kQHeads, kHeadDim});
    out_ = MutableTensorView(out_data_.data(), DType::kF32, {batch, kQHeads, kHeadDim});
    lengths_ = TensorView(lengths_data_.data(), DType::kI32, {batch});
    page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {batch, kPagesPerSequence});
  }

  void Call() const { PagedAttention(q_, k_pages_, v_pages_, lengths_, page_indices_, options_, out_); }

  void ExpectRejected(ErrorKind kind, const std::string& expected) {
    const auto kv = [this] {
      std::vector<uint8_t> bytes = Bytes(k_data_);
      const std::vector<uint8_t> v = Bytes(v_data_);
      bytes.insert(bytes.end(), v.begin(), v.end());
      return bytes;
    };
    ExpectThrowsUntouched("PagedAttention", [&] { Call(); }, kind, expected, {&out_data_}, kv);
  }

  void ExpectAccepted() {
    std::fill(out_data_.begin(), out_data_.end(), kSentinel);
    ASSERT_NO_THROW(Call());
    const int64_t count = q_.NumElements();
    for (int64_t i = 0; i < count; ++i) {
      float value;
      std::memcpy(&value, out_data_.data() + i * sizeof(float), sizeof(float));
      ASSERT_TRUE(std::isfinite(value)) << "element " << i;
    }
  }

  std::vector<float> q_data_ = std::vector<float>(4 * kQHeads * kHeadDim);
  std::vector<float> k_data_ = std::vector<float>(kKvHeads * kNumPages * kPageSize * kHeadDim);
  std::vector<float> v_data_ = std::vector<float>(kKvHeads * kNumPages * kPageSize * kHeadDim);
  std::vector<int32_t> lengths_data_ = {5, 3, 2, 1};
  std::vector<int32_t> page_indices_data_ = std::vector<int32_t>(4 * kPagesPerSequence);
  std::vector<int64_t> wide_data_ = std::vector<int64_t>(4 * kPagesPerSequence, 0);
  std::vector<uint8_t> out_data_ = std::vector<uint8_t>(4 * kQHeads * kHeadDim * 4);

  TensorView q_, k_pages_, v_pages_, lengths_, page_indices_;
  MutableTensorView out_;
  PagedAttentionOptions options_;
};

// ---- Valid inputs.

TEST_F(ValidatePagedAttentionTest, AcceptsValidBatch) { ExpectAccepted(); }

TEST_F(ValidatePagedAttentionTest, AcceptsLengthZeroSlotWithGarbagePages) {
  // A padded batch slot: no key, output row 0, its page row never read.
  lengths_data_[1] = 0;
  page_indices_data_[4] = -1;
  ExpectAccepted();
}

TEST_F(ValidatePagedAttentionTest, AcceptsEmptyBatch) {
  SetBatch(0);
  ExpectAccepted();
}

TEST_F(ValidatePagedAttentionTest, AcceptsPagesPerSequenceZeroWithAllLengthsZero) {
  lengths_data_[0] = 0;
  lengths_data_[1] = 0;
  options_.pages_per_compute_block = 1;  // 0 % 1 == 0.
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {kBatch, 0});
  ExpectAccepted();
}

TEST_F(ValidatePagedAttentionTest, AcceptsMegacoreKvHeadWithEvenKvHeads) {
  options_.megacore_mode = "kv_head";
  ExpectAccepted();
}

TEST_F(ValidatePagedAttentionTest, AcceptsMegacoreBatchWithEvenBatch) {
  options_.megacore_mode = "batch";
  ExpectAccepted();
}

TEST_F(ValidatePagedAttentionTest, AcceptsMaskValueMinusInfAndSoftCap) {
  options_.mask_value = -INFINITY;
  options_.attn_logits_soft_cap = 30.0;
  options_.pages_per_compute_block = 4;
  options_.num_threads = 1;
  ExpectAccepted();
}

// ---- Ranks and extents.

TEST_F(ValidatePagedAttentionTest, QRank2) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kBatch, kQHeads * kHeadDim});
  ExpectRejected(ErrorKind::kShape,
                 "q.shape=(2, 32) must have 3 dimensions [batch_size, num_q_heads, head_dim]. "
                 "Pass q as a 3-dimensional array [batch_size, num_q_heads, head_dim].");
}

TEST_F(ValidatePagedAttentionTest, KPagesRank3) {
  k_pages_ = TensorView(k_data_.data(), DType::kF32, {kKvHeads, kNumPages, 32});
  ExpectRejected(ErrorKind::kShape,
                 "k_pages.shape=(2, 6, 32) must have 4 dimensions [num_kv_heads, "
                 "total_num_pages, page_size, head_dim]. Pass k_pages as a 4-dimensional array "
                 "[num_kv_heads, total_num_pages, page_size, head_dim].");
}

TEST_F(ValidatePagedAttentionTest, VPagesRank3) {
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {kKvHeads, kNumPages, 32});
  ExpectRejected(ErrorKind::kShape,
                 "v_pages.shape=(2, 6, 32) must have 4 dimensions [num_kv_heads, "
                 "total_num_pages, page_size, head_dim]. Pass v_pages as a 4-dimensional array "
                 "[num_kv_heads, total_num_pages, page_size, head_dim].");
}

TEST_F(ValidatePagedAttentionTest, PageIndicesRank1) {
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {8});
  ExpectRejected(ErrorKind::kShape,
                 "page_indices.shape=(8,) must have 2 dimensions [batch_size, "
                 "pages_per_sequence]. Pass page_indices as a 2-dimensional array [batch_size, "
                 "pages_per_sequence].");
}

TEST_F(ValidatePagedAttentionTest, NumQHeadsZero) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kBatch, 0, kHeadDim});
  ExpectRejected(ErrorKind::kShape,
                 "num_q_heads=0 must be positive. q must have at least one head: q.shape[1] >= 1.");
}

TEST_F(ValidatePagedAttentionTest, NumKvHeadsZero) {
  k_pages_ = TensorView(k_data_.data(), DType::kF32, {0, kNumPages, kPageSize, kHeadDim});
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {0, kNumPages, kPageSize, kHeadDim});
  ExpectRejected(ErrorKind::kShape,
                 "num_kv_heads=0 must be positive. k_pages.shape[0] must be >= 1.");
}

TEST_F(ValidatePagedAttentionTest, HeadDimZero) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kBatch, kQHeads, 0});
  k_pages_ = TensorView(k_data_.data(), DType::kF32, {kKvHeads, kNumPages, kPageSize, 0});
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {kKvHeads, kNumPages, kPageSize, 0});
  ExpectRejected(ErrorKind::kShape, "head_dim=0 must be positive. k_pages.shape[3] must be >= 1.");
}

TEST_F(ValidatePagedAttentionTest, PageSizeZero) {
  k_pages_ = TensorView(k_data_.data(), DType::kF32, {kKvHeads, kNumPages, 0, kHeadDim});
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {kKvHeads, kNumPages, 0, kHeadDim});
  ExpectRejected(ErrorKind::kShape,
                 "page_size=0 must be positive. k_pages.shape[2] must be >= 1.");
}

TEST_F(ValidatePagedAttentionTest, PagesPerComputeBlockZero) {
  options_.pages_per_compute_block = 0;
  ExpectRejected(ErrorKind::kBlockSize,
                 "pages_per_compute_block=0 must be positive. Pass a divisor of "
                 "pages_per_sequence = page_indices.shape[1].");
}

// ---- JAX's checks, in JAX's order.

TEST_F(ValidatePagedAttentionTest, KAndVShapesDiffer) {
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {kKvHeads, 5, kPageSize, kHeadDim});
  ExpectRejected(ErrorKind::kShape,
                 "k_pages and v_pages must have the same shape. Got (2, 6, 4, 8) and (2, 5, 4, "
                 "8). Pass K and V caches of one shape [num_kv_heads, total_num_pages, page_size, "
                 "head_dim].");
}

TEST_F(ValidatePagedAttentionTest, NumQHeadsNotDivisibleByNumKvHeads) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kBatch, 3, kHeadDim});
  ExpectRejected(ErrorKind::kShape,
                 "Number of Q heads must be divisible by number of KV heads. Got 3 and 2. Each "
                 "kv head must serve the same number of q heads (GQA).");
}

TEST_F(ValidatePagedAttentionTest, QHeadDimMismatch) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kBatch, kQHeads, 16});
  ExpectRejected(ErrorKind::kShape,
                 "head_dim of Q must be the same as that of K/V. Got 16 and 8. Q, K and V must "
                 "share one head_dim: q.shape[2] == k_pages.shape[3].");
}

TEST_F(ValidatePagedAttentionTest, PagesPerSequenceNotDivisibleByPagesPerComputeBlock) {
  options_.pages_per_compute_block = 3;
  ExpectRejected(ErrorKind::kBlockSize,
                 "pages_per_sequence=4 must be divisible by pages_per_compute_block=3. Pass a "
                 "divisor of pages_per_sequence = page_indices.shape[1].");
}

TEST_F(ValidatePagedAttentionTest, LengthsBatchMismatch) {
  lengths_ = TensorView(lengths_data_.data(), DType::kI32, {3});
  ExpectRejected(ErrorKind::kShape,
                 "`lengths` and `q` must have the same batch size. Give lengths one entry per row "
                 "of q (2); got lengths.shape=(3,).");
}

TEST_F(ValidatePagedAttentionTest, LengthsRank2) {
  lengths_ = TensorView(lengths_data_.data(), DType::kI32, {kBatch, 1});
  ExpectRejected(ErrorKind::kShape,
                 "`lengths` and `q` must have the same batch size. Give lengths one entry per row "
                 "of q (2); got lengths.shape=(2, 1).");
}

TEST_F(ValidatePagedAttentionTest, PageIndicesBatchMismatch) {
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {3, kPagesPerSequence});
  ExpectRejected(ErrorKind::kShape,
                 "`page_indices` and `q` must have the same batch size. Give page_indices one row "
                 "per row of q (2); got page_indices.shape=(3, 4).");
}

TEST_F(ValidatePagedAttentionTest, LengthsInt64) {
  // JAX's own text lacks the f-prefix and prints "Got {lengths.dtype}"
  // literally; we print the dtype as the f-string would.
  lengths_ = TensorView(wide_data_.data(), DType::kI64, {kBatch});
  ExpectRejected(ErrorKind::kDtype,
                 "The dtype of `lengths` must be int32. Got int64. Cast lengths to int32.");
}

TEST_F(ValidatePagedAttentionTest, MegacoreKvHeadWithOddKvHeads) {
  k_pages_ = TensorView(k_data_.data(), DType::kF32, {1, kNumPages, kPageSize, kHeadDim});
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {1, kNumPages, kPageSize, kHeadDim});
  options_.megacore_mode = "kv_head";
  ExpectRejected(ErrorKind::kOption,
                 "number of KV heads must be even when megacore_mode is 'kv_head'. Pass "
                 "megacore_mode=None (on CPU it changes nothing).");
}

TEST_F(ValidatePagedAttentionTest, MegacoreBatchWithOddBatch) {
  SetBatch(3);
  options_.megacore_mode = "batch";
  ExpectRejected(ErrorKind::kOption,
                 "batch size must be even when megacore_mode is 'batch'. Pass megacore_mode=None "
                 "(on CPU it changes nothing).");
}

TEST_F(ValidatePagedAttentionTest, MegacoreModeUnknown) {
  options_.megacore_mode = "core";
  ExpectRejected(ErrorKind::kOption,
                 "megacore_mode must be one of ['kv_head', 'batch', None]. Got "
                 "megacore_mode='core'; pass None on CPU.");
}

// ---- Ours.

TEST_F(ValidatePagedAttentionTest, PageIndicesInt64) {
  page_indices_ = TensorView(wide_data_.data(), DType::kI64, {kBatch, kPagesPerSequence});
  ExpectRejected(ErrorKind::kDtype,
                 "The dtype of `page_indices` must be int32. Got int64. Cast page_indices to "
                 "int32.");
}

TEST_F(ValidatePagedAttentionTest, KAndVDtypesDiffer) {
  v_pages_.dtype = DType::kBF16;
  ExpectRejected(ErrorKind::kDtype,
                 "k_pages.dtype=dtype('float32') must be the same as "
                 "v_pages.dtype=dtype('bfloat16'). Store K and V in one dtype.");
}

TEST_F(ValidatePagedAttentionTest, QDtypeUnsupported) {
  q_.dtype = DType::kF8E5M2;
  ExpectRejected(ErrorKind::kDtype,
                 "q.dtype=dtype('float8_e5m2') is not supported; q must be one of float32, "
                 "bfloat16, float16. Cast q to one of these dtypes.");
}

TEST_F(ValidatePagedAttentionTest, KPagesDtypeUnsupported) {
  k_pages_.dtype = DType::kI32;
  v_pages_.dtype = DType::kI32;
  ExpectRejected(ErrorKind::kDtype,
                 "k_pages.dtype=dtype('int32') is not supported; k_pages must be one of float32, "
                 "bfloat16, float16, float8_e4m3fn, float8_e5m2, int8. Cast k_pages to one of "
                 "these dtypes.");
}

TEST_F(ValidatePagedAttentionTest, MaskValueNan) {
  options_.mask_value = NAN;
  ExpectRejected(ErrorKind::kOption,
                 "mask_value=nan must not be NaN or +inf. Pass a large negative float (JAX's "
                 "DEFAULT_MASK_VALUE is -2.381976426469702e+38) or -inf, or None for the "
                 "default.");
}

TEST_F(ValidatePagedAttentionTest, AttnLogitsSoftCapNan) {
  options_.attn_logits_soft_cap = NAN;
  ExpectRejected(ErrorKind::kOption,
                 "attn_logits_soft_cap=nan must be finite. Pass a finite float for "
                 "attn_logits_soft_cap, or None to leave it out.");
}

TEST_F(ValidatePagedAttentionTest, AttnLogitsSoftCapInf) {
  options_.attn_logits_soft_cap = INFINITY;
  ExpectRejected(ErrorKind::kOption,
                 "attn_logits_soft_cap=inf must be finite. Pass a finite float for "
                 "attn_logits_soft_cap, or None to leave it out.");
}

TEST_F(ValidatePagedAttentionTest, AttnLogitsSoftCapZero) {
  options_.attn_logits_soft_cap = 0.0;
  ExpectRejected(ErrorKind::kOption,
                 "attn_logits_soft_cap=0.0 must not be 0.0. Pass the cap c of c * tanh(logit / "
                 "c), or None for no soft cap.");
}

TEST_F(ValidatePagedAttentionTest, NumThreadsZero) {
  options_.num_threads = 0;
  ExpectRejected(ErrorKind::kOption,
                 "num_threads=0 must be positive. Pass None to use RPA_NUM_THREADS or every core, "
                 "or a thread count >= 1.");
}

TEST_F(ValidatePagedAttentionTest, QInnermostStrideNotOne) {
  q_ = TensorView(q_data_.data(), DType::kF32, {kBatch, kQHeads, kHeadDim / 2}, {32, 8, 2});
  k_pages_ = TensorView(k_data_.data(), DType::kF32, {kKvHeads, kNumPages, kPageSize, kHeadDim / 2});
  v_pages_ = TensorView(v_data_.data(), DType::kF32, {kKvHeads, kNumPages, kPageSize, kHeadDim / 2});
  ExpectRejected(ErrorKind::kLayout,
                 "q must be contiguous in its last dimension; got q.strides=(32, 8, 2) (in "
                 "elements). Pass a view of q whose last stride is 1 (other strides are free), "
                 "or a contiguous copy.");
}

TEST_F(ValidatePagedAttentionTest, KPagesInnermostStrideNotOne) {
  k_pages_.strides[3] = 3;
  ExpectRejected(ErrorKind::kLayout,
                 "k_pages must be contiguous in its last dimension; got k_pages.strides=(192, 32, "
                 "8, 3) (in elements). Pass a view of k_pages whose last stride is 1 (other "
                 "strides are free), or a contiguous copy.");
}

TEST_F(ValidatePagedAttentionTest, VPagesInnermostStrideNotOne) {
  v_pages_.strides[3] = -1;
  ExpectRejected(ErrorKind::kLayout,
                 "v_pages must be contiguous in its last dimension; got v_pages.strides=(192, 32, "
                 "8, -1) (in elements). Pass a view of v_pages whose last stride is 1 (other "
                 "strides are free), or a contiguous copy.");
}

TEST_F(ValidatePagedAttentionTest, LengthsStrideNotOne) {
  lengths_.strides[0] = 2;
  ExpectRejected(ErrorKind::kLayout,
                 "lengths must be contiguous in its last dimension; got lengths.strides=(2,) (in "
                 "elements). Pass a view of lengths whose last stride is 1 (other strides are "
                 "free), or a contiguous copy.");
}

TEST_F(ValidatePagedAttentionTest, PageIndicesInnermostStrideNotOne) {
  page_indices_.strides[1] = 2;
  ExpectRejected(ErrorKind::kLayout,
                 "page_indices must be contiguous in its last dimension; got "
                 "page_indices.strides=(4, 2) (in elements). Pass a view of page_indices whose "
                 "last stride is 1 (other strides are free), or a contiguous copy.");
}

TEST_F(ValidatePagedAttentionTest, BatchSizeAboveInt32Max) {
  // Views only: the check fires before anything is read.
  const int64_t batch = int64_t{INT32_MAX} + 1;
  q_ = TensorView(q_data_.data(), DType::kF32, {batch, kQHeads, kHeadDim});
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {batch, kQHeads, kHeadDim});
  lengths_ = TensorView(lengths_data_.data(), DType::kI32, {batch});
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {batch, kPagesPerSequence});
  ExpectRejected(ErrorKind::kShape, "batch_size=2147483648 must fit in int32. Split the batch.");
}

TEST_F(ValidatePagedAttentionTest, NegativeBatchSizeIsRejected) {
  q_ = TensorView(q_data_.data(), DType::kF32, {-2, kQHeads, kHeadDim});
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {-2, kQHeads, kHeadDim});
  lengths_ = TensorView(lengths_data_.data(), DType::kI32, {-2});
  page_indices_ = TensorView(page_indices_data_.data(), DType::kI32, {-2, kPagesPerSequence});
  std::fill(out_data_.begin(), out_data_.end(), kSentinel);
  EXPECT_THROW(Call(), Error);
}

// ---- Ours: the output view.

TEST_F(ValidatePagedAttentionTest, OutShapeMismatch) {
  out_ = MutableTensorView(out_data_.data(), DType::kF32, {3, kQHeads, kHeadDim});
  ExpectRejected(ErrorKind::kShape,
                 "out.shape=(3, 4, 8) must be the same as q.shape=(2, 4, 8). Allocate out like "
                 "q.");
}

TEST_F(ValidatePagedAttentionTest, OutDtypeMismatch) {
  out_.dtype = DType::kF16;
  ExpectRejected(ErrorKind::kDtype,
                 "out.dtype=dtype('float16') must be the same as q.dtype=dtype('float32'). "
                 "Allocate out like q.");
}

TEST_F(ValidatePagedAttentionTest, OutInnermostStrideNotOne) {
  out_.strides[2] = 4;
  ExpectRejected(ErrorKind::kLayout,
                 "out must be contiguous in its last dimension; got out.strides=(32, 8, 4) (in "
                 "elements). Pass a view of out whose last stride is 1 (other strides are free), "
                 "or a contiguous copy.");
}

// ---- Dynamic checks, in paged_attention's names.

TEST_F(ValidatePagedAttentionTest, LengthNegative) {
  lengths_data_[1] = -1;
  ExpectRejected(ErrorKind::kMetadata,
                 "lengths[1]=-1 must be greater or equal to 0. lengths holds each sequence's "
                 "number of tokens in the cache.");
}

TEST_F(ValidatePagedAttentionTest, PagesPerSequenceTooSmall) {
  lengths_data_[0] = 17;  // ceil(17 / 4) = 5 > 4 columns.
  ExpectRejected(ErrorKind::kMetadata,
                 "pages_per_sequence=4 must be greater or equal to min_pages_per_sequence=5 given "
                 "max_kv_len=17 and page_size=4. Widen page_indices to ceil(max_kv_len / "
                 "page_size) columns, or shorten the sequences.");
}

TEST_F(ValidatePagedAttentionTest, PagesPerSequenceTooSmallLengthInt32Max) {
  lengths_data_[1] = INT32_MAX;
  ExpectRejected(ErrorKind::kMetadata,
                 "pages_per_sequence=4 must be greater or equal to "
                 "min_pages_per_sequence=536870912 given max_kv_len=2147483647 and page_size=4. "
                 "Widen page_indices to ceil(max_kv_len / page_size) columns, or shorten the "
                 "sequences.");
}

TEST_F(ValidatePagedAttentionTest, PageIndexEqualsTotalNumPages) {
  page_indices_data_[1] = 6;
  ExpectRejected(ErrorKind::kPageIndex,
                 "page_indices[0, 1]=6 must be in range [0, total_num_pages=6) because sequence "
                 "0 reads it (lengths[0]=5, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
}

TEST_F(ValidatePagedAttentionTest, PageIndexMinusOne) {
  page_indices_data_[4] = -1;
  ExpectRejected(ErrorKind::kPageIndex,
                 "page_indices[1, 0]=-1 must be in range [0, total_num_pages=6) because sequence "
                 "1 reads it (lengths[1]=3, page_size=4). Point every page a sequence's kv_len "
                 "covers at a page of the cache; columns beyond ceil(kv_len / page_size) are "
                 "never read and may hold anything.");
}

}  // namespace
}  // namespace rpa
