// The production entry points across layouts and against the reference:
//  - the combined, NHD and HND layouts, and strided views of each where only
//    head_dim is contiguous, give identical results on the same data;
//  - JAX's decode-only PagedAttention agrees with RaggedPagedAttention;
//  - randomized ragged batches (page_size {1, 3, 7, 16} x batch {1, 7, 37},
//    GQA 1/4/8, head_dim 64/80/128/256) agree with the reference within the
//    the contract's tolerance for the KV dtype, and repeated calls agree bit for bit.
#include "rpa/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rpa/dtype.h"
#include "rpa/options.h"
#include "rpa/reference.h"
#include "rpa/tensor.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"

namespace rpa {
namespace {

using testing::BatchSpec;
using testing::MakeSyntheticBatch;
using testing::SequenceShape;
using testing::SyntheticBatch;
using testing::Tolerance;  // docs/contract.md §1 for the K/V dtype, plus the output's rounding.

bool IsQuantized(DType dtype) {
  return dtype == DType::kF8E4M3FN || dtype == DType::kF8E5M2 || dtype == DType::kI8;
}

// An output of shape [num_tokens, num_heads, head_dim] in `dtype`, stored
// with a padded head stride; the padding holds a sentinel pattern that no
// call may overwrite.
class StridedOutput {
 public:
  StridedOutput(DType dtype, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t pad,
                float fill)
      : dtype_(dtype),
        num_tokens_(num_tokens),
        num_heads_(num_heads),
        head_dim_(head_dim),
        head_stride_(head_dim + pad),
        token_stride_(num_heads * (head_dim + pad) + pad) {
    buffer_.assign(static_cast<size_t>(num_tokens * token_stride_ + 1) * SizeOf(dtype), 0x5A);
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t h = 0; h < num_heads; ++h) {
        for (int64_t d = 0; d < head_dim; ++d)
          StoreFromF32(dtype, buffer_.data(), Index(t, h, d), fill);
      }
    }
    pristine_ = buffer_;
  }
  MutableTensorView View() {
    return MutableTensorView(buffer_.data(), dtype_, {num_tokens_, num_heads_, head_dim_},
                             {token_stride_, head_stride_, 1});
  }
  std::vector<float> Values() const {
    std::vector<float> values;
    for (int64_t t = 0; t < num_tokens_; ++t) {
      for (int64_t h = 0; h < num_heads_; ++h) {
        for (int64_t d = 0; d < head_dim_; ++d) {
          values.push_back(LoadAsF32(dtype_, buffer_.data(), Index(t, h, d)));
        }
      }
    }
    return values;
  }
  // Whether every byte outside the view is as it was.
  bool PaddingUntouched() const {
    std::vector<bool> inside(buffer_.size(), false);
    const size_t size = SizeOf(dtype_);
    for (int64_t t = 0; t < num_tokens_; ++t) {
      for (int64_t h = 0; h < num_heads_; ++h) {
        for (int64_t d = 0; d < head_dim_; ++d) {
          for (size_t b = 0; b < size; ++b) inside[Index(t, h, d) * size + b] = true;
        }
      }
    }
    for (size_t i = 0; i < buffer_.size(); ++i) {
      if (!inside[i] && buffer_[i] != pristine_[i]) return false;
    }
    return true;
  }

 private:
  size_t Index(int64_t t, int64_t h, int64_t d) const {
    return static_cast<size_t>(t * token_stride_ + h * head_stride_ + d);
  }
  DType dtype_;
  int64_t num_tokens_, num_heads_, head_dim_, head_stride_, token_stride_;
  std::vector<uint8_t> buffer_;
  std::vector<uint8_t> pristine_;
};

std::vector<float> Decode(DType dtype, const std::vector<uint8_t>& buffer, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = LoadAsF32(dtype, buffer.data(), i);
  return values;
}

// Bitwise equality of two outputs (NaN included); prints the first few
// differences as (token, head, d).
void ExpectIdentical(const std::vector<float>& got, const std::vector<float>& want,
                     int64_t num_heads, int64_t head_dim, const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++mismatches <= 5) {
      const int64_t n = static_cast<int64_t>(i);
      ADD_FAILURE() << label << ": out[" << n / head_dim / num_heads << ", "
                    << n / head_dim % num_heads << ", " << n % head_dim << "] = " << got[i]
                    << ", expected identical " << want[i];
    }
  }
  EXPECT_EQ(mismatches, 0) << label << ": elements differ";
}

// |got - want| within Tolerance(); every output finite.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, DType q_dtype,
                 DType kv_dtype, int64_t num_heads, int64_t head_dim, const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  int mismatches = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tolerance = Tolerance(q_dtype, kv_dtype, want[i]);
    if (!(diff <= tolerance) || !std::isfinite(got[i])) {
      if (++mismatches <= 5) {
        const int64_t n = static_cast<int64_t>(i);
        ADD_FAILURE() << label << ": out[" << n / head_dim / num_heads << ", "
                      << n / head_dim % num_heads << ", " << n % head_dim << "] = " << got[i]
                      << ", reference " << want[i] << " (tolerance " << tolerance << ")";
      }
    } else {
      worst = std::max(worst, diff);
    }
  }
  EXPECT_EQ(mismatches, 0) << label << ": elements outside tolerance";
}

// ---------------------------------------------------------------- layouts

// The batch's combined cache copied into a strided buffer. Element
// (page, slot, head, d) of K (which = 0) or V (which = 1), or of the combined
// cache itself (which = -1, heads 2 * num_kv_heads), goes to
// page * strides[0] + ... in the order the layout names its dimensions.
struct CopiedCache {
  std::vector<uint8_t> buffer;
  TensorView view;
};

CopiedCache CopyCache(const SyntheticBatch& b, int which, KVLayout layout, int64_t pad) {
  const BatchSpec& s = b.spec;
  const int64_t heads = which < 0 ? 2 * s.num_kv_heads : s.num_kv_heads;
  const int64_t d_stride = s.head_dim + pad;  // Distance between head rows.
  // Odd extra gaps so no stride is a multiple of another.
  int64_t head_stride, slot_stride, page_stride;
  if (layout == KVLayout::kNHD) {
    head_stride = d_stride;
    slot_stride = heads * head_stride + (pad ? 1 : 0);
    page_stride = s.page_size * slot_stride + (pad ? 5 : 0);
  } else {
    slot_stride = d_stride;
    head_stride = s.page_size * slot_stride + (pad ? 2 : 0);
    page_stride = heads * head_stride + (pad ? 3 : 0);
  }
  const size_t size = SizeOf(s.kv_dtype);
  CopiedCache c;
  c.buffer.assign(static_cast<size_t>(b.total_num_pages * page_stride + 1) * size, 0);
  // Padding holds NaN: a kernel reading past head_dim would show it.
  if (pad) {
    for (size_t i = 0; i < c.buffer.size() / size; ++i)
      StoreFromF32(s.kv_dtype, c.buffer.data(), i, NAN);
  }
  for (int64_t page = 0; page < b.total_num_pages; ++page) {
    for (int64_t slot = 0; slot < s.page_size; ++slot) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t combined_head = which < 0 ? h : 2 * h + which;
        const int64_t src =
            ((page * s.page_size + slot) * 2 * s.num_kv_heads + combined_head) * s.head_dim;
        const int64_t dst = page * page_stride + slot * slot_stride + h * head_stride;
        std::memcpy(c.buffer.data() + dst * size, b.kv_pages.data() + src * size,
                    static_cast<size_t>(s.head_dim) * size);
      }
    }
  }
  if (layout == KVLayout::kNHD) {
    c.view =
        TensorView(c.buffer.data(), s.kv_dtype, {b.total_num_pages, s.page_size, heads, s.head_dim},
                   {page_stride, slot_stride, head_stride, 1});
  } else {
    c.view =
        TensorView(c.buffer.data(), s.kv_dtype, {b.total_num_pages, heads, s.page_size, s.head_dim},
                   {page_stride, head_stride, slot_stride, 1});
  }
  return c;
}

// q copied into a view with a padded head stride.
CopiedCache CopyQ(const SyntheticBatch& b, int64_t pad) {
  const BatchSpec& s = b.spec;
  const size_t size = SizeOf(s.q_dtype);
  const int64_t head_stride = s.head_dim + pad;
  const int64_t token_stride = s.num_q_heads * head_stride + 1;
  CopiedCache c;
  c.buffer.assign(static_cast<size_t>(b.num_tokens * token_stride + 1) * size, 0);
  for (size_t i = 0; i < c.buffer.size() / size; ++i)
    StoreFromF32(s.q_dtype, c.buffer.data(), i, NAN);
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    for (int64_t h = 0; h < s.num_q_heads; ++h) {
      std::memcpy(c.buffer.data() + (t * token_stride + h * head_stride) * size,
                  b.q.data() + ((t * s.num_q_heads + h) * s.head_dim) * size,
                  static_cast<size_t>(s.head_dim) * size);
    }
  }
  c.view = TensorView(c.buffer.data(), s.q_dtype, {b.num_tokens, s.num_q_heads, s.head_dim},
                      {token_stride, head_stride, 1});
  return c;
}

struct LayoutCase {
  const char* name;
  DType q_dtype;
  DType kv_dtype;
  int64_t num_q_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t page_size;
};

class LayoutTest : public ::testing::TestWithParam<LayoutCase> {};

AttentionOptions OptionsFor(DType kv_dtype, int64_t head_dim) {
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (IsQuantized(kv_dtype)) {
    // Stored values are x / scale; a scale of 1/32 puts int8 in range.
    options.k_scale = kv_dtype == DType::kI8 ? 1.0 / 32 : 0.5;
    options.v_scale = kv_dtype == DType::kI8 ? 1.0 / 32 : 0.25;
  }
  return options;
}

// Random batch whose stored K/V sit in the quantized range when scaled.
SyntheticBatch MakeBatch(BatchSpec spec, const AttentionOptions& options) {
  SyntheticBatch b = MakeSyntheticBatch(spec);
  if (options.k_scale || options.v_scale) {
    // Re-quantize: stored = N(0, 1) / scale, so logical K/V are unit normal.
    // (Slots holding NaN keep NaN.)
    std::mt19937_64 rng(spec.seed + 99);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t row = spec.head_dim;
    const int64_t rows = static_cast<int64_t>(b.kv_pages.size() / SizeOf(spec.kv_dtype)) / row;
    for (int64_t r = 0; r < rows; ++r) {
      const bool is_v = r % 2 == 1;
      const double scale = is_v ? options.v_scale.value_or(1.0) : options.k_scale.value_or(1.0);
      for (int64_t d = 0; d < row; ++d) {
        const int64_t i = r * row + d;
        const float old = LoadAsF32(spec.kv_dtype, b.kv_pages.data(), i);
        if (spec.kv_dtype != DType::kI8 && std::isnan(old)) continue;
        StoreFromF32(spec.kv_dtype, b.kv_pages.data(), i, static_cast<float>(normal(rng) / scale));
      }
    }
  }
  return b;
}

// A mixed batch: decode, chunked prefill, prefill, q_len 0, an empty
// sequence, and padding rows, with an idle max_num_seqs entry.
std::vector<SequenceShape> MixedSequences(int64_t page_size) {
  const int32_t ps = static_cast<int32_t>(page_size);
  return {{1, 2 * ps + 1}, {3, ps + 4}, {5, 5}, {0, 3}, {0, 0}, {1, 1}, {2, 3 * ps}};
}

TEST_P(LayoutTest, AllLayoutsAgree) {
  const LayoutCase& lc = GetParam();
  BatchSpec spec;
  spec.num_q_heads = lc.num_q_heads;
  spec.num_kv_heads = lc.num_kv_heads;
  spec.head_dim = lc.head_dim;
  spec.page_size = lc.page_size;
  spec.q_dtype = lc.q_dtype;
  spec.kv_dtype = lc.kv_dtype;
  spec.sequences = MixedSequences(lc.page_size);
  spec.max_num_seqs = 9;
  spec.pages_per_seq = 6;
  spec.max_num_batched_tokens = 15;
  spec.seed = 11;
  AttentionOptions options = OptionsFor(lc.kv_dtype, lc.head_dim);
  options.soft_cap = 20.0;
  const SyntheticBatch b = MakeBatch(spec, options);
  const int64_t hq = spec.num_q_heads, d = spec.head_dim;
  const size_t count = static_cast<size_t>(b.num_tokens * hq * d);

  // The reference on the combined layout.
  std::vector<uint8_t> ref_out = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, options,
                          b.OutView(ref_out));
  const std::vector<float> ref = Decode(spec.q_dtype, ref_out, count);

  // The production path on the combined layout, contiguous.
  std::vector<uint8_t> out = b.NewOutput();
  std::fill(out.begin(), out.end(), 0xFF);  // NaN in every float dtype.
  RaggedPagedAttention(b.Q(), b.KvPages(),
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, options,
                       b.OutView(out));
  const std::vector<float> combined = Decode(spec.q_dtype, out, count);
  ExpectClose(combined, ref, spec.q_dtype, spec.kv_dtype, hq, d, "combined vs reference");

  for (int64_t pad : {0, 3}) {
    const CopiedCache q = pad ? CopyQ(b, pad) : CopiedCache{{}, b.Q()};
    const std::string suffix = pad ? " strided" : "";
    {
      const CopiedCache kv = CopyCache(b, -1, KVLayout::kNHD, pad);
      StridedOutput o(spec.q_dtype, b.num_tokens, hq, d, pad, NAN);
      RaggedPagedAttention(q.view, kv.view,
                           PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                           options, o.View());
      ExpectIdentical(o.Values(), combined, hq, d, "combined" + suffix);
      EXPECT_TRUE(o.PaddingUntouched()) << "combined" + suffix;
    }
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      const std::string label = std::string(ToString(layout)) + suffix;
      const CopiedCache k = CopyCache(b, 0, layout, pad);
      const CopiedCache v = CopyCache(b, 1, layout, pad);
      StridedOutput o(spec.q_dtype, b.num_tokens, hq, d, pad, NAN);
      RaggedPagedAttention(q.view, KVPages{k.view, v.view, layout},
                           PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                           options, o.View());
      ExpectIdentical(o.Values(), combined, hq, d, label);
      EXPECT_TRUE(o.PaddingUntouched()) << label;

      // The reference through the split layout equals it on the combined one.
      StridedOutput r(spec.q_dtype, b.num_tokens, hq, d, pad, NAN);
      RefRaggedPagedAttention(q.view, KVPages{k.view, v.view, layout},
                              PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()},
                              options, r.View());
      ExpectIdentical(r.Values(), ref, hq, d, "reference " + label);
    }
  }
}

const LayoutCase kLayoutCases[] = {
    {"q_f32_kv_f32_h4x2_d16_ps3", DType::kF32, DType::kF32, 4, 2, 16, 3},
    {"q_bf16_kv_bf16_h8x2_d64_ps16", DType::kBF16, DType::kBF16, 8, 2, 64, 16},
    {"q_f16_kv_f16_h2x2_d80_ps7", DType::kF16, DType::kF16, 2, 2, 80, 7},
    {"q_bf16_kv_e4m3_h4x1_d32_ps1", DType::kBF16, DType::kF8E4M3FN, 4, 1, 32, 1},
    {"q_f32_kv_e5m2_h3x3_d24_ps4", DType::kF32, DType::kF8E5M2, 3, 3, 24, 4},
    {"q_f16_kv_i8_h8x1_d128_ps5", DType::kF16, DType::kI8, 8, 1, 128, 5},
    {"q_f32_kv_bf16_h1x1_d7_ps2", DType::kF32, DType::kBF16, 1, 1, 7, 2},
};

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutTest, ::testing::ValuesIn(kLayoutCases),
                         [](const ::testing::TestParamInfo<LayoutCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

// ---------------------------------------------------- JAX's paged_attention

struct PagedCase {
  const char* name;
  DType q_dtype;
  DType kv_dtype;
  int64_t num_q_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t page_size;
  int64_t pages_per_compute_block;
  double soft_cap;            // 0: none.
  const char* megacore_mode;  // nullptr: none.
};

class PagedAttentionTest : public ::testing::TestWithParam<PagedCase> {};

// A decode batch built twice from the same K/V: JAX's paged layout
// (k_pages [num_kv_heads, total_num_pages, page_size, head_dim]) for
// PagedAttention and the combined layout for RaggedPagedAttention (one
// token per non-empty slot, sm_scale 1: JAX's q is pre-scaled).
TEST_P(PagedAttentionTest, AgreesWithRaggedOnDecode) {
  const PagedCase& pc = GetParam();
  const int64_t hq = pc.num_q_heads, hkv = pc.num_kv_heads, d = pc.head_dim, ps = pc.page_size;
  // Slot 2 has length 0 (a padded batch entry): its row must be 0.
  const std::vector<int32_t> lengths = {static_cast<int32_t>(3 * ps + 1),
                                        1,
                                        0,
                                        static_cast<int32_t>(ps),
                                        static_cast<int32_t>(2 * ps - 1),
                                        static_cast<int32_t>(4 * ps)};
  const int64_t batch = static_cast<int64_t>(lengths.size());
  const int64_t pages_per_sequence = 4;  // Divisible by 1, 2 and 4.
  const int64_t total_pages = batch * pages_per_sequence + 2;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  // Pages in a shuffled order; unused columns point anywhere in range.
  std::vector<int32_t> pool(static_cast<size_t>(total_pages));
  for (int32_t i = 0; i < total_pages; ++i) pool[i] = i;
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> page_indices(static_cast<size_t>(batch * pages_per_sequence));
  for (size_t i = 0; i < page_indices.size(); ++i) page_indices[i] = pool[i];

  // Logical K/V in f32: [num_kv_heads, total_pages, page_size, head_dim].
  const size_t kv_count = static_cast<size_t>(hkv * total_pages * ps * d);
  std::vector<uint8_t> k_pages(kv_count * SizeOf(pc.kv_dtype));
  std::vector<uint8_t> v_pages(kv_count * SizeOf(pc.kv_dtype));
  for (size_t i = 0; i < kv_count; ++i) {
    StoreFromF32(pc.kv_dtype, k_pages.data(), i, normal(rng));
    StoreFromF32(pc.kv_dtype, v_pages.data(), i, normal(rng));
  }
  // q pre-scaled by 1/sqrt(d), as JAX's callers do.
  const size_t q_count = static_cast<size_t>(batch * hq * d);
  std::vector<uint8_t> q(q_count * SizeOf(pc.q_dtype));
  for (size_t i = 0; i < q_count; ++i) {
    StoreFromF32(pc.q_dtype, q.data(), i, normal(rng) / std::sqrt(static_cast<float>(d)));
  }

  PagedAttentionOptions paged_options;
  paged_options.pages_per_compute_block = pc.pages_per_compute_block;
  if (pc.soft_cap > 0) paged_options.attn_logits_soft_cap = pc.soft_cap;
  if (pc.megacore_mode) paged_options.megacore_mode = pc.megacore_mode;
  std::vector<uint8_t> paged_out(q.size());
  std::fill(paged_out.begin(), paged_out.end(), 0xFF);
  PagedAttention(TensorView(q.data(), pc.q_dtype, {batch, hq, d}),
                 TensorView(k_pages.data(), pc.kv_dtype, {hkv, total_pages, ps, d}),
                 TensorView(v_pages.data(), pc.kv_dtype, {hkv, total_pages, ps, d}),
                 TensorView(lengths.data(), DType::kI32, {batch}),
                 TensorView(page_indices.data(), DType::kI32, {batch, pages_per_sequence}),
                 paged_options, MutableTensorView(paged_out.data(), pc.q_dtype, {batch, hq, d}));
  const std::vector<float> paged = Decode(pc.q_dtype, paged_out, q_count);

  // The same data in the combined layout; row r is the r-th non-empty slot.
  const size_t size = SizeOf(pc.kv_dtype);
  std::vector<uint8_t> kv(2 * kv_count * size);
  for (int64_t page = 0; page < total_pages; ++page) {
    for (int64_t slot = 0; slot < ps; ++slot) {
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t src = ((h * total_pages + page) * ps + slot) * d;
        const int64_t dst = ((page * ps + slot) * 2 * hkv + 2 * h) * d;
        std::memcpy(kv.data() + dst * size, k_pages.data() + src * size, d * size);
        std::memcpy(kv.data() + (dst + d) * size, v_pages.data() + src * size, d * size);
      }
    }
  }
  std::vector<int32_t> cu_q_lens(static_cast<size_t>(batch + 1), 0);
  std::vector<int64_t> slot_of_row;
  std::vector<uint8_t> ragged_q(q.size(), 0);
  const size_t row_bytes = static_cast<size_t>(hq * d) * SizeOf(pc.q_dtype);
  for (int64_t b = 0; b < batch; ++b) {
    const bool live = lengths[b] > 0;
    cu_q_lens[b + 1] = cu_q_lens[b] + (live ? 1 : 0);
    if (live) {
      std::memcpy(ragged_q.data() + slot_of_row.size() * row_bytes, q.data() + b * row_bytes,
                  row_bytes);
      slot_of_row.push_back(b);
    }
  }
  const int32_t num_seqs = static_cast<int32_t>(batch);
  AttentionOptions options;
  options.sm_scale = 1.0;
  if (pc.soft_cap > 0) options.soft_cap = pc.soft_cap;
  const TensorView rq(ragged_q.data(), pc.q_dtype, {batch, hq, d});
  const TensorView rkv(kv.data(), pc.kv_dtype, {total_pages, ps, 2 * hkv, d});
  const TensorView rlens(lengths.data(), DType::kI32, {batch});
  const TensorView rpages(page_indices.data(), DType::kI32, {batch, pages_per_sequence});
  const TensorView rcu(cu_q_lens.data(), DType::kI32, {batch + 1});
  const TensorView rnum(&num_seqs, DType::kI32, {1});
  std::vector<uint8_t> ragged_out(q.size(), 0xFF);
  RaggedPagedAttention(rq, rkv, PageTable{rlens, rpages, rcu, rnum}, options,
                       MutableTensorView(ragged_out.data(), pc.q_dtype, {batch, hq, d}));
  std::vector<uint8_t> ref_out(q.size(), 0xFF);
  RefRaggedPagedAttention(rq, rkv, PageTable{rlens, rpages, rcu, rnum}, options,
                          MutableTensorView(ref_out.data(), pc.q_dtype, {batch, hq, d}));

  // Rearranged into the paged batch's row order; empty slots are 0.
  const std::vector<float> ragged_rows = Decode(pc.q_dtype, ragged_out, q_count);
  const std::vector<float> ref_rows = Decode(pc.q_dtype, ref_out, q_count);
  std::vector<float> ragged(q_count, 0.0f), ref(q_count, 0.0f);
  const size_t row = static_cast<size_t>(hq * d);
  for (size_t r = 0; r < slot_of_row.size(); ++r) {
    std::copy_n(ragged_rows.begin() + r * row, row, ragged.begin() + slot_of_row[r] * row);
    std::copy_n(ref_rows.begin() + r * row, row, ref.begin() + slot_of_row[r] * row);
  }
  // Ragged's padding rows (past the live ones) are zero.
  for (size_t i = slot_of_row.size() * row; i < q_count; ++i) {
    ASSERT_EQ(ragged_rows[i], 0.0f) << "ragged padding element " << i;
  }
  for (size_t i = 2 * row; i < 3 * row; ++i) {
    ASSERT_EQ(paged[i], 0.0f) << "length-0 slot 2, element " << i - 2 * row;
  }
  ExpectClose(paged, ref, pc.q_dtype, pc.kv_dtype, hq, d, "paged_attention vs reference");
  ExpectClose(ragged, ref, pc.q_dtype, pc.kv_dtype, hq, d, "ragged vs reference");
  // Both production calls within the tolerance of each other too.
  ExpectClose(paged, ragged, pc.q_dtype, pc.kv_dtype, hq, d, "paged_attention vs ragged");
}

const PagedCase kPagedCases[] = {
    {"q_f32_kv_f32_h8x2_d64_ps16_block1", DType::kF32, DType::kF32, 8, 2, 64, 16, 1, 0, nullptr},
    {"q_f32_kv_f32_h4x4_d32_ps3_block2_softcap", DType::kF32, DType::kF32, 4, 4, 32, 3, 2, 5.0,
     nullptr},
    {"q_bf16_kv_bf16_h8x1_d128_ps7_block4", DType::kBF16, DType::kBF16, 8, 1, 128, 7, 4, 0,
     nullptr},
    {"q_f16_kv_f16_h4x2_d80_ps1_block2_softcap_kvhead", DType::kF16, DType::kF16, 4, 2, 80, 1, 2,
     2.0, "kv_head"},
    {"q_bf16_kv_e4m3_h2x2_d16_ps5_block1_batch", DType::kBF16, DType::kF8E4M3FN, 2, 2, 16, 5, 1, 0,
     "batch"},
};

INSTANTIATE_TEST_SUITE_P(Decode, PagedAttentionTest, ::testing::ValuesIn(kPagedCases),
                         [](const ::testing::TestParamInfo<PagedCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

// ---------------------------------------------------- randomized batches

struct RandomCase {
  int64_t page_size;
  int64_t batch;
  int64_t gqa;  // num_q_heads / num_kv_heads.
  int64_t head_dim;
  DType q_dtype;
  DType kv_dtype;
  int variant;  // Picks the options: plain, window, soft cap, small mask.

  std::string Name() const {
    static const char* kVariants[] = {"plain", "window", "softcap", "mask", "all"};
    return "ps" + std::to_string(page_size) + "_b" + std::to_string(batch) + "_gqa" +
           std::to_string(gqa) + "_d" + std::to_string(head_dim) + "_q_" +
           std::string(ToString(q_dtype)) + "_kv_" + std::string(ToString(kv_dtype)) + "_" +
           kVariants[variant];
  }
};

class RandomBatchTest : public ::testing::TestWithParam<RandomCase> {};

// Random sequence shapes: decode, chunked prefill, prefill, q_len 0 and
// empty sequences, sized so the reference stays fast.
std::vector<SequenceShape> RandomSequences(const RandomCase& rc, std::mt19937_64& rng) {
  std::vector<SequenceShape> sequences;
  const int32_t max_kv = static_cast<int32_t>(std::max<int64_t>(3 * rc.page_size + 2, 12));
  std::uniform_int_distribution<int32_t> kv_dist(1, max_kv);
  std::uniform_int_distribution<int> kind_dist(0, 9);
  for (int64_t i = 0; i < rc.batch; ++i) {
    SequenceShape s;
    s.kv_len = kv_dist(rng);
    const int kind = kind_dist(rng);
    if (rc.batch == 1) {
      s.q_len = std::min(s.kv_len, 4);  // Always some work.
    } else if (kind < 5) {
      s.q_len = 1;  // Decode.
    } else if (kind < 7) {
      s.q_len = std::uniform_int_distribution<int32_t>(1, std::min(s.kv_len, 6))(rng);
    } else if (kind < 8) {
      s.kv_len = std::min(s.kv_len, 8);
      s.q_len = s.kv_len;  // Prefill.
    } else if (kind < 9) {
      s.q_len = 0;
    } else {
      s.q_len = 0;
      s.kv_len = 0;
    }
    sequences.push_back(s);
  }
  return sequences;
}

TEST_P(RandomBatchTest, MatchesReferenceAndRepeats) {
  const RandomCase& rc = GetParam();
  std::mt19937_64 rng(
      static_cast<uint64_t>(rc.page_size * 1000003 + rc.batch * 101 + rc.head_dim * 7 + rc.gqa));
  const int64_t num_kv_heads = rc.gqa == 8 ? 1 : 2;
  BatchSpec spec;
  spec.num_kv_heads = num_kv_heads;
  spec.num_q_heads = num_kv_heads * rc.gqa;
  spec.head_dim = rc.head_dim;
  spec.page_size = rc.page_size;
  spec.q_dtype = rc.q_dtype;
  spec.kv_dtype = rc.kv_dtype;
  spec.sequences = RandomSequences(rc, rng);
  spec.max_num_seqs = rc.batch + 2;  // Idle entries.
  int64_t total_q = 0;
  for (const SequenceShape& s : spec.sequences) total_q += s.q_len;
  spec.max_num_batched_tokens = total_q + 3;  // Padding rows.
  spec.pages_per_seq = 0;
  spec.seed = rng();

  AttentionOptions options = OptionsFor(rc.kv_dtype, rc.head_dim);
  if (rc.variant == 1 || rc.variant == 4) options.sliding_window = 1 + rc.page_size;
  if (rc.variant == 2 || rc.variant == 4) options.soft_cap = 2.5;
  if (rc.variant == 3) options.mask_value = -3.0;  // Every key takes part.
  if (rc.variant == 4) options.mask_value = -50.0;
  const SyntheticBatch b = MakeBatch(spec, options);
  const size_t count = static_cast<size_t>(b.num_tokens * spec.num_q_heads * spec.head_dim);

  std::vector<uint8_t> ref_out = b.NewOutput();
  RefRaggedPagedAttention(b.Q(), b.KvPages(),
                          PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, options,
                          b.OutView(ref_out));
  const std::vector<float> ref = Decode(rc.q_dtype, ref_out, count);

  std::vector<float> first;
  for (int call = 0; call < 2; ++call) {
    std::vector<uint8_t> out(b.q.size(), call == 0 ? 0xFF : 0x7F);  // Garbage.
    RaggedPagedAttention(b.Q(), b.KvPages(),
                         PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, options,
                         b.OutView(out));
    const std::vector<float> got = Decode(rc.q_dtype, out, count);
    if (call == 0) {
      ExpectClose(got, ref, rc.q_dtype, rc.kv_dtype, spec.num_q_heads, spec.head_dim,
                  "production vs reference");
      first = got;
    } else {
      ExpectIdentical(got, first, spec.num_q_heads, spec.head_dim, "second call vs first");
    }
  }
  // One thread plans differently (no split KV) and still agrees.
  AttentionOptions one_thread = options;
  one_thread.num_threads = 1;
  std::vector<uint8_t> out = b.NewOutput();
  RaggedPagedAttention(b.Q(), b.KvPages(),
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}, one_thread,
                       b.OutView(out));
  ExpectClose(Decode(rc.q_dtype, out, count), ref, rc.q_dtype, rc.kv_dtype, spec.num_q_heads,
              spec.head_dim, "num_threads=1 vs reference");
}

std::vector<RandomCase> RandomCases() {
  // page_size x batch in full; GQA, head_dim, dtypes and options rotate so
  // that each value of each appears several times without a full product.
  const int64_t gqas[] = {1, 4, 8};
  const int64_t head_dims[] = {64, 80, 128, 256};
  const DType q_dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  const DType kv_dtypes[] = {DType::kF32,      DType::kBF16,   DType::kF16,
                             DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8};
  std::vector<RandomCase> cases;
  int n = 0;
  for (int64_t page_size : {1, 3, 7, 16}) {
    for (int64_t batch : {1, 7, 37}) {
      for (int rep = 0; rep < 2; ++rep, ++n) {
        RandomCase rc;
        rc.page_size = page_size;
        rc.batch = batch;
        rc.gqa = gqas[n % 3];
        rc.head_dim = head_dims[(n / 3 + n) % 4];
        rc.q_dtype = q_dtypes[(n / 2) % 3];
        rc.kv_dtype = kv_dtypes[n % 6 == 0 ? 0 : (n * 5) % 6];
        rc.variant = n % 5;
        cases.push_back(rc);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ragged, RandomBatchTest, ::testing::ValuesIn(RandomCases()),
                         [](const ::testing::TestParamInfo<RandomCase>& param_info) {
                           return param_info.param.Name();
                         });

}  // namespace
}  // namespace rpa
