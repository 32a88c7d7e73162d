// libFuzzer target: JAX's decode-only paged_attention (rpa::PagedAttention)
// over fuzzer-chosen shapes, lengths, page tables and options. Oracle: the
// call throws rpa::Error exactly when the model of docs/contract.md §2-3 says so, with
// out untouched; otherwise each row b matches the reference run on sequence
// b alone (one query at position lengths[b] - 1, q pre-scaled) and rows of
// length 0 are zero. Anything else aborts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "rpa/attention.h"
#include "rpa/error.h"
#include "rpa/reference.h"

using namespace rpa::fuzz;  // NOLINT: a fuzzer's one file.
using rpa::DType;

namespace {

constexpr DType kQDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr DType kKvDtypes[] = {DType::kF32,      DType::kBF16,   DType::kF16,
                               DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8};

enum class Perturb { kNone, kVShape, kQHeadDim, kLengthsShape, kPageRows, kLengthsDtype,
                     kVDtype, kOutDtype, kQStride, kCount };

struct PagedCase {
  int64_t batch = 0, q_heads = 1, kv_heads = 1, head_dim = 1, pages = 0, page_size = 1, pps = 0;
  DType q_dtype = DType::kF32, kv_dtype = DType::kF32;
  Perturb perturb = Perturb::kNone;
  bool sane = true, nan_mode = false;
  std::vector<int32_t> lengths;       // [batch (+1)]
  std::vector<int64_t> lengths64;     // kLengthsDtype.
  std::vector<int32_t> page_indices;  // [batch (+1), pps]
  rpa::PagedAttentionOptions options;
  Buffer q, k, v;
  int64_t q_dim = 1, q_es = 1;  // q's head_dim and innermost stride.

  rpa::TensorView Q() const {
    return rpa::TensorView(q.Data(), q.dtype, {batch, q_heads, q_dim},
                           {q_heads * q_dim * q_es, q_dim * q_es, q_es});
  }
  rpa::TensorView Cache(const Buffer& b, int64_t extra_pages) const {
    return rpa::TensorView(b.Data(), b.dtype, {kv_heads, pages + extra_pages, page_size, head_dim},
                           {(pages + extra_pages) * page_size * head_dim, page_size * head_dim,
                            head_dim, 1});
  }
  rpa::TensorView K() const { return Cache(k, 0); }
  rpa::TensorView V() const { return Cache(v, perturb == Perturb::kVShape ? 1 : 0); }
  rpa::TensorView Lengths() const {
    if (perturb == Perturb::kLengthsDtype) return rpa::TensorView(lengths64.data(), DType::kI64, {batch});
    return rpa::TensorView(lengths.data(), DType::kI32,
                           {batch + (perturb == Perturb::kLengthsShape ? 1 : 0)});
  }
  rpa::TensorView PageIndices() const {
    return rpa::TensorView(page_indices.data(), DType::kI32,
                           {batch + (perturb == Perturb::kPageRows ? 1 : 0), pps});
  }
  DType OutDtype() const {
    if (perturb != Perturb::kOutDtype) return q.dtype;
    return q.dtype == DType::kF32 ? DType::kF16 : DType::kF32;
  }
  Buffer NewOut() const {
    Buffer out(OutDtype(), batch * q_heads * q_dim, 0);
    out.Fill(kSentinelByte);
    return out;
  }
  rpa::MutableTensorView OutView(Buffer& out) const {
    return rpa::MutableTensorView(out.Data(), out.dtype, {batch, q_heads, q_dim});
  }
  static constexpr uint8_t kSentinelByte = 0xA5;

  std::string Describe() const {
    std::ostringstream s;
    s << "paged q=" << ToString(q_dtype) << " kv=" << ToString(kv_dtype) << " batch=" << batch
      << " q_heads=" << q_heads << " kv_heads=" << kv_heads << " head_dim=" << head_dim
      << " pages=" << pages << " page_size=" << page_size << " pps=" << pps
      << " perturb=" << static_cast<int>(perturb) << " sane=" << sane << " nan=" << nan_mode
      << "\n  lengths=[";
    for (int32_t x : lengths) s << x << " ";
    s << "] page_indices=[";
    for (int32_t x : page_indices) s << x << " ";
    s << "]\n  mask_value=" << options.mask_value;
    if (options.attn_logits_soft_cap) s << " soft_cap=" << *options.attn_logits_soft_cap;
    s << " pages_per_compute_block=" << options.pages_per_compute_block;
    if (options.megacore_mode) s << " megacore_mode=" << *options.megacore_mode;
    if (options.num_threads) s << " num_threads=" << *options.num_threads;
    return s.str();
  }
};

std::string ModelError(const PagedCase& c) {
  const rpa::PagedAttentionOptions& o = c.options;
  if (c.perturb == Perturb::kQStride) {
    if (c.head_dim > 1) return "q not contiguous";
  } else if (c.perturb != Perturb::kNone) {
    return "static perturbation";
  }
  if (c.q_heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.page_size <= 0) return "extent";
  if (o.pages_per_compute_block <= 0) return "pages_per_compute_block <= 0";
  if (c.q_heads % c.kv_heads != 0) return "heads";
  if (c.pps % o.pages_per_compute_block != 0) return "pages_per_compute_block divisor";
  if (o.megacore_mode) {
    if (*o.megacore_mode == "kv_head") {
      if (c.kv_heads % 2 != 0) return "megacore kv_head";
    } else if (*o.megacore_mode == "batch") {
      if (c.batch % 2 != 0) return "megacore batch";
    } else {
      return "megacore value";
    }
  }
  if (std::isnan(o.mask_value) || o.mask_value == INFINITY) return "mask_value";
  if (o.attn_logits_soft_cap &&
      (!std::isfinite(*o.attn_logits_soft_cap) || *o.attn_logits_soft_cap == 0.0)) {
    return "soft cap";
  }
  if (o.num_threads && *o.num_threads <= 0) return "num_threads";
  int64_t max_len = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    if (c.lengths[b] < 0) return "length < 0";
    max_len = std::max<int64_t>(max_len, c.lengths[b]);
  }
  if (c.pps < (max_len + c.page_size - 1) / c.page_size) return "pages_per_sequence";
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t col = 0; col < (int64_t{c.lengths[b]} + c.page_size - 1) / c.page_size; ++col) {
      const int32_t page = c.page_indices[b * c.pps + col];
      if (page < 0 || page >= c.pages) return "page index";
    }
  }
  return "";
}

PagedCase MakeCase(Input& in) {
  PagedCase c;
  c.q_dtype = kQDtypes[in.Byte() % 3];
  c.kv_dtype = kKvDtypes[in.Byte() % 6];
  const uint8_t flags = in.Byte();
  c.nan_mode = flags & 1;
  const bool raw = flags & 4;
  const uint8_t p = in.Byte();
  if (p >= 224) c.perturb = static_cast<Perturb>(1 + (p - 224) % (static_cast<int>(Perturb::kCount) - 1));
  const uint8_t heads = in.Byte();
  c.kv_heads = heads == 249 ? 0 : 1 + heads % 3;
  c.q_heads = heads >= 250 ? heads % 6 : std::max<int64_t>(c.kv_heads, 1) * (1 + (heads / 3) % 3);
  const uint8_t hd = in.Byte();
  c.head_dim = hd == 255 ? 0 : 1 + hd % 40;
  const uint8_t ps = in.Byte();
  c.page_size = ps == 255 ? 0 : ps >= 240 ? 16 : 1 + ps % 9;
  c.pages = in.Byte() % 9;
  c.pps = in.Byte() % 7;
  c.batch = in.Byte() % 7;
  const int64_t rows = c.batch + 1;  // Room for the shape perturbations.
  c.lengths.assign(static_cast<size_t>(rows), 0);
  for (int64_t b = 0; b < c.batch; ++b) c.lengths[b] = in.Meta(0, c.pps * std::max<int64_t>(c.page_size, 1));
  c.page_indices.assign(static_cast<size_t>(rows * c.pps), 0);
  for (int64_t i = 0; i < c.batch * c.pps; ++i) c.page_indices[i] = in.Meta(0, c.pages - 1);
  c.lengths64.assign(c.lengths.begin(), c.lengths.end());

  rpa::PagedAttentionOptions& o = c.options;
  switch (in.Byte() % 5) {
    case 0: break;
    case 1: o.mask_value = -INFINITY; break;
    case 2: o.mask_value = -1e4 - in.Unit() * 1e30; break;
    case 3: o.mask_value = -in.Unit() * 30.0; break;
    default: o.mask_value = in.Unit() * 5.0; break;
  }
  if (raw && in.Byte() % 2) o.mask_value = in.F64();
  if (in.Byte() % 3 == 0) {
    o.attn_logits_soft_cap = raw ? in.F64() : (in.Byte() & 1 ? 1.0 : -1.0) * (1.0 + in.Unit() * 49);
  }
  o.pages_per_compute_block = raw ? in.I64() : in.Meta(1, std::max<int64_t>(c.pps, 1));
  const uint8_t mm = in.Byte() % 8;
  if (mm == 5) o.megacore_mode = "kv_head";
  if (mm == 6) o.megacore_mode = "batch";
  if (mm == 7) o.megacore_mode = "sequence";
  o.inline_seq_dim = in.Byte() & 1;
  const uint8_t t = in.Byte() % 16;
  if (t < 12) o.num_threads = 1 + t % 4;
  else if (t == 13) o.num_threads = 0;
  else if (t == 14) o.num_threads = -1;
  c.sane = !raw;

  c.q_dim = c.head_dim + (c.perturb == Perturb::kQHeadDim ? 1 : 0);
  c.q_es = c.perturb == Perturb::kQStride ? 2 : 1;
  Normal normal(in.U64());
  c.q = Buffer(c.q_dtype, c.batch * c.q_heads * c.q_dim * c.q_es, in.Byte() % 2);
  const float q_scale = 2.0f / std::sqrt(static_cast<float>(std::max<int64_t>(c.head_dim, 1)));
  for (int64_t i = 0; i < c.batch * c.q_heads * c.q_dim * c.q_es; ++i) {
    c.q.Store(i, normal.Next() * q_scale);
  }
  const int64_t cache = c.kv_heads * (c.pages + 1) * c.page_size * c.head_dim;
  c.k = Buffer(c.kv_dtype, c.kv_heads * c.pages * c.page_size * c.head_dim, 0);
  c.v = Buffer(c.perturb == Perturb::kVDtype ? (c.kv_dtype == DType::kF32 ? DType::kBF16 : DType::kF32)
                                             : c.kv_dtype,
               cache, in.Byte() % 2);
  // Unit-normal everywhere: in decode every key below the length is seen.
  for (int64_t i = 0; i < c.kv_heads * c.pages * c.page_size * c.head_dim; ++i) c.k.Store(i, normal.Next());
  for (int64_t i = 0; i < cache; ++i) c.v.Store(i, normal.Next());
  if (c.nan_mode) {
    const float kValues[] = {NAN, INFINITY, -INFINITY};
    bool q_infinite = false;
    std::vector<int64_t> v_infinite;  // Where V got +-inf.
    for (int n = in.Byte() % 4; n > 0; --n) {
      Buffer& b = in.Byte() % 3 == 0 ? c.q : (in.Byte() & 1 ? c.k : c.v);
      const int64_t elems = static_cast<int64_t>(b.bytes.size() - b.byte_offset) /
                            static_cast<int64_t>(rpa::SizeOf(b.dtype));
      float value = kValues[in.Byte() % 3];
      if (b.dtype == DType::kF8E4M3FN) value = NAN;
      if (elems == 0 || b.dtype == DType::kI8) continue;
      const int64_t at = static_cast<int64_t>(in.U32() % elems);
      b.Store(at, value);
      if (std::isinf(value)) {
        if (&b == &c.q) q_infinite = true;
        if (&b == &c.v) v_infinite.push_back(at);
      }
    }
    // An infinite q with a soft cap can put a logit ~2 x cap below its row's
    // largest, whose weight underflows to 0 in the kernel (docs/contract.md
    // §1.5): V's infinities become NaN there, which every weight propagates.
    if (q_infinite) {
      for (int64_t at : v_infinite) c.v.Store(at, NAN);
    }
  }
  return c;
}

bool Run(const PagedCase& c, Buffer& out, std::string& message) {
  try {
    rpa::PagedAttention(c.Q(), c.K(), c.V(), c.Lengths(), c.PageIndices(), c.options, c.OutView(out));
    return false;
  } catch (const rpa::Error& e) {
    message = e.what();
    return true;
  } catch (const std::exception& e) {
    Fail(std::string("library threw a non-rpa exception: ") + e.what() + "\n  " + c.Describe());
  }
}

// Row b by the reference: sequence b alone, the cache seen as HND
// [pages, kv_heads, page_size, head_dim] through strides.
void ReferenceRow(const PagedCase& c, int64_t b, Buffer& out) {
  const int64_t row = c.q_heads * c.head_dim;
  Buffer one(c.q_dtype, row, 0);
  const int32_t len = c.lengths[b];
  if (len > 0) {
    rpa::TensorView q_view = c.Q();  // Row b alone, with q's strides.
    q_view.data = static_cast<const uint8_t*>(c.q.Data()) +
                  b * q_view.strides[0] * static_cast<int64_t>(rpa::SizeOf(c.q_dtype));
    q_view.shape[0] = 1;
    auto hnd = [&](const Buffer& buf) {
      return rpa::TensorView(buf.Data(), c.kv_dtype, {c.pages, c.kv_heads, c.page_size, c.head_dim},
                             {c.page_size * c.head_dim, c.pages * c.page_size * c.head_dim,
                              c.head_dim, 1});
    };
    const int32_t kv_lens[1] = {len};
    const int32_t cu[2] = {0, 1};
    const int32_t num_seqs[1] = {1};
    rpa::AttentionOptions o;
    o.sm_scale = 1.0;
    o.mask_value = c.options.mask_value;
    o.soft_cap = c.options.attn_logits_soft_cap;
    rpa::RefRaggedPagedAttention(
        q_view, rpa::KVPages{hnd(c.k), hnd(c.v), rpa::KVLayout::kHND},
        rpa::PageTable{rpa::TensorView(kv_lens, DType::kI32, {1}),
                  rpa::TensorView(c.page_indices.data() + b * c.pps, DType::kI32, {1, c.pps}),
                  rpa::TensorView(cu, DType::kI32, {2}),
                  rpa::TensorView(num_seqs, DType::kI32, {1})},
        o, rpa::MutableTensorView(one.Data(), c.q_dtype, {1, c.q_heads, c.head_dim}));
  }
  for (int64_t i = 0; i < row; ++i) out.Store(b * row + i, len > 0 ? one.Load(i) : 0.0f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const PagedCase c = MakeCase(in);
  if (std::getenv("RPA_FUZZ_PRINT") != nullptr) std::fprintf(stderr, "%s\n", c.Describe().c_str());
  const std::string reason = ModelError(c);
  Buffer out = c.NewOut();
  const Buffer sentinel = c.NewOut();
  const Buffer q0 = c.q, k0 = c.k, v0 = c.v;
  std::string message;
  const bool threw = Run(c, out, message);
  if (threw != !reason.empty()) {
    Fail("validation disagrees with docs/contract.md §3: model " + (reason.empty() ? "valid" : reason) +
         ", library " + (threw ? "threw: " + message : "accepted") + "\n  " + c.Describe());
  }
  if (c.q.bytes != q0.bytes || c.k.bytes != k0.bytes || c.v.bytes != v0.bytes) {
    Fail("an input tensor was written\n  " + c.Describe());
  }
  if (threw) {
    if (out.bytes != sentinel.bytes) Fail("out written on error: " + message + "\n  " + c.Describe());
    return 0;
  }
  if (!c.sane) return 0;  // Raw options: no crash, the right errors.
  Buffer want = c.NewOut();
  try {
    for (int64_t b = 0; b < c.batch; ++b) ReferenceRow(c, b, want);
  } catch (const std::exception& e) {
    Fail(std::string("reference rejected a valid row: ") + e.what() + "\n  " + c.Describe());
  }
  const double tol = KvTolerance(c.kv_dtype);
  const std::string diff = CompareOutputs(out, want, c.batch * c.q_heads * c.head_dim, tol,
                                          RelTolerance(c.q_dtype, c.kv_dtype), "out");
  if (!diff.empty()) Fail("result differs from the reference: " + diff + "\n  " + c.Describe());
  return 0;
}
