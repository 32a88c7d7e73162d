#include "ragged_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "rpa/reference.h"

namespace rpa::fuzz {
namespace {

constexpr DType kQDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr DType kKvDtypes[] = {DType::kF32,      DType::kBF16,   DType::kF16,
                               DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8};

int64_t CacheHeads(const RaggedCase& c) {
  return c.layout == Layout::kCombined ? 2 * c.num_kv_heads : c.num_kv_heads;
}
int64_t PageStride(const RaggedCase& c) {
  return c.page_size * CacheHeads(c) * c.head_dim + c.page_pad;
}
int64_t QElemStride(const RaggedCase& c) { return c.perturb == Perturb::kQStride ? 2 : 1; }
int64_t QTokenStride(const RaggedCase& c) {
  return c.num_q_heads * c.head_dim * QElemStride(c) + c.q_pad;
}
int64_t OutTokenStride(const RaggedCase& c) { return c.num_q_heads * c.head_dim + c.out_pad; }

// Options in the range where docs/contract.md §1's tolerances hold, or raw doubles.
void ChooseOptions(Input& in, bool raw, RaggedCase& c) {
  AttentionOptions& o = c.options;
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(c.head_dim, 1)));
  o.sm_scale = raw ? in.F64() : (in.Unit() * 4.0 - 2.0) * inv_sqrt_d;
  if (in.Byte() % 4 == 0) {
    o.sliding_window = raw ? in.I64() : int64_t{in.Meta(1, 40)};
    // Windows beyond int32 (valid: no key is outside them; finding F2).
    const uint8_t w = in.Byte();
    if (!raw && w >= 240) {
      o.sliding_window = w == 255 ? INT64_MAX : (int64_t{1} << 32) + (w - 240);
    }
  }
  if (in.Byte() % 3 == 0) {
    o.soft_cap = raw ? in.F64() : (in.Byte() & 1 ? 1.0 : -1.0) * (1.0 + in.Unit() * 49.0);
  }
  switch (in.Byte() % 5) {
    case 0: break;
    case 1: o.mask_value = -std::numeric_limits<double>::infinity(); break;
    case 2: o.mask_value = -1e4 - in.Unit() * 1e30; break;
    case 3: o.mask_value = -in.Unit() * 30.0; break;
    default: o.mask_value = in.Unit() * 5.0; break;
  }
  if (raw && in.Byte() % 2 == 0) o.mask_value = in.F64();
  const bool int8 = c.kv_dtype == DType::kI8;
  auto scale = [&]() {
    if (raw) return in.F64();
    const double s = 0.25 + in.Unit() * 3.75;
    return int8 ? s / 64.0 : s;
  };
  if (in.Byte() % 3 == 0) o.k_scale = scale();
  if (in.Byte() % 3 == 0) o.v_scale = scale();
  if (in.Byte() % 3 == 0) o.num_kv_pages_per_block = raw ? in.I64() : in.Meta(1, c.pages_per_seq);
  if (in.Byte() % 3 == 0) o.num_queries_per_block = raw ? in.I64() : in.Meta(1, 32);
  if (in.Byte() % 4 == 0) {
    o.vmem_limit_bytes = raw ? in.I64() : int64_t{in.Meta(1, 255)} * (1 + in.Byte() * 64);
  }
  const uint8_t causal = in.Byte() % 8;
  if (causal == 0) o.causal = false;
  if (causal == 1) o.causal = true;
  const uint8_t t = in.Byte() % 16;
  if (t < 12) o.num_threads = 1 + t % 4;
  else if (t == 13) o.num_threads = 0;
  else if (t == 14) o.num_threads = -1;
  else if (t == 15) o.num_threads = 16;
}

// Mirrors docs/contract.md §3 from the spec's text, not from src/validate.cc: the
// reason the call must fail, or "".
std::string ModelError(const RaggedCase& c) {
  const AttentionOptions& o = c.options;
  if (c.perturb == Perturb::kQStride) {
    if (c.head_dim > 1) return "q not contiguous";
  } else if (c.perturb != Perturb::kNone) {
    return "static perturbation";
  }
  if (c.num_q_heads <= 0) return "num_q_heads <= 0";
  if (c.num_kv_heads <= 0) return "num_kv_heads <= 0";
  if (c.head_dim <= 0) return "head_dim <= 0";
  if (c.page_size <= 0) return "page_size <= 0";
  if (c.num_q_heads % c.num_kv_heads != 0) return "num_q_heads % num_kv_heads";
  if (!std::isfinite(o.sm_scale)) return "sm_scale";
  if (o.sliding_window && *o.sliding_window <= 0) return "sliding_window";
  if (o.sliding_window && !c.Causal() && !c.want_mask) return "window without causal";
  if (o.soft_cap && (*o.soft_cap == 0.0 || !std::isfinite(*o.soft_cap))) return "soft_cap";
  if (o.mask_value && (std::isnan(*o.mask_value) || *o.mask_value == INFINITY)) return "mask";
  if (o.k_scale && !std::isfinite(*o.k_scale)) return "k_scale";
  if (o.v_scale && !std::isfinite(*o.v_scale)) return "v_scale";
  if (o.num_kv_pages_per_block &&
      (*o.num_kv_pages_per_block <= 0 || *o.num_kv_pages_per_block > c.pages_per_seq)) {
    return "num_kv_pages_per_block";
  }
  if (o.num_queries_per_block && *o.num_queries_per_block <= 0) return "num_queries_per_block";
  if (o.vmem_limit_bytes && *o.vmem_limit_bytes <= 0) return "vmem_limit_bytes";
  if (o.num_threads && *o.num_threads <= 0) return "num_threads";
  if (c.want_sinks) {
    for (float s : c.sinks) {
      if (std::isnan(s)) return "sink NaN";
    }
  }
  if (c.want_alibi) {
    for (float s : c.alibi_slopes) {
      if (!std::isfinite(s)) return "alibi slope";
    }
  }
  if (c.want_mask && o.causal.value_or(false)) return "causal with a mask";
  if (c.want_mask && o.sliding_window) return "window with a mask";
  // Dynamic checks.
  const int64_t n = c.num_seqs[0];
  if (n < 0 || n > c.max_num_seqs) return "num_seqs range";
  int64_t max_kv_len = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (c.kv_lens[i] < 0) return "kv_len < 0";
    max_kv_len = std::max<int64_t>(max_kv_len, c.kv_lens[i]);
  }
  if (c.pages_per_seq < (max_kv_len + c.page_size - 1) / c.page_size) return "pages_per_seq";
  if (c.cu_q_lens[0] < 0) return "cu_q_lens[0] < 0";
  for (int64_t i = 0; i < n; ++i) {
    if (c.cu_q_lens[i + 1] < c.cu_q_lens[i]) return "cu_q_lens decreasing";
  }
  if (c.cu_q_lens[n] > c.num_tokens) return "total q tokens";
  for (int64_t i = 0; c.Causal() && i < n; ++i) {
    if (c.QLen(i) > c.kv_lens[i]) return "q_len > kv_len";
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pages = (int64_t{c.kv_lens[i]} + c.page_size - 1) / c.page_size;
    for (int64_t col = 0; col < pages; ++col) {
      const int32_t page = c.page_indices[i * c.pi_row_stride + col];
      if (page < 0 || page >= c.num_pages) return "page index";
    }
  }
  if (c.want_mask) {
    int64_t keys = 0;
    for (int64_t i = 0; i < n; ++i) keys += c.QLen(i) * c.kv_lens[i];
    if (keys != static_cast<int64_t>(c.mask.size())) return "custom_mask size";
  }
  return "";
}

// A flat mask for the live sequences (one entry off now and then, an
// invalid call), when the metadata let one be sized.
void ChooseMask(Input& in, RaggedCase& c) {
  const int64_t n = c.num_seqs[0];
  if (n < 0 || n > c.max_num_seqs) return;
  int64_t keys = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (c.cu_q_lens[i + 1] < c.cu_q_lens[i] || c.kv_lens[i] < 0) return;
    keys += c.QLen(i) * c.kv_lens[i];
  }
  if (keys > (1 << 16)) return;
  c.want_mask = true;
  const uint8_t density = in.Byte();
  for (int64_t k = 0; k < keys; ++k) c.mask.push_back((in.Byte() ^ density) < density ? 1 : 0);
  if (in.Byte() == 0) c.mask.push_back(1);
}

// Live (sequence, key) pairs whose page index is in range: where the cache
// holds data; everything else stays poisoned.
template <class Fn>
void ForEachReadSlot(const RaggedCase& c, Fn fn) {
  const int64_t n = std::clamp<int64_t>(c.num_seqs[0], 0, c.max_num_seqs);
  if (c.page_size <= 0) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t kv_len = std::clamp<int64_t>(c.kv_lens[i], 0, c.pages_per_seq * c.page_size);
    for (int64_t t = 0; t < kv_len; ++t) {
      const int32_t page = c.page_indices[i * c.pi_row_stride + t / c.page_size];
      if (page < 0 || page >= c.num_pages) continue;
      fn(i, t, page, t % c.page_size);
    }
  }
}

void FillData(RaggedCase& c, uint64_t seed) {
  Normal normal(seed);
  // q: unit-normal in every element (padding included, never read).
  const int64_t q_elems = c.num_tokens * QTokenStride(c);
  for (int64_t i = 0; i < q_elems; ++i) c.q.Store(i, normal.Next());
  // The cache: poison everywhere (NaN, or 127 for int8), data where read.
  const float poison = c.kv_dtype == DType::kI8 ? 127.0f : NAN;
  for (Buffer* b : {&c.k, &c.v}) {
    const int64_t elems = static_cast<int64_t>(b->bytes.size() - b->byte_offset) /
                          static_cast<int64_t>(SizeOf(b->dtype));
    for (int64_t i = 0; i < elems; ++i) b->Store(i, poison);
  }
  const bool sane_scales = c.sane;
  const float ks = sane_scales ? static_cast<float>(c.options.k_scale.value_or(1.0)) : 1.0f;
  const float vs = sane_scales ? static_cast<float>(c.options.v_scale.value_or(1.0)) : 1.0f;
  ForEachReadSlot(c, [&](int64_t, int64_t, int64_t page, int64_t slot) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      for (bool is_v : {false, true}) {
        Buffer& b = (is_v && c.layout != Layout::kCombined) ? c.v : c.k;
        const int64_t base = c.CacheOffset(page, slot, h, is_v);
        for (int64_t d = 0; d < c.head_dim; ++d) b.Store(base + d, normal.Next() / (is_v ? vs : ks));
      }
    }
  });
  c.sinks.resize(static_cast<size_t>(std::max<int64_t>(c.num_q_heads, 0)));
  for (float& s : c.sinks) s = 2.0f * normal.Next();
  c.sinks16.resize(c.sinks.size());
}

// The largest |logit| (sink included) any row can reach, as a bound: the soft
// cap where there is one, else Cauchy-Schwarz over the largest q and K row
// norms plus the ALiBi bias's reach; infinite once q holds an injected +-inf.
double LogitBound(const RaggedCase& c, bool q_infinite) {
  double sinks = 0;
  if (c.want_sinks) {
    for (float s : c.sinks) {
      if (std::isfinite(s)) sinks = std::max(sinks, std::fabs(double{s}));
    }
  }
  if (c.options.soft_cap) return std::max(std::fabs(*c.options.soft_cap), sinks);
  if (q_infinite) return INFINITY;
  double q_norm = 0;  // The largest sum of squares over (token, q head); k_norm likewise.
  const int64_t es = QElemStride(c);
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    for (int64_t h = 0; h < c.num_q_heads; ++h) {
      double sum = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const double x = c.q.Load(t * QTokenStride(c) + (h * c.head_dim + d) * es);
        sum += x * x;
      }
      q_norm = std::max(q_norm, sum);
    }
  }
  const double ks = c.options.k_scale.value_or(1.0);
  double k_norm = 0;
  int64_t max_kv_len = 0;
  ForEachReadSlot(c, [&](int64_t, int64_t t, int64_t page, int64_t slot) {
    max_kv_len = std::max(max_kv_len, t + 1);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int64_t base = c.CacheOffset(page, slot, h, /*is_v=*/false);
      double sum = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const double x = c.k.Load(base + d) * ks;
        sum += x * x;
      }
      k_norm = std::max(k_norm, sum);
    }
  });
  double slope = 0;
  if (c.want_alibi) {
    for (float s : c.alibi_slopes) slope = std::max(slope, std::fabs(double{s}));
  }
  return std::max(std::fabs(c.options.sm_scale) * std::sqrt(q_norm * k_norm) +
                      slope * static_cast<double>(max_kv_len),
                  sinks);
}

// NaN / +-inf where every query that reads the element sees it unmasked,
// so masked-block skipping (docs/contract.md §1) cannot make the kernel and the
// reference differ. +-inf goes into V only where no weight can underflow in
// f32 (docs/contract.md §1.5: a logit more than ~87 below its row's largest
// has weight 0 in the kernel, and 0 x inf = NaN where the reference keeps inf).
void InjectNonFinite(Input& in, RaggedCase& c) {
  const float kValues[] = {NAN, INFINITY, -INFINITY};
  // An infinite q element gives every key of its row a non-finite logit
  // (+-inf, or NaN from inf - inf or inf * 0). With mask_value <= -1e4 a
  // fully masked block of keys may be skipped (docs/contract.md §1), so the kernel may
  // never see what the reference's additive mask turns into NaN: +-inf only
  // goes where the row sees every key, or where no key is skipped.
  const bool masked_may_skip = c.options.mask_value.value_or(kDefaultMaskValue) <= -1e4;
  auto row_sees_every_key = [&](int64_t token) {
    const int64_t n = std::clamp<int64_t>(c.num_seqs[0], 0, c.max_num_seqs);
    for (int64_t i = 0; i < n; ++i) {
      if (token < c.cu_q_lens[i] || token >= c.cu_q_lens[i + 1]) continue;
      const int64_t position = int64_t{c.kv_lens[i]} - c.QLen(i) + (token - c.cu_q_lens[i]);
      const int64_t w = c.options.sliding_window.value_or(0);
      return !c.Causal() || (position == c.kv_lens[i] - 1 && (w == 0 || w > position));
    }
    return true;  // A padding row: never read.
  };
  bool q_infinite = false;
  for (int k = in.Byte() % 3; k > 0; --k) {  // Into q: NaN anywhere, +-inf as above.
    const int64_t elems = c.num_tokens * QTokenStride(c);
    if (elems == 0) break;
    const int64_t at = static_cast<int64_t>(in.U32() % elems);
    float value = kValues[in.Byte() % 3];
    if (masked_may_skip && !row_sees_every_key(at / QTokenStride(c))) value = NAN;
    q_infinite = q_infinite || std::isinf(value);
    c.q.Store(at, value);
    c.injected += " q[flat " + std::to_string(at) + "]=" + std::to_string(value);
  }
  if (c.kv_dtype == DType::kI8) return;
  const int64_t slots = c.num_pages * c.page_size;
  std::vector<int8_t> state(static_cast<size_t>(slots), 0);  // 1: all see it, 2: some mask it.
  ForEachReadSlot(c, [&](int64_t i, int64_t t, int64_t page, int64_t slot) {
    const int64_t kv_len = c.kv_lens[i];
    const int64_t q_len = c.QLen(i);
    const int64_t w = c.options.sliding_window.value_or(0);
    const bool all_see =
        q_len == 0 || (c.want_mask ? c.KeptByAll(i, t)
                                   : !c.Causal() || (t <= kv_len - q_len &&
                                                     (w == 0 || t > kv_len - 1 - w)));
    int8_t& s = state[static_cast<size_t>(page * c.page_size + slot)];
    s = (all_see && s != 2) ? 1 : 2;
  });
  std::vector<int64_t> candidates;
  for (int64_t s = 0; s < slots; ++s) {
    if (state[static_cast<size_t>(s)] == 1) candidates.push_back(s);
  }
  if (candidates.empty()) return;
  // Spread of a row's logits below 80 (e^-80 is a normal f32, and bf16's range is f32's).
  const bool weights_stay_normal = 2 * LogitBound(c, q_infinite) < 80;
  for (int k = in.Byte() % 4; k > 0; --k) {
    const int64_t s = candidates[in.Byte() % candidates.size()];
    const bool is_v = in.Byte() & 1;
    const int64_t h = in.Byte() % c.num_kv_heads;
    const int64_t d = in.Byte() % c.head_dim;
    float value = kValues[in.Byte() % 3];
    if (c.kv_dtype == DType::kF8E4M3FN) value = NAN;  // No inf: it would saturate.
    if (is_v && !weights_stay_normal) value = NAN;
    Buffer& b = (is_v && c.layout != Layout::kCombined) ? c.v : c.k;
    b.Store(c.CacheOffset(s / c.page_size, s % c.page_size, h, is_v) + d, value);
    c.injected += std::string(" ") + (is_v ? "V" : "K") + "(page " +
                  std::to_string(s / c.page_size) + ", slot " + std::to_string(s % c.page_size) +
                  ", head " + std::to_string(h) + ", d " + std::to_string(d) +
                  ")=" + std::to_string(value);
  }
  if (c.want_sinks && c.num_q_heads > 0 && in.Byte() % 4 == 0) {
    const size_t h = in.Byte() % c.sinks.size();
    c.sinks[h] = -INFINITY;
    c.injected += " sinks[" + std::to_string(h) + "]=-inf";
  }
}

}  // namespace

int64_t RaggedCase::CacheOffset(int64_t page, int64_t slot, int64_t head, bool is_v) const {
  const int64_t ps = PageStride(*this);
  switch (layout) {
    case Layout::kCombined:
      return page * ps + slot * 2 * num_kv_heads * head_dim + (2 * head + is_v) * head_dim;
    case Layout::kNHD:
      return page * ps + slot * num_kv_heads * head_dim + head * head_dim;
    case Layout::kHND:
      return page * ps + head * page_size * head_dim + slot * head_dim;
  }
  return 0;
}

int64_t RaggedCase::CacheElements() const { return num_pages * PageStride(*this); }

TensorView RaggedCase::Q() const {
  const int64_t es = QElemStride(*this);
  return TensorView(q.Data(), q.dtype, {num_tokens, num_q_heads, head_dim},
                    {QTokenStride(*this), head_dim * es, es});
}

TensorView RaggedCase::K() const {
  const int64_t ps = PageStride(*this);
  switch (layout) {
    case Layout::kCombined: {
      const int64_t heads = 2 * num_kv_heads - (perturb == Perturb::kCacheShape ? 1 : 0);
      return TensorView(k.Data(), kv_dtype, {num_pages, page_size, heads, head_dim},
                        {ps, 2 * num_kv_heads * head_dim, head_dim, 1});
    }
    case Layout::kNHD:
      return TensorView(k.Data(), kv_dtype, {num_pages, page_size, num_kv_heads, head_dim},
                        {ps, num_kv_heads * head_dim, head_dim, 1});
    case Layout::kHND:
      return TensorView(k.Data(), kv_dtype, {num_pages, num_kv_heads, page_size, head_dim},
                        {ps, page_size * head_dim, head_dim, 1});
  }
  return {};
}

TensorView RaggedCase::V() const {
  TensorView view = K();
  view.data = v.Data();
  if (perturb == Perturb::kCacheShape) view.shape[0] += 1;  // v has the spare page.
  return view;
}

TensorView RaggedCase::KvLens() const {
  if (perturb == Perturb::kKvLensDtype) return TensorView(kv_lens64.data(), DType::kI64, {max_num_seqs});
  const int64_t n = perturb == Perturb::kKvLensShape ? max_num_seqs + 1 : max_num_seqs;
  return TensorView(kv_lens.data(), DType::kI32, {n});
}

TensorView RaggedCase::PageIndices() const {
  return TensorView(page_indices.data(), DType::kI32, {max_num_seqs, pages_per_seq},
                    {pi_row_stride, 1});
}

TensorView RaggedCase::CuQLens() const {
  const int64_t n = perturb == Perturb::kCuQLensShape ? max_num_seqs : max_num_seqs + 1;
  return TensorView(cu_q_lens.data(), DType::kI32, {n});
}

TensorView RaggedCase::NumSeqs() const {
  return TensorView(num_seqs.data(), DType::kI32, {static_cast<int64_t>(num_seqs.size())});
}

DType RaggedCase::OutDtype() const {
  if (perturb != Perturb::kOutDtype) return q.dtype;
  return q.dtype == DType::kF32 ? DType::kBF16 : DType::kF32;
}

Buffer RaggedCase::NewOut() const {
  Buffer out(OutDtype(), num_tokens * OutTokenStride(*this), out_offset);
  out.Fill(kSentinel);
  return out;
}

MutableTensorView RaggedCase::OutView(Buffer& out) const {
  return MutableTensorView(out.Data(), out.dtype, {num_tokens, num_q_heads, head_dim},
                           {OutTokenStride(*this), head_dim, 1});
}

std::vector<float> RaggedCase::NewLse() const {
  const int64_t rows = num_tokens + (perturb == Perturb::kLseShape ? 1 : 0);
  std::vector<float> lse(static_cast<size_t>(std::max<int64_t>(rows * num_q_heads, 0) + 1));
  std::memset(lse.data(), kSentinel, lse.size() * sizeof(float));
  return lse;
}

MutableTensorView RaggedCase::LseView(std::vector<float>& lse) const {
  const int64_t rows = num_tokens + (perturb == Perturb::kLseShape ? 1 : 0);
  return MutableTensorView(lse.data(), DType::kF32, {rows, num_q_heads});
}

AttentionOptions RaggedCase::BoundOptions(std::vector<float>* lse) const {
  AttentionOptions o = options;
  if (want_sinks) {
    if (perturb == Perturb::kSinksDtype) {
      o.sinks = TensorView(sinks16.data(), DType::kBF16, {num_q_heads});
    } else {
      o.sinks = TensorView(sinks.data(), DType::kF32, {num_q_heads});
    }
  }
  if (want_lse && lse != nullptr) o.lse = LseView(*lse);
  if (want_mask) {
    o.custom_mask = TensorView(mask.data(), DType::kU8, {static_cast<int64_t>(mask.size())});
  }
  if (want_alibi) o.alibi_slopes = TensorView(alibi_slopes.data(), DType::kF32, {num_q_heads});
  return o;
}

bool RaggedCase::KeptByAll(int64_t seq, int64_t t) const {
  if (!want_mask) return true;
  int64_t at = 0;
  for (int64_t i = 0; i < seq; ++i) at += QLen(i) * kv_lens[i];
  for (int64_t r = 0; r < QLen(seq); ++r) {
    if (mask[static_cast<size_t>(at + r * kv_lens[seq] + t)] == 0) return false;
  }
  return true;
}

bool NewTokensFit(const RaggedCase& c) {
  for (int64_t i = 0; i < c.num_seqs[0]; ++i) {
    if (c.QLen(i) > c.kv_lens[i]) return false;
  }
  return true;
}

std::string RaggedCase::Describe() const {
  std::ostringstream s;
  const char* layouts[] = {"combined", "NHD", "HND"};
  s << "layout=" << layouts[static_cast<int>(layout)] << " q=" << ToString(q.dtype)
    << " kv=" << ToString(kv_dtype) << " tokens=" << num_tokens << " q_heads=" << num_q_heads
    << " kv_heads=" << num_kv_heads << " head_dim=" << head_dim << " pages=" << num_pages
    << " page_size=" << page_size << " max_num_seqs=" << max_num_seqs
    << " pages_per_seq=" << pages_per_seq << " perturb=" << static_cast<int>(perturb)
    << " sane=" << sane << " nan_mode=" << nan_mode << " q_offset=" << q_offset
    << " q_pad=" << q_pad << " out_offset=" << out_offset << " out_pad=" << out_pad
    << " cache_offset=" << cache_offset << " page_pad=" << page_pad << "\n  num_seqs="
    << num_seqs[0] << " kv_lens=[";
  for (int32_t x : kv_lens) s << x << " ";
  s << "] cu_q_lens=[";
  for (int32_t x : cu_q_lens) s << x << " ";
  s << "] page_indices=[";
  for (int32_t x : page_indices) s << x << " ";
  const AttentionOptions& o = options;
  s << "]\n  sm_scale=" << o.sm_scale;
  if (o.sliding_window) s << " sliding_window=" << *o.sliding_window;
  if (o.soft_cap) s << " soft_cap=" << *o.soft_cap;
  if (o.mask_value) s << " mask_value=" << *o.mask_value;
  if (o.k_scale) s << " k_scale=" << *o.k_scale;
  if (o.v_scale) s << " v_scale=" << *o.v_scale;
  if (o.num_kv_pages_per_block) s << " num_kv_pages_per_block=" << *o.num_kv_pages_per_block;
  if (o.num_queries_per_block) s << " num_queries_per_block=" << *o.num_queries_per_block;
  if (o.vmem_limit_bytes) s << " vmem_limit_bytes=" << *o.vmem_limit_bytes;
  if (o.num_threads) s << " num_threads=" << *o.num_threads;
  if (o.causal) s << " causal=" << *o.causal;
  s << " sinks=" << want_sinks << " lse=" << want_lse << " mask=" << want_mask << " ("
    << mask.size() << " keys) alibi=" << want_alibi;
  if (!injected.empty()) s << "\n  injected:" << injected;
  s << "\n  model: "
    << (expect_error ? expect_reason : "valid");
  return s.str();
}

RaggedCase MakeRaggedCase(Input& in) {
  RaggedCase c;
  c.layout = static_cast<Layout>(in.Byte() % 3);
  c.q_dtype = kQDtypes[in.Byte() % 3];
  c.kv_dtype = kKvDtypes[in.Byte() % 6];
  const uint8_t flags = in.Byte();
  c.nan_mode = flags & 1;
  const bool odd_views = flags & 2;
  const bool raw = flags & 4;
  c.want_sinks = flags & 8;
  c.want_lse = flags & 16;
  const uint8_t p = in.Byte();
  if (p >= 224) c.perturb = static_cast<Perturb>(1 + (p - 224) % (static_cast<int>(Perturb::kCount) - 1));
  if (c.perturb == Perturb::kLseShape) c.want_lse = true;
  if (c.perturb == Perturb::kSinksDtype) c.want_sinks = true;

  // Shapes: small, with a rare zero extent.
  const uint8_t heads = in.Byte();
  c.num_kv_heads = 1 + heads % 3;
  c.num_q_heads = c.num_kv_heads * (1 + (heads / 3) % 3);
  if (heads >= 250) c.num_q_heads = heads % 6;  // Maybe 0 or not a multiple.
  if (heads == 249) c.num_kv_heads = 0;
  const uint8_t hd = in.Byte();
  c.head_dim = hd == 255 ? 0 : 1 + hd % 40;
  const uint8_t ps = in.Byte();
  c.page_size = ps == 255 ? 0 : ps >= 240 ? 16 : 1 + ps % 9;
  c.num_pages = in.Byte() % 9;
  c.max_num_seqs = in.Byte() % 6;
  c.pages_per_seq = in.Byte() % 7;
  c.num_tokens = in.Byte() % 25;
  c.pi_row_stride = c.pages_per_seq + (odd_views ? in.Byte() % 3 : 0);
  if (odd_views) {
    c.q_offset = in.Byte() % 2;
    c.q_pad = in.Byte() % 3;
    c.out_offset = in.Byte() % 2;
    c.out_pad = in.Byte() % 3;
    c.cache_offset = in.Byte() % 2;
    c.page_pad = in.Byte() % 3;
  }

  // Metadata, raw values included.
  const int64_t M = c.max_num_seqs;
  c.num_seqs.assign(c.perturb == Perturb::kNumSeqsShape ? 2 : 1, in.Meta(0, M));
  c.kv_lens.assign(static_cast<size_t>(M + 1), 0);
  for (int64_t i = 0; i < M; ++i) c.kv_lens[i] = in.Meta(0, c.pages_per_seq * std::max<int64_t>(c.page_size, 1));
  c.cu_q_lens.assign(static_cast<size_t>(M + 1), 0);
  if (in.Byte() < 220) {  // Running sums, as a scheduler builds them.
    int64_t start = in.Byte() < 10 ? in.Meta(0, 2) : 0;
    c.cu_q_lens[0] = static_cast<int32_t>(start);
    for (int64_t i = 0; i < M; ++i) {
      const int64_t room = std::min<int64_t>(std::max(c.kv_lens[i], 0), c.num_tokens - start);
      start += in.Meta(0, room);
      c.cu_q_lens[i + 1] = static_cast<int32_t>(start);
    }
  } else {
    for (int64_t i = 0; i <= M; ++i) c.cu_q_lens[i] = in.Meta(0, c.num_tokens);
  }
  c.page_indices.assign(static_cast<size_t>(M * c.pi_row_stride + 1), INT32_MIN);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t col = 0; col < c.pages_per_seq; ++col) {
      c.page_indices[i * c.pi_row_stride + col] = in.Meta(0, c.num_pages - 1);
    }
  }
  c.page_indices.resize(static_cast<size_t>(M * c.pi_row_stride));
  c.kv_lens64.assign(c.kv_lens.begin(), c.kv_lens.begin() + M);
  if (c.perturb != Perturb::kKvLensShape) c.kv_lens.resize(static_cast<size_t>(M));

  ChooseOptions(in, raw, c);
  if (in.Byte() % 4 == 0) ChooseMask(in, c);
  if (in.Byte() % 4 == 0) {
    c.want_alibi = true;
    c.alibi_slopes.resize(static_cast<size_t>(std::max<int64_t>(c.num_q_heads, 0)));
    for (float& s : c.alibi_slopes) s = raw ? static_cast<float>(in.F64()) : in.Unit() * 0.5f;
  }
  c.sane = !raw;
  const uint64_t seed = in.U64();
  const bool sink_nan = c.want_sinks && in.Byte() == 7;

  // Buffers, exactly sized.
  const DType q_dtype = c.perturb == Perturb::kQDtype ? DType::kI8 : c.q_dtype;
  c.q = Buffer(q_dtype, c.num_tokens * QTokenStride(c), c.q_offset);
  const int64_t cache = c.CacheElements();
  c.k = Buffer(c.kv_dtype, cache, c.cache_offset);
  if (c.layout != Layout::kCombined) {
    c.v = Buffer(c.kv_dtype, cache + PageStride(c), c.cache_offset);  // A spare page.
  }
  FillData(c, seed);
  if (sink_nan && !c.sinks.empty()) c.sinks[0] = NAN;
  for (size_t h = 0; h < c.sinks.size(); ++h) c.sinks16[h] = BF16FromF32(c.sinks[h]).bits;

  c.expect_reason = ModelError(c);
  c.expect_error = !c.expect_reason.empty();
  if (c.nan_mode && !c.expect_error) {
    // docs/contract.md §1 lets the kernel skip masked keys when mask_value <= -1e4,
    // assuming finite logits; a -inf logit on every visible key would make
    // the reference fall back to the (finite) masked ones. With mask -inf
    // both see no key there.
    if (!c.options.mask_value || *c.options.mask_value <= -1e4) {
      c.options.mask_value = -std::numeric_limits<double>::infinity();
    }
    InjectNonFinite(in, c);
  }
  return c;
}

void CallRagged(const RaggedCase& c, bool reference, const AttentionOptions& options,
                const MutableTensorView& out) {
  if (c.layout == Layout::kCombined) {
    if (reference) {
      RefRaggedPagedAttention(c.Q(), c.K(),
                              PageTable{c.KvLens(), c.PageIndices(), c.CuQLens(), c.NumSeqs()},
                              options, out);
    } else {
      RaggedPagedAttention(c.Q(), c.K(),
                           PageTable{c.KvLens(), c.PageIndices(), c.CuQLens(), c.NumSeqs()},
                           options, out);
    }
  } else {
    const KVLayout layout = c.layout == Layout::kNHD ? KVLayout::kNHD : KVLayout::kHND;
    if (reference) {
      RefRaggedPagedAttention(c.Q(), KVPages{c.K(), c.V(), layout},
                              PageTable{c.KvLens(), c.PageIndices(), c.CuQLens(), c.NumSeqs()},
                              options, out);
    } else {
      RaggedPagedAttention(c.Q(), KVPages{c.K(), c.V(), layout},
                           PageTable{c.KvLens(), c.PageIndices(), c.CuQLens(), c.NumSeqs()},
                           options, out);
    }
  }
}

double AbsTolerance(const RaggedCase& c) { return KvTolerance(c.kv_dtype); }
double RelTolerance(const RaggedCase& c) { return RelTolerance(c.q_dtype, c.kv_dtype); }

}  // namespace rpa::fuzz
