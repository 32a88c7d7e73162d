// libFuzzer target: the fused KV write (RaggedPagedAttentionWithKVWrite,
// combined and split layouts). On top of the ragged oracle: new_k / new_v of
// any KV dtype, possibly strided or malformed; on error the cache and out
// are bit-identical; on success the cache equals an independent write (row
// cu_q_lens[i] + j to position kv_len - q_len + j, stored as x / scale,
// sequences in order) bit for bit, and out matches the reference run on
// that cache.
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "ragged_case.h"
#include "rpa/error.h"
#include "rpa/kv_cache.h"

using namespace rpa::fuzz;  // NOLINT: a fuzzer's one file.

namespace {

constexpr rpa::DType kKvDtypes[] = {rpa::DType::kF32,      rpa::DType::kBF16,
                                    rpa::DType::kF16,      rpa::DType::kF8E4M3FN,
                                    rpa::DType::kF8E5M2,   rpa::DType::kI8};

struct NewRows {
  Buffer k, v;
  int64_t token_stride = 0;
  int64_t elem_stride = 1;  // 2: not contiguous (an error when head_dim > 1).
  int64_t extra_rows = 0;   // 1: a row too many (an error).
  bool v_f64 = false;       // new_v as float64 (an error).
};

rpa::MutableTensorView Mutable(const rpa::TensorView& view, void* data) {
  rpa::MutableTensorView m;
  m.data = data;
  m.dtype = view.dtype;
  m.rank = view.rank;
  m.shape = view.shape;
  m.strides = view.strides;
  return m;
}

rpa::TensorView RowsView(const RaggedCase& c, const NewRows& r, const Buffer& b) {
  return rpa::TensorView(b.Data(), b.dtype, {c.num_tokens + r.extra_rows, c.num_kv_heads, c.head_dim},
                         {r.token_stride, c.head_dim * r.elem_stride, r.elem_stride});
}

// The write as docs/contract.md and kv_cache.h describe it, into copies of the cache.
void ExpectedWrite(const RaggedCase& c, const NewRows& r, Buffer& k, Buffer& v) {
  const float ks = static_cast<float>(c.options.k_scale.value_or(1.0));
  const float vs = static_cast<float>(c.options.v_scale.value_or(1.0));
  const bool combined = c.layout == Layout::kCombined;
  for (int64_t i = 0; i < c.num_seqs[0]; ++i) {
    const int64_t q_len = c.QLen(i);
    const int64_t kv_len = c.kv_lens[i];
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t pos = kv_len - q_len + j;
      const int64_t page = c.page_indices[i * c.pi_row_stride + pos / c.page_size];
      const int64_t slot = pos % c.page_size;
      const int64_t row = c.cu_q_lens[i] + j;
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        const int64_t src = row * r.token_stride + h * c.head_dim * r.elem_stride;
        const int64_t kd = c.CacheOffset(page, slot, h, false);
        const int64_t vd = c.CacheOffset(page, slot, h, true);
        for (int64_t d = 0; d < c.head_dim; ++d) {
          k.Store(kd + d, r.k.Load(src + d * r.elem_stride) / ks);
          (combined ? k : v).Store(vd + d, r.v.Load(src + d * r.elem_stride) / vs);
        }
      }
    }
  }
}

bool Run(const RaggedCase& c, const NewRows& r, Buffer& k, Buffer& v, Buffer& out,
         std::vector<float>& lse, std::string& message) {
  try {
    const rpa::AttentionOptions options = c.BoundOptions(&lse);
    const rpa::TensorView new_k = RowsView(c, r, r.k), new_v = RowsView(c, r, r.v);
    if (c.layout == Layout::kCombined) {
      rpa::RaggedPagedAttentionWithKVWrite(
          c.Q(), new_k, new_v, Mutable(c.K(), k.Data()),
          rpa::PageTable{c.KvLens(), c.PageIndices(), c.CuQLens(), c.NumSeqs()}, options,
          c.OutView(out));
    } else {
      rpa::RaggedPagedAttentionWithKVWrite(
          c.Q(), new_k, new_v,
          rpa::MutableKVPages{Mutable(c.K(), k.Data()), Mutable(c.V(), v.Data()),
                         c.layout == Layout::kNHD ? rpa::KVLayout::kNHD : rpa::KVLayout::kHND},
          rpa::PageTable{c.KvLens(), c.PageIndices(), c.CuQLens(), c.NumSeqs()}, options,
          c.OutView(out));
    }
    return false;
  } catch (const rpa::Error& e) {
    message = e.what();
    return true;
  } catch (const std::exception& e) {
    Fail(std::string("library threw a non-rpa exception: ") + e.what() + "\n  " + c.Describe());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const RaggedCase c = MakeRaggedCase(in);
  if (std::getenv("RPA_FUZZ_PRINT") != nullptr) std::fprintf(stderr, "%s\n", c.Describe().c_str());

  NewRows rows;
  const rpa::DType new_dtype = kKvDtypes[in.Byte() % 6];
  const uint8_t p = in.Byte();
  if (p >= 240) {
    switch (p % 3) {
      case 0: rows.extra_rows = 1; break;
      case 1: rows.v_f64 = true; break;
      default: rows.elem_stride = 2; break;
    }
  }
  rows.token_stride = c.num_kv_heads * c.head_dim * rows.elem_stride + in.Byte() % 3;
  const int64_t row_elems = (c.num_tokens + rows.extra_rows) * rows.token_stride;
  rows.k = Buffer(new_dtype, row_elems, in.Byte() % 2);
  rows.v = Buffer(rows.v_f64 ? rpa::DType::kF64 : new_dtype, row_elems, 0);
  Normal normal(in.U64());
  for (int64_t i = 0; i < row_elems; ++i) {
    rows.k.Store(i, normal.Next());
    rows.v.Store(i, normal.Next());
  }
  std::string reason = c.expect_reason;
  if (reason.empty()) {
    if (rows.extra_rows || rows.v_f64) reason = "new rows malformed";
    if (rows.elem_stride == 2 && c.head_dim > 1) reason = "new rows not contiguous";
    if (reason.empty() && !NewTokensFit(c)) reason = "new tokens beyond kv_len";
  }
  const bool expect_error = !reason.empty();

  Buffer k = c.k, v = c.v;
  Buffer out = c.NewOut();
  const Buffer sentinel = c.NewOut();
  std::vector<float> lse = c.NewLse();
  const std::vector<float> lse_sentinel = c.NewLse();
  std::string message;
  const bool threw = Run(c, rows, k, v, out, lse, message);
  if (threw != expect_error) {
    Fail("validation disagrees with docs/contract.md §3: model " +
         (expect_error ? "error (" + reason + ")" : std::string("valid")) + ", library " +
         (threw ? "threw: " + message : "accepted") + "\n  " + c.Describe());
  }
  if (threw) {
    if (k.bytes != c.k.bytes || v.bytes != c.v.bytes) {
      Fail("cache written on error: " + message + "\n  " + c.Describe());
    }
    if (out.bytes != sentinel.bytes) Fail("out written on error: " + message + "\n  " + c.Describe());
    if (lse != lse_sentinel) Fail("lse written on error: " + message + "\n  " + c.Describe());
    return 0;
  }

  RaggedCase expected = c;
  ExpectedWrite(c, rows, expected.k, expected.v);
  if (k.bytes != expected.k.bytes || v.bytes != expected.v.bytes) {
    Fail("cache after the write differs from the expected write (new dtype " +
         std::string(rpa::ToString(new_dtype)) + ")\n  " + c.Describe());
  }
  if (!c.sane) return 0;  // Raw options: no crash, the right errors.
  Buffer out_ref = c.NewOut();
  std::vector<float> lse_ref = c.NewLse();
  try {
    CallRagged(expected, /*reference=*/true, expected.BoundOptions(&lse_ref),
               expected.OutView(out_ref));
  } catch (const std::exception& e) {
    Fail(std::string("reference rejected what the fused write accepted: ") + e.what() + "\n  " +
         c.Describe());
  }
  const int64_t n = static_cast<int64_t>(out.bytes.size() - out.byte_offset) /
                    static_cast<int64_t>(rpa::SizeOf(out.dtype));
  std::string diff = CompareOutputs(out, out_ref, n, AbsTolerance(c), RelTolerance(c), "out");
  if (diff.empty() && c.want_lse) {
    const double tol = 4 * AbsTolerance(c);
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::memcmp(&lse[i], &lse_ref[i], sizeof(float)) != 0 &&
          !Close(lse[i], lse_ref[i], tol, tol)) {
        diff = "lse[flat " + std::to_string(i) + "]";
        break;
      }
    }
  }
  if (!diff.empty()) Fail("result differs from the reference: " + diff + "\n  " + c.Describe());
  return 0;
}
