#include "testing/mla_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace rpa::testing {
namespace {

int64_t Elem(DType d) { return static_cast<int64_t>(SizeOf(d)); }

// `count` unit-normal values stored as `dtype`.
std::vector<uint8_t> RandomValues(DType dtype, int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint8_t> bytes(static_cast<size_t>(count * Elem(dtype)));
  for (int64_t i = 0; i < count; ++i) StoreFromF32(dtype, bytes.data(), i, normal(rng));
  return bytes;
}

}  // namespace

MlaShape MlaBatch::Shape() const {
  return MlaShape{spec.num_heads, spec.head_dim_ckv, spec.head_dim_kpe, spec.page_size,
                  num_pages,      spec.q_dtype,      spec.kv_dtype};
}

MlaPageTable MlaBatch::PageTable() const {
  const int64_t batch = static_cast<int64_t>(kv_len_arr.size());
  return MlaPageTable{TensorView(qo_indptr.data(), DType::kI32, {batch + 1}),
                      TensorView(kv_indptr.data(), DType::kI32, {batch + 1}),
                      TensorView(kv_indices.data(), DType::kI32,
                                 {static_cast<int64_t>(kv_indices.size())}),
                      TensorView(kv_len_arr.data(), DType::kI32, {batch})};
}

TensorView MlaBatch::QNope() const {
  return TensorView(q_nope.data(), spec.q_dtype, {num_tokens, spec.num_heads, spec.head_dim_ckv});
}

TensorView MlaBatch::QPe() const {
  return TensorView(q_pe.data(), spec.q_dtype, {num_tokens, spec.num_heads, spec.head_dim_kpe});
}

TensorView MlaBatch::CkvCache() const {
  const int64_t ps = spec.page_size, dim = spec.head_dim_ckv;
  if (!spec.combined_cache) return TensorView(ckv.data(), spec.kv_dtype, {num_pages, ps, dim});
  const int64_t row = spec.head_dim_ckv + spec.head_dim_kpe;
  return TensorView(combined.data(), spec.kv_dtype, {num_pages, ps, dim}, {ps * row, row, 1});
}

TensorView MlaBatch::KpeCache() const {
  const int64_t ps = spec.page_size, dim = spec.head_dim_kpe;
  if (!spec.combined_cache) return TensorView(kpe.data(), spec.kv_dtype, {num_pages, ps, dim});
  const int64_t row = spec.head_dim_ckv + spec.head_dim_kpe;
  // An empty cache has no data to offset into.
  const uint8_t* kpe_data =
      combined.empty() ? nullptr : combined.data() + spec.head_dim_ckv * Elem(spec.kv_dtype);
  return TensorView(kpe_data, spec.kv_dtype, {num_pages, ps, dim}, {ps * row, row, 1});
}

std::vector<uint8_t> MlaBatch::NewOutput() const {
  return std::vector<uint8_t>(
      static_cast<size_t>(num_tokens * spec.num_heads * spec.head_dim_ckv * Elem(spec.q_dtype)),
      0xA5);
}

MutableTensorView MlaBatch::OutView(std::vector<uint8_t>& out) const {
  return MutableTensorView(out.data(), spec.q_dtype,
                           {num_tokens, spec.num_heads, spec.head_dim_ckv});
}

double MlaBatch::LatentBytes() const {
  double keys = 0;
  for (int32_t len : kv_len_arr) keys += len;
  return keys * static_cast<double>((spec.head_dim_ckv + spec.head_dim_kpe) * Elem(spec.kv_dtype));
}

MlaBatch MakeMlaBatch(const MlaBatchSpec& spec) {
  MlaBatch b;
  b.spec = spec;
  std::mt19937 rng(spec.seed);
  const int64_t ps = spec.page_size;
  b.qo_indptr.push_back(0);
  b.kv_indptr.push_back(0);
  int64_t used = 0;
  for (const MlaSequence& s : spec.sequences) {
    b.qo_indptr.push_back(static_cast<int32_t>(b.qo_indptr.back() + s.q_len));
    used += (s.kv_len + ps - 1) / ps;
    b.kv_indptr.push_back(static_cast<int32_t>(used));
    b.kv_len_arr.push_back(static_cast<int32_t>(s.kv_len));
  }
  b.num_tokens = b.qo_indptr.back();
  b.num_pages = used + spec.spare_pages;
  std::vector<int32_t> order(static_cast<size_t>(b.num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  b.kv_indices.assign(order.begin(), order.begin() + used);

  const int64_t heads = spec.num_heads, ckv = spec.head_dim_ckv, kpe = spec.head_dim_kpe;
  b.q_nope = RandomValues(spec.q_dtype, b.num_tokens * heads * ckv, rng);
  b.q_pe = RandomValues(spec.q_dtype, b.num_tokens * heads * kpe, rng);
  const DType kv = spec.kv_dtype;
  const int64_t slots = b.num_pages * ps;
  std::vector<uint8_t>& ckv_bytes = spec.combined_cache ? b.combined : b.ckv;
  ckv_bytes.resize(static_cast<size_t>(slots * (spec.combined_cache ? ckv + kpe : ckv) * Elem(kv)));
  if (!spec.combined_cache) b.kpe.resize(static_cast<size_t>(slots * kpe * Elem(kv)));
  // Every slot NaN, then each sequence's keys random.
  const TensorView ckv_view = b.CkvCache(), kpe_view = b.KpeCache();
  auto store = [&](const TensorView& v, int64_t page, int64_t slot, int64_t d, float value) {
    const int64_t at = page * v.strides[0] + slot * v.strides[1] + d;
    StoreFromF32(kv, const_cast<void*>(v.data), at, value);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t page = 0; page < b.num_pages; ++page) {
    for (int64_t slot = 0; slot < ps; ++slot) {
      for (int64_t d = 0; d < ckv; ++d) store(ckv_view, page, slot, d, nan);
      for (int64_t d = 0; d < kpe; ++d) store(kpe_view, page, slot, d, nan);
    }
  }
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < spec.sequences.size(); ++i) {
    for (int64_t t = 0; t < spec.sequences[i].kv_len; ++t) {
      const int64_t page = b.kv_indices[b.kv_indptr[i] + t / ps];
      for (int64_t d = 0; d < ckv; ++d) store(ckv_view, page, t % ps, d, normal(rng));
      for (int64_t d = 0; d < kpe; ++d) store(kpe_view, page, t % ps, d, normal(rng));
    }
  }
  return b;
}

MlaReferenceResult MlaReference(const MlaBatch& b, bool causal, double sm_scale,
                                double kv_scale) {
  const MlaBatchSpec& spec = b.spec;
  const int64_t heads = spec.num_heads, ckv = spec.head_dim_ckv, kpe = spec.head_dim_kpe;
  const int64_t dim = ckv + kpe;
  const TensorView ckv_view = b.CkvCache(), kpe_view = b.KpeCache();
  MlaReferenceResult r;
  r.out.assign(static_cast<size_t>(b.num_tokens * heads * ckv), 0.0);
  r.lse.assign(static_cast<size_t>(b.num_tokens * heads), -INFINITY);
  std::vector<double> keys, q(static_cast<size_t>(dim)), logits;
  for (size_t seq = 0; seq < b.kv_len_arr.size(); ++seq) {
    const int64_t q_len = b.qo_indptr[seq + 1] - b.qo_indptr[seq], kv_len = b.kv_len_arr[seq];
    // The sequence's latents [kv_len][ckv + kpe], read through its pages.
    keys.assign(static_cast<size_t>(kv_len * dim), 0.0);
    for (int64_t t = 0; t < kv_len; ++t) {
      const int64_t page = b.kv_indices[b.kv_indptr[seq] + t / spec.page_size];
      const int64_t slot = t % spec.page_size;
      for (int64_t d = 0; d < dim; ++d) {
        const TensorView& v = d < ckv ? ckv_view : kpe_view;
        keys[t * dim + d] = LoadAsF32(spec.kv_dtype, v.data, page * v.strides[0] +
                                                              slot * v.strides[1] +
                                                              (d < ckv ? d : d - ckv));
      }
    }
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t token = b.qo_indptr[seq] + i;
      const int64_t visible = causal ? kv_len - q_len + i + 1 : kv_len;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = token * heads + h;
        for (int64_t d = 0; d < ckv; ++d) q[d] = LoadAsF32(spec.q_dtype, b.q_nope.data(), row * ckv + d);
        for (int64_t d = 0; d < kpe; ++d) {
          q[ckv + d] = LoadAsF32(spec.q_dtype, b.q_pe.data(), row * kpe + d);
        }
        logits.assign(static_cast<size_t>(visible), 0.0);
        double max_logit = -INFINITY;
        for (int64_t t = 0; t < visible; ++t) {
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += q[d] * keys[t * dim + d];
          logits[t] = dot * sm_scale * kv_scale;
          max_logit = std::max(max_logit, logits[t]);
        }
        if (visible == 0) continue;
        double sum = 0;
        for (int64_t t = 0; t < visible; ++t) sum += std::exp(logits[t] - max_logit);
        r.lse[row] = max_logit + std::log(sum);
        double* out = r.out.data() + row * ckv;
        for (int64_t t = 0; t < visible; ++t) {
          const double w = std::exp(logits[t] - max_logit) / sum * kv_scale;
          for (int64_t d = 0; d < ckv; ++d) out[d] += w * keys[t * dim + d];
        }
      }
    }
  }
  return r;
}

}  // namespace rpa::testing
