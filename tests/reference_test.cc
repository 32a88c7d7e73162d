// Hand-computed small cases for the semantics of docs/contract.md §1. Each runs through
// the reference (RefRaggedPagedAttention) and the production entry point
// (RaggedPagedAttention); both must match the value worked out by hand: the
// reference to the output dtype's rounding, the production path also within
// the contract's tolerance (docs/contract.md §1) for the KV dtype.
//
// Every K/V slot a case does not set holds NaN, so any read beyond kv_len or
// into an unused page shows up as a NaN in the output.
#include "rpa/reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "rpa/attention.h"
#include "rpa/dtype.h"
#include "rpa/options.h"
#include "rpa/tensor.h"
#include "testing/tolerance.h"

namespace rpa {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One call's inputs in f32, combined layout, built by hand.
struct HandCase {
  int64_t num_q_heads = 1;
  int64_t num_kv_heads = 1;
  int64_t head_dim = 2;
  int64_t page_size = 4;
  int64_t num_pages = 3;
  int64_t pages_per_seq = 2;
  int64_t max_num_seqs = 1;
  int64_t num_tokens = 1;

  std::vector<float> q;               // [num_tokens, num_q_heads, head_dim]
  std::vector<float> kv;              // [num_pages, page_size, 2 * num_kv_heads, head_dim]
  std::vector<int32_t> kv_lens;       // [max_num_seqs]
  std::vector<int32_t> page_indices;  // [max_num_seqs, pages_per_seq]
  std::vector<int32_t> cu_q_lens;     // [max_num_seqs + 1]
  int32_t num_seqs = 1;

  // Allocates: q zero, K/V NaN, page table garbage, lengths zero.
  void Init() {
    q.assign(static_cast<size_t>(num_tokens * num_q_heads * head_dim), 0.0f);
    kv.assign(static_cast<size_t>(num_pages * page_size * 2 * num_kv_heads * head_dim), kNaN);
    kv_lens.assign(static_cast<size_t>(max_num_seqs), 0);
    page_indices.assign(static_cast<size_t>(max_num_seqs * pages_per_seq), 0);
    for (size_t i = 0; i < page_indices.size(); ++i) {
      page_indices[i] = static_cast<int32_t>(i % 2 ? -7 - i : 1000003 + i);  // Out of range.
    }
    cu_q_lens.assign(static_cast<size_t>(max_num_seqs + 1), 0);
  }
  void SetQ(int64_t token, int64_t head, std::initializer_list<float> row) {
    int64_t d = 0;
    for (float x : row) q[(token * num_q_heads + head) * head_dim + d++] = x;
  }
  // Combined head 2h is K of kv head h, 2h + 1 its V.
  void SetSlot(int64_t page, int64_t slot, int64_t combined_head,
               std::initializer_list<float> row) {
    int64_t d = 0;
    for (float x : row) {
      kv[((page * page_size + slot) * 2 * num_kv_heads + combined_head) * head_dim + d++] = x;
    }
  }
  // Key t of sequence seq, through the page table.
  void SetKeyValue(int64_t seq, int64_t t, int64_t kv_head, std::initializer_list<float> k,
                   std::initializer_list<float> v) {
    const int64_t page = page_indices[seq * pages_per_seq + t / page_size];
    SetSlot(page, t % page_size, 2 * kv_head, k);
    SetSlot(page, t % page_size, 2 * kv_head + 1, v);
  }
};

struct Outputs {
  std::vector<float> ref;
  std::vector<float> prod;
};

// Runs both paths with q in q_dtype and K/V stored in kv_dtype (as x / scale
// when options give a scale); `out` starts filled with `fill`.
Outputs RunBoth(const HandCase& c, const AttentionOptions& options, DType q_dtype = DType::kF32,
                DType kv_dtype = DType::kF32, float fill = 12345.0f) {
  std::vector<uint8_t> q(c.q.size() * SizeOf(q_dtype));
  for (size_t i = 0; i < c.q.size(); ++i) StoreFromF32(q_dtype, q.data(), i, c.q[i]);
  std::vector<uint8_t> kv(c.kv.size() * SizeOf(kv_dtype));
  const float k_scale = static_cast<float>(options.k_scale.value_or(1.0));
  const float v_scale = static_cast<float>(options.v_scale.value_or(1.0));
  for (size_t i = 0; i < c.kv.size(); ++i) {
    const bool is_v = (i / static_cast<size_t>(c.head_dim)) % 2 == 1;
    StoreFromF32(kv_dtype, kv.data(), i, c.kv[i] / (is_v ? v_scale : k_scale));
  }
  const TensorView q_view(q.data(), q_dtype, {c.num_tokens, c.num_q_heads, c.head_dim});
  const TensorView kv_view(kv.data(), kv_dtype,
                           {c.num_pages, c.page_size, 2 * c.num_kv_heads, c.head_dim});
  const TensorView kv_lens(c.kv_lens.data(), DType::kI32, {c.max_num_seqs});
  const TensorView page_indices(c.page_indices.data(), DType::kI32,
                                {c.max_num_seqs, c.pages_per_seq});
  const TensorView cu_q_lens(c.cu_q_lens.data(), DType::kI32, {c.max_num_seqs + 1});
  const TensorView num_seqs(&c.num_seqs, DType::kI32, {1});

  Outputs result;
  for (int path = 0; path < 2; ++path) {
    std::vector<uint8_t> out(q.size());
    for (size_t i = 0; i < c.q.size(); ++i) StoreFromF32(q_dtype, out.data(), i, fill);
    const MutableTensorView out_view(out.data(), q_dtype,
                                     {c.num_tokens, c.num_q_heads, c.head_dim});
    if (path == 0) {
      RefRaggedPagedAttention(q_view, kv_view,
                              PageTable{kv_lens, page_indices, cu_q_lens, num_seqs}, options,
                              out_view);
    } else {
      RaggedPagedAttention(q_view, kv_view, PageTable{kv_lens, page_indices, cu_q_lens, num_seqs},
                           options, out_view);
    }
    std::vector<float>& decoded = path == 0 ? result.ref : result.prod;
    decoded.resize(c.q.size());
    for (size_t i = 0; i < c.q.size(); ++i) decoded[i] = LoadAsF32(q_dtype, out.data(), i);
  }
  return result;
}

// Compares a whole output with the expected one; prints the first few
// mismatches as (token, head, d).
void ExpectNear(const HandCase& c, const std::vector<float>& got,
                const std::vector<double>& expected, double tolerance, const std::string& label) {
  ASSERT_EQ(got.size(), expected.size());
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - expected[i]);
    if (!(diff <= tolerance)) {
      if (++mismatches <= 5) {
        const int64_t d = static_cast<int64_t>(i) % c.head_dim;
        const int64_t head = static_cast<int64_t>(i) / c.head_dim % c.num_q_heads;
        const int64_t token = static_cast<int64_t>(i) / c.head_dim / c.num_q_heads;
        ADD_FAILURE() << label << ": out[" << token << ", " << head << ", " << d << "] = " << got[i]
                      << ", expected " << expected[i] << " (tolerance " << tolerance << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << label;
}

// Rounding of an output of magnitude <= 4 written in q's dtype.
double OutputRounding(DType q_dtype) {
  switch (q_dtype) {
    case DType::kF32:
      return 1e-6;
    case DType::kBF16:
      return 4.0 * std::ldexp(1.0, -8);
    default:
      return 4.0 * std::ldexp(1.0, -11);
  }
}

void Check(const HandCase& c, const AttentionOptions& options, const std::vector<double>& expected,
           DType q_dtype = DType::kF32, DType kv_dtype = DType::kF32) {
  const Outputs out = RunBoth(c, options, q_dtype, kv_dtype);
  const double ref_tolerance = OutputRounding(q_dtype);
  ExpectNear(c, out.ref, expected, ref_tolerance, "reference");
  ExpectNear(c, out.prod, expected, ref_tolerance + testing::KvTolerance(kv_dtype), "production");
}

// sum_t softmax(logits)_t * values[t], in double.
std::vector<double> Attend(const std::vector<double>& logits,
                           const std::vector<std::vector<double>>& values) {
  double max = -INFINITY;
  for (double l : logits) max = std::max(max, l);
  double sum = 0.0;
  std::vector<double> acc(values[0].size(), 0.0);
  for (size_t t = 0; t < logits.size(); ++t) {
    const double w = std::exp(logits[t] - max);
    sum += w;
    for (size_t d = 0; d < acc.size(); ++d) acc[d] += w * values[t][d];
  }
  for (double& a : acc) a /= sum;
  return acc;
}

// The expected output: all zeros, with rows filled in by Put.
struct Expected {
  const HandCase& c;
  std::vector<double> values;
  explicit Expected(const HandCase& hand_case) : c(hand_case), values(hand_case.q.size(), 0.0) {}
  void Put(int64_t token, int64_t head, const std::vector<double>& row) {
    for (size_t d = 0; d < row.size(); ++d) {
      values[(token * c.num_q_heads + head) * c.head_dim + static_cast<int64_t>(d)] = row[d];
    }
  }
};

// One sequence of q_len tokens over kv_len keys, one head of head_dim d,
// pages in a scattered order.
HandCase OneSequence(int64_t q_len, int64_t kv_len, int64_t head_dim, int64_t page_size) {
  HandCase c;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.pages_per_seq = (kv_len + page_size - 1) / page_size + 1;  // One spare column.
  c.num_pages = c.pages_per_seq + 2;
  c.num_tokens = q_len;
  c.Init();
  c.kv_lens[0] = static_cast<int32_t>(kv_len);
  c.cu_q_lens = {0, static_cast<int32_t>(q_len)};
  for (int64_t col = 0; col * page_size < kv_len; ++col) {
    c.page_indices[col] = static_cast<int32_t>(c.num_pages - 1 - col);  // Reversed order.
  }
  return c;
}

// ------------------------------------------------------------- basic softmax

TEST(ReferenceHand, SingleKeyOutputIsItsValue) {
  HandCase c = OneSequence(1, 1, 3, 4);
  c.SetQ(0, 0, {0.3f, -1.0f, 2.0f});
  c.SetKeyValue(0, 0, 0, {5.0f, 1.0f, -2.0f}, {1.5f, -2.25f, 0.125f});
  Expected e(c);
  e.Put(0, 0, {1.5, -2.25, 0.125});
  Check(c, {}, e.values);
}

TEST(ReferenceHand, TwoKeysSoftmaxByHand) {
  HandCase c = OneSequence(1, 2, 2, 4);
  c.SetQ(0, 0, {1.0f, 0.0f});
  c.SetKeyValue(0, 0, 0, {1.0f, 5.0f}, {1.0f, 0.0f});   // logit 1
  c.SetKeyValue(0, 1, 0, {2.0f, -3.0f}, {0.0f, 1.0f});  // logit 2
  Expected e(c);
  const double e1 = std::exp(1.0);
  e.Put(0, 0, {1.0 / (1.0 + e1), e1 / (1.0 + e1)});
  Check(c, {}, e.values);
}

TEST(ReferenceHand, SmScaleMultipliesLogits) {
  HandCase c = OneSequence(1, 2, 2, 1);  // page_size 1: each key its own page.
  c.SetQ(0, 0, {1.0f, 1.0f});
  c.SetKeyValue(0, 0, 0, {1.0f, 1.0f}, {2.0f, 0.0f});   // dot 2
  c.SetKeyValue(0, 1, 0, {3.0f, 1.0f}, {0.0f, -4.0f});  // dot 4
  AttentionOptions options;
  options.sm_scale = 0.25;  // logits 0.5, 1
  Expected e(c);
  e.Put(0, 0, Attend({0.5, 1.0}, {{2, 0}, {0, -4}}));
  Check(c, options, e.values);
}

// ---------------------------------------------------------------- causality

// kv_len 5, q_len 2: row j sits at position 3 + j and sees keys 0..3+j.
// Page size 2: keys spread over three scattered pages.
TEST(ReferenceHand, CausalOffsetWhenQLenBelowKvLen) {
  HandCase c = OneSequence(2, 5, 5, 2);
  c.SetQ(0, 0, {1, 0, 0, 0, 0});
  c.SetQ(1, 0, {1, 0, 0, 0, 0});
  std::vector<std::vector<double>> v(5, std::vector<double>(5, 0.0));
  for (int t = 0; t < 5; ++t) {
    v[t][t] = 1.0;  // One-hot values: the output row is the weights.
    const float k0 = 0.5f * static_cast<float>(t);
    c.SetKeyValue(0, t, 0, {k0, 9, 9, 9, 9},
                  {t == 0 ? 1.f : 0.f, t == 1 ? 1.f : 0.f, t == 2 ? 1.f : 0.f, t == 3 ? 1.f : 0.f,
                   t == 4 ? 1.f : 0.f});
  }
  Expected e(c);
  e.Put(0, 0, Attend({0, 0.5, 1.0, 1.5}, {v[0], v[1], v[2], v[3]}));  // Key 4 masked.
  e.Put(1, 0, Attend({0, 0.5, 1.0, 1.5, 2.0}, v));
  Check(c, {}, e.values);
}

// Full prefill: row j sees keys 0..j.
TEST(ReferenceHand, CausalFullPrefill) {
  HandCase c = OneSequence(3, 3, 1, 2);
  for (int j = 0; j < 3; ++j) c.SetQ(j, 0, {1.0f});
  c.SetKeyValue(0, 0, 0, {0.0f}, {1.0f});
  c.SetKeyValue(0, 1, 0, {1.0f}, {2.0f});
  c.SetKeyValue(0, 2, 0, {2.0f}, {4.0f});
  Expected e(c);
  e.Put(0, 0, {1.0});
  e.Put(1, 0, Attend({0, 1}, {{1}, {2}}));
  e.Put(2, 0, Attend({0, 1, 2}, {{1}, {2}, {4}}));
  Check(c, {}, e.values);
}

// ------------------------------------------------------------ sliding window

HandCase WindowCase() {
  // Full prefill of 4 tokens; key t has logit t / 2 for every row and value t.
  HandCase c = OneSequence(4, 4, 2, 3);
  for (int j = 0; j < 4; ++j) c.SetQ(j, 0, {1.0f, 0.0f});
  for (int t = 0; t < 4; ++t) {
    c.SetKeyValue(0, t, 0, {0.5f * static_cast<float>(t), 1.0f}, {static_cast<float>(t), 1.0f});
  }
  return c;
}

std::vector<double> WindowRow(int j, int w) {
  std::vector<double> logits;
  std::vector<std::vector<double>> values;
  for (int t = 0; t <= j; ++t) {
    if (t <= j - w) continue;
    logits.push_back(0.5 * t);
    values.push_back({static_cast<double>(t), 1.0});
  }
  return Attend(logits, values);
}

TEST(ReferenceHand, SlidingWindowOneSeesOnlyOwnKey) {
  const HandCase c = WindowCase();
  AttentionOptions options;
  options.sliding_window = 1;
  Expected e(c);
  for (int j = 0; j < 4; ++j) e.Put(j, 0, {static_cast<double>(j), 1.0});
  Check(c, options, e.values);
}

TEST(ReferenceHand, SlidingWindowTwoSeesOwnAndPrevious) {
  const HandCase c = WindowCase();
  AttentionOptions options;
  options.sliding_window = 2;
  Expected e(c);
  for (int j = 0; j < 4; ++j) e.Put(j, 0, WindowRow(j, 2));
  Check(c, options, e.values);
}

TEST(ReferenceHand, SlidingWindowAtLeastKvLenHasNoEffect) {
  const HandCase c = WindowCase();
  Expected e(c);
  for (int j = 0; j < 4; ++j) e.Put(j, 0, WindowRow(j, 1000));
  for (int64_t w : {4, 5, 1 << 30}) {
    SCOPED_TRACE("sliding_window=" + std::to_string(w));
    AttentionOptions options;
    options.sliding_window = w;
    Check(c, options, e.values);
  }
  Check(c, {}, e.values);
}

// Chunked prefill with a window: position p = kv_len - q_len + j.
TEST(ReferenceHand, SlidingWindowWithCausalOffset) {
  HandCase c = OneSequence(1, 4, 2, 2);
  c.SetQ(0, 0, {1.0f, 0.0f});
  for (int t = 0; t < 4; ++t) {
    c.SetKeyValue(0, t, 0, {0.5f * static_cast<float>(t), 1.0f}, {static_cast<float>(t), 1.0f});
  }
  AttentionOptions options;
  options.sliding_window = 3;  // p = 3: keys 1..3.
  Expected e(c);
  e.Put(0, 0, Attend({0.5, 1.0, 1.5}, {{1, 1}, {2, 1}, {3, 1}}));
  Check(c, options, e.values);
}

// ------------------------------------------------------------------ soft cap

TEST(ReferenceHand, SoftCapAppliesAfterSmScale) {
  HandCase c = OneSequence(1, 2, 2, 4);
  c.SetQ(0, 0, {1.0f, 0.0f});
  c.SetKeyValue(0, 0, 0, {3.0f, 0.0f}, {1.0f, 0.0f});
  c.SetKeyValue(0, 1, 0, {-1.0f, 0.0f}, {0.0f, 1.0f});
  AttentionOptions options;
  options.sm_scale = 2.0;
  options.soft_cap = 5.0;
  // logits 6 and -2, capped: 5 tanh(1.2) and 5 tanh(-0.4).
  Expected e(c);
  e.Put(0, 0, Attend({5 * std::tanh(1.2), 5 * std::tanh(-0.4)}, {{1, 0}, {0, 1}}));
  Check(c, options, e.values);
}

TEST(ReferenceHand, SoftCapThenMask) {
  // Masked key's capped logit plus a small mask: c * tanh(x / c) + m.
  HandCase c = OneSequence(1, 2, 1, 2);
  c.kv_lens[0] = 2;
  c.SetQ(0, 0, {1.0f});
  c.SetKeyValue(0, 0, 0, {2.0f}, {1.0f});
  c.SetKeyValue(0, 1, 0, {4.0f}, {-1.0f});
  // q_len 1, kv_len 2: position 1, nothing masked. Use a window of 1 to mask key 0.
  AttentionOptions options;
  options.soft_cap = 3.0;
  options.sliding_window = 1;
  options.mask_value = -1.0;
  Expected e(c);
  e.Put(0, 0, Attend({3 * std::tanh(2.0 / 3) - 1.0, 3 * std::tanh(4.0 / 3)}, {{1}, {-1}}));
  Check(c, options, e.values);
}

// ---------------------------------------------------------------- mask value

HandCase MaskCase() {
  // kv_len 3, q_len 2: row 0 (position 1) has key 2 masked; row 1 sees all.
  HandCase c = OneSequence(2, 3, 2, 2);
  c.SetQ(0, 0, {1.0f, 0.0f});
  c.SetQ(1, 0, {0.0f, 1.0f});
  c.SetKeyValue(0, 0, 0, {0.0f, 1.0f}, {1.0f, 0.0f});
  c.SetKeyValue(0, 1, 0, {1.0f, 0.0f}, {0.0f, 1.0f});
  c.SetKeyValue(0, 2, 0, {2.0f, -1.0f}, {1.0f, 1.0f});
  return c;
}

TEST(ReferenceHand, SmallMaskValueIsAdditive) {
  const HandCase c = MaskCase();
  AttentionOptions options;
  options.mask_value = -2.0;
  Expected e(c);
  // Row 0 logits (0, 1, 2): key 2 masked takes part with exp(2 - 2).
  e.Put(0, 0, Attend({0.0, 1.0, 2.0 - 2.0}, {{1, 0}, {0, 1}, {1, 1}}));
  e.Put(1, 0, Attend({1.0, 0.0, -1.0}, {{1, 0}, {0, 1}, {1, 1}}));
  Check(c, options, e.values);
}

TEST(ReferenceHand, PositiveMaskValueIsAdditiveToo) {
  const HandCase c = MaskCase();
  AttentionOptions options;
  options.mask_value = 0.5;
  Expected e(c);
  e.Put(0, 0, Attend({0.0, 1.0, 2.5}, {{1, 0}, {0, 1}, {1, 1}}));
  e.Put(1, 0, Attend({1.0, 0.0, -1.0}, {{1, 0}, {0, 1}, {1, 1}}));
  Check(c, options, e.values);
}

TEST(ReferenceHand, LargeMaskValuesRemoveMaskedKeys) {
  const HandCase c = MaskCase();
  Expected e(c);
  e.Put(0, 0, Attend({0.0, 1.0}, {{1, 0}, {0, 1}}));
  e.Put(1, 0, Attend({1.0, 0.0, -1.0}, {{1, 0}, {0, 1}, {1, 1}}));
  SCOPED_TRACE("default mask_value");
  Check(c, {}, e.values);
  for (double mask : {-1e4, -1e30, kDefaultMaskValue, -static_cast<double>(INFINITY)}) {
    SCOPED_TRACE("mask_value=" + std::to_string(mask));
    AttentionOptions options;
    options.mask_value = mask;
    Check(c, options, e.values);
  }
}

// ------------------------------------------------------------------ scales

TEST(ReferenceHand, KScaleAndVScaleMultiplyStoredValues) {
  HandCase c = OneSequence(1, 2, 2, 4);
  c.SetQ(0, 0, {1.0f, 0.0f});
  // Logical K/V (RunBoth stores them divided by the scale).
  c.SetKeyValue(0, 0, 0, {1.0f, 0.0f}, {2.0f, 0.0f});
  c.SetKeyValue(0, 1, 0, {-1.0f, 0.0f}, {0.0f, 3.0f});
  AttentionOptions options;
  options.k_scale = 0.5;
  options.v_scale = 4.0;
  Expected e(c);
  e.Put(0, 0, Attend({1.0, -1.0}, {{2, 0}, {0, 3}}));
  Check(c, options, e.values);
}

// Scales apply to what is stored: stored K = (2, 0), (-2, 0) and V = (0.5, 0),
// (0, 0.75) with k_scale 0.5 and v_scale 4 give the same result as above.
TEST(ReferenceHand, ScalesApplyAfterConversion) {
  HandCase c = OneSequence(1, 2, 2, 4);
  c.SetQ(0, 0, {1.0f, 0.0f});
  c.SetKeyValue(0, 0, 0, {2.0f, 0.0f}, {0.5f, 0.0f});
  c.SetKeyValue(0, 1, 0, {-2.0f, 0.0f}, {0.0f, 0.75f});
  Expected stored(c);
  stored.Put(0, 0, Attend({2.0, -2.0}, {{0.5, 0}, {0, 0.75}}));
  Check(c, {}, stored.values);  // No scales: the stored values as they are.
}

// --------------------------------------------------------------------- GQA

// 4 q heads over 2 kv heads: q heads 0, 1 read kv head 0; 2, 3 kv head 1.
TEST(ReferenceHand, GqaHeadMapping) {
  HandCase c = OneSequence(1, 2, 2, 2);
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  const std::vector<int32_t> pages = c.page_indices;
  c.Init();
  c.page_indices = pages;
  c.kv_lens[0] = 2;
  c.cu_q_lens = {0, 1};
  for (int h = 0; h < 4; ++h) c.SetQ(0, h, {1.0f, static_cast<float>(h)});
  // kv head 0: logits q·k = (0, 1) for q (1, h): k0 = (0, 0), k1 = (1, 0).
  c.SetKeyValue(0, 0, 0, {0.0f, 0.0f}, {1.0f, 0.0f});
  c.SetKeyValue(0, 1, 0, {1.0f, 0.0f}, {0.0f, 1.0f});
  // kv head 1: k0 = (2, 0), k1 = (0, 0.5); values 10x.
  c.SetKeyValue(0, 0, 1, {2.0f, 0.0f}, {10.0f, 0.0f});
  c.SetKeyValue(0, 1, 1, {0.0f, 0.5f}, {0.0f, 10.0f});
  Expected e(c);
  for (int h = 0; h < 2; ++h) e.Put(0, h, Attend({0.0, 1.0}, {{1, 0}, {0, 1}}));
  for (int h = 2; h < 4; ++h) e.Put(0, h, Attend({2.0, 0.5 * h}, {{10, 0}, {0, 10}}));
  Check(c, {}, e.values);
}

// MQA: 3 q heads share the one kv head.
TEST(ReferenceHand, MqaAllHeadsShareOneKvHead) {
  HandCase c = OneSequence(1, 2, 1, 4);
  c.num_q_heads = 3;
  const std::vector<int32_t> pages = c.page_indices;
  c.Init();
  c.page_indices = pages;
  c.kv_lens[0] = 2;
  c.cu_q_lens = {0, 1};
  for (int h = 0; h < 3; ++h) c.SetQ(0, h, {static_cast<float>(h)});
  c.SetKeyValue(0, 0, 0, {0.0f}, {1.0f});
  c.SetKeyValue(0, 1, 0, {1.0f}, {-1.0f});
  Expected e(c);
  for (int h = 0; h < 3; ++h) e.Put(0, h, Attend({0.0, static_cast<double>(h)}, {{1}, {-1}}));
  Check(c, {}, e.values);
}

// --------------------------------------------------- poison beyond kv_len

TEST(ReferenceHand, NaNBeyondKvLenAndInUnusedPagesIsIgnored) {
  // kv_len 5 over pages of 4: slots 1..3 of the second page and two whole
  // pages hold NaN (Init); also +-inf there.
  HandCase c = OneSequence(2, 5, 2, 4);
  c.SetQ(0, 0, {1.0f, -1.0f});
  c.SetQ(1, 0, {0.5f, 2.0f});
  for (int t = 0; t < 5; ++t) {
    c.SetKeyValue(0, t, 0, {0.25f * static_cast<float>(t), -0.5f},
                  {static_cast<float>(t), static_cast<float>(t * t)});
  }
  const int64_t last_page = c.page_indices[1];
  c.SetSlot(last_page, 2, 0, {INFINITY, -INFINITY});
  c.SetSlot(last_page, 3, 1, {-INFINITY, INFINITY});
  std::vector<std::vector<double>> values;
  std::vector<double> logits0, logits1;
  for (int t = 0; t < 5; ++t) {
    values.push_back({static_cast<double>(t), static_cast<double>(t * t)});
    logits0.push_back(0.25 * t + 0.5);
    logits1.push_back(0.125 * t - 1.0);
  }
  Expected e(c);
  e.Put(0, 0,
        Attend(std::vector<double>(logits0.begin(), logits0.end() - 1),
               std::vector<std::vector<double>>(values.begin(), values.end() - 1)));
  e.Put(1, 0, Attend(logits1, values));
  Check(c, {}, e.values);

  // Bit-identical to the same call with zeros in place of the poison.
  HandCase clean = c;
  for (float& x : clean.kv) {
    if (!std::isfinite(x)) x = 0.0f;
  }
  const Outputs poisoned = RunBoth(c, {});
  const Outputs zeros = RunBoth(clean, {});
  for (size_t i = 0; i < poisoned.ref.size(); ++i) {
    EXPECT_TRUE(std::isfinite(poisoned.ref[i]) && std::isfinite(poisoned.prod[i])) << i;
    EXPECT_EQ(poisoned.ref[i], zeros.ref[i]) << i;
    EXPECT_EQ(poisoned.prod[i], zeros.prod[i]) << i;
  }
}

TEST(ReferenceHand, GarbagePageTableBeyondUsedPages) {
  // pages_per_seq 5 but kv_len 3 over pages of 2: columns 2..4 are garbage.
  HandCase c;
  c.head_dim = 2;
  c.page_size = 2;
  c.pages_per_seq = 5;
  c.num_pages = 3;
  c.Init();
  c.kv_lens[0] = 3;
  c.cu_q_lens = {0, 1};
  c.page_indices = {2, 0, -1, 2147483647, -2147483647 - 1};
  c.SetQ(0, 0, {1.0f, 1.0f});
  c.SetKeyValue(0, 0, 0, {1.0f, 0.0f}, {1.0f, 0.0f});
  c.SetKeyValue(0, 1, 0, {0.0f, 0.0f}, {0.0f, 1.0f});
  c.SetKeyValue(0, 2, 0, {0.0f, -1.0f}, {1.0f, 1.0f});
  Expected e(c);
  e.Put(0, 0, Attend({1.0, 0.0, -1.0}, {{1, 0}, {0, 1}, {1, 1}}));
  Check(c, {}, e.values);
}

// Two sequences reading the same physical page (prefix sharing).
TEST(ReferenceHand, SequencesMayShareAPage) {
  HandCase c;
  c.head_dim = 1;
  c.page_size = 2;
  c.pages_per_seq = 2;
  c.num_pages = 2;
  c.max_num_seqs = 2;
  c.num_tokens = 2;
  c.Init();
  c.num_seqs = 2;
  c.kv_lens = {2, 3};
  c.cu_q_lens = {0, 1, 2};
  c.page_indices = {1, 99, 1, 0};
  for (int j = 0; j < 2; ++j) c.SetQ(j, 0, {1.0f});
  c.SetKeyValue(0, 0, 0, {0.0f}, {1.0f});
  c.SetKeyValue(0, 1, 0, {1.0f}, {2.0f});
  c.SetKeyValue(1, 2, 0, {2.0f}, {3.0f});
  Expected e(c);
  e.Put(0, 0, Attend({0, 1}, {{1}, {2}}));
  e.Put(1, 0, Attend({0, 1, 2}, {{1}, {2}, {3}}));
  Check(c, {}, e.values);
}

// ------------------------------------------------- empty and idle sequences

// Three sequences: the middle one has q_len 0 (kv_len 3); rows of its
// neighbours are exact and it owns no row.
TEST(ReferenceHand, QLenZeroSequenceBetweenNeighbours) {
  HandCase c;
  c.head_dim = 1;
  c.page_size = 2;
  c.pages_per_seq = 2;
  c.num_pages = 5;
  c.max_num_seqs = 3;
  c.num_tokens = 2;
  c.Init();
  c.num_seqs = 3;
  c.kv_lens = {1, 3, 2};
  c.cu_q_lens = {0, 1, 1, 2};
  c.page_indices = {4, -5, 0, 1, 3, 77};
  c.SetQ(0, 0, {1.0f});
  c.SetQ(1, 0, {2.0f});
  c.SetKeyValue(0, 0, 0, {1.0f}, {7.0f});
  for (int t = 0; t < 3; ++t) c.SetKeyValue(1, t, 0, {1.0f}, {-100.0f});
  c.SetKeyValue(2, 0, 0, {0.5f}, {1.0f});
  c.SetKeyValue(2, 1, 0, {-0.5f}, {-1.0f});
  Expected e(c);
  e.Put(0, 0, {7.0});
  e.Put(1, 0, Attend({1.0, -1.0}, {{1}, {-1}}));
  Check(c, {}, e.values);
}

TEST(ReferenceHand, KvLenZeroWithQLenZero) {
  HandCase c;
  c.head_dim = 2;
  c.page_size = 3;
  c.pages_per_seq = 1;
  c.num_pages = 2;
  c.max_num_seqs = 3;
  c.num_tokens = 2;
  c.Init();
  c.num_seqs = 3;
  c.kv_lens = {0, 1, 0};
  c.cu_q_lens = {0, 0, 1, 1};
  c.page_indices = {-1, 1, 123456};  // Sequences 0 and 2 read no page.
  c.SetQ(0, 0, {1.0f, 2.0f});
  c.SetQ(1, 0, {3.0f, 4.0f});  // Padding row.
  c.SetKeyValue(1, 0, 0, {1.0f, 1.0f}, {0.5f, -0.5f});
  Expected e(c);
  e.Put(0, 0, {0.5, -0.5});
  Check(c, {}, e.values);
}

TEST(ReferenceHand, NumSeqsZeroGivesAllZeros) {
  HandCase c;
  c.head_dim = 3;
  c.num_q_heads = 2;
  c.page_size = 2;
  c.pages_per_seq = 2;
  c.num_pages = 2;
  c.max_num_seqs = 2;
  c.num_tokens = 3;
  c.Init();
  c.num_seqs = 0;
  // Idle entries hold values that would be errors for a live sequence.
  c.kv_lens = {1000, -3};
  c.cu_q_lens = {0, 5, 1};
  for (float& x : c.q) x = 1.0f;
  Expected e(c);
  for (float fill : {12345.0f, kNaN, -INFINITY}) {
    SCOPED_TRACE("out filled with " + std::to_string(fill));
    const Outputs out = RunBoth(c, {}, DType::kF32, DType::kF32, fill);
    ExpectNear(c, out.ref, e.values, 0.0, "reference");
    ExpectNear(c, out.prod, e.values, 0.0, "production");
  }
  for (DType q_dtype : {DType::kBF16, DType::kF16}) {
    const Outputs out = RunBoth(c, {}, q_dtype, DType::kBF16, kNaN);
    ExpectNear(c, out.ref, e.values, 0.0,
               std::string("reference ") + std::string(ToString(q_dtype)));
    ExpectNear(c, out.prod, e.values, 0.0,
               std::string("production ") + std::string(ToString(q_dtype)));
  }
}

// Rows before cu_q_lens[0] and at or beyond cu_q_lens[num_seqs] are zero.
TEST(ReferenceHand, PaddingRowsBeforeAndAfterAreZero) {
  HandCase c;
  c.head_dim = 2;
  c.num_q_heads = 2;
  c.page_size = 2;
  c.pages_per_seq = 1;
  c.num_pages = 2;
  c.max_num_seqs = 2;
  c.num_tokens = 6;
  c.Init();
  c.num_seqs = 2;
  c.kv_lens = {1, 2};
  c.cu_q_lens = {2, 3, 4};  // Rows 0, 1 before; rows 4, 5 after.
  c.page_indices = {1, 0};
  for (float& x : c.q) x = 1.0f;
  c.SetKeyValue(0, 0, 0, {1.0f, 1.0f}, {3.0f, -3.0f});
  c.SetKeyValue(1, 0, 0, {0.0f, 0.0f}, {1.0f, 0.0f});
  c.SetKeyValue(1, 1, 0, {1.0f, 0.0f}, {0.0f, 1.0f});
  Expected e(c);
  for (int h = 0; h < 2; ++h) {
    e.Put(2, h, {3.0, -3.0});
    e.Put(3, h, Attend({0.0, 1.0}, {{1, 0}, {0, 1}}));
  }
  Check(c, {}, e.values);  // RunBoth pre-fills the output with garbage.
}

// Sequences at or beyond num_seqs are ignored, even when their cu_q_lens
// would claim rows and their kv_lens / page table are garbage.
TEST(ReferenceHand, IdleSequencesBeyondNumSeqsIgnored) {
  HandCase c;
  c.head_dim = 1;
  c.page_size = 1;
  c.pages_per_seq = 2;
  c.num_pages = 2;
  c.max_num_seqs = 3;
  c.num_tokens = 3;
  c.Init();
  c.num_seqs = 1;
  c.kv_lens = {2, 7, 1000000};
  c.cu_q_lens = {0, 1, 3, 2};
  c.page_indices = {0, 1, 55, -55, 1 << 30, -(1 << 30)};
  for (float& x : c.q) x = 1.0f;
  c.SetKeyValue(0, 0, 0, {0.0f}, {2.0f});
  c.SetKeyValue(0, 1, 0, {1.0f}, {-2.0f});
  Expected e(c);
  e.Put(0, 0, Attend({0.0, 1.0}, {{2}, {-2}}));
  Check(c, {}, e.values);
}

// ------------------------------------------------------- every dtype pair

struct DTypePair {
  DType q;
  DType kv;
};

std::string PairName(const ::testing::TestParamInfo<DTypePair>& param_info) {
  return "q_" + std::string(ToString(param_info.param.q)) + "_kv_" +
         std::string(ToString(param_info.param.kv));
}

class ReferenceDTypeTest : public ::testing::TestWithParam<DTypePair> {};

// Inputs exactly representable in every dtype (int8 through the scales), so
// the hand value is exact up to the output's rounding. Two sequences, GQA 2:1,
// a soft cap and a window, on pages of 3.
TEST_P(ReferenceDTypeTest, SmallCaseMatchesHand) {
  const DTypePair pair = GetParam();
  HandCase c;
  c.num_q_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.page_size = 3;
  c.pages_per_seq = 2;
  c.num_pages = 4;
  c.max_num_seqs = 2;
  c.num_tokens = 4;
  c.Init();
  c.num_seqs = 2;
  c.kv_lens = {4, 1};
  c.cu_q_lens = {0, 2, 3};  // Row 3 is padding.
  c.page_indices = {3, 0, 2, -1};
  c.SetQ(0, 0, {1.0f, 0.5f});
  c.SetQ(0, 1, {-0.5f, 1.0f});
  c.SetQ(1, 0, {0.25f, -1.0f});
  c.SetQ(1, 1, {2.0f, 0.0f});
  c.SetQ(2, 0, {1.0f, 1.0f});
  c.SetQ(2, 1, {-1.0f, -1.0f});
  c.SetQ(3, 0, {1.0f, 1.0f});
  const std::vector<std::vector<double>> k = {{1, -0.5}, {2, 1}, {-1, 0.5}, {0.5, -2}};
  const std::vector<std::vector<double>> v = {{0.5, 1}, {-1, 2}, {1.5, -0.5}, {0, 1}};
  for (int t = 0; t < 4; ++t) {
    c.SetKeyValue(0, t, 0, {static_cast<float>(k[t][0]), static_cast<float>(k[t][1])},
                  {static_cast<float>(v[t][0]), static_cast<float>(v[t][1])});
  }
  c.SetKeyValue(1, 0, 0, {1.0f, 1.0f}, {-1.5f, 0.25f});

  AttentionOptions options;
  options.sm_scale = 0.5;
  const bool quantized =
      pair.kv == DType::kI8 || pair.kv == DType::kF8E4M3FN || pair.kv == DType::kF8E5M2;
  if (quantized) {
    options.k_scale = 0.5;  // Stored K = 2k, V = 4v: integers for int8.
    options.v_scale = 0.25;
  }
  const double cap = 3.0;
  options.soft_cap = cap;
  options.sliding_window = 3;

  Expected e(c);
  // Sequence 0: q_len 2, kv_len 4: rows at positions 2, 3 see keys (p-3, p].
  for (int j = 0; j < 2; ++j) {
    const int p = 2 + j;
    for (int h = 0; h < 2; ++h) {
      const std::vector<double> qv = {c.q[(j * 2 + h) * 2], c.q[(j * 2 + h) * 2 + 1]};
      std::vector<double> logits;
      std::vector<std::vector<double>> values;
      for (int t = p - 2; t <= p; ++t) {
        const double dot = (qv[0] * k[t][0] + qv[1] * k[t][1]) * 0.5;
        logits.push_back(cap * std::tanh(dot / cap));
        values.push_back(v[t]);
      }
      e.Put(j, h, Attend(logits, values));
    }
  }
  e.Put(2, 0, {-1.5, 0.25});
  e.Put(2, 1, {-1.5, 0.25});
  Check(c, options, e.values, pair.q, pair.kv);
}

std::vector<DTypePair> AllPairs() {
  std::vector<DTypePair> pairs;
  for (DType q : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType kv :
         {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}) {
      pairs.push_back({q, kv});
    }
  }
  return pairs;
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, ReferenceDTypeTest, ::testing::ValuesIn(AllPairs()), PairName);

}  // namespace
}  // namespace rpa
