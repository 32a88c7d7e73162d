// The oneDNN peers of `rpa bench` (testing/onednn_peer.h, and the MLA one
// of testing/onednn_mla_peer.h at the end). Compiled with
// -ffast-math (this file alone, and never at link time, so no FTZ/DAZ for
// the process) so that GCC vectorizes the softmax's expf through glibc's
// libmvec, as a user's -O3 -ffast-math softmax would be; every value it
// exponentiates is finite.
#include "testing/onednn_peer.h"
#include "testing/onednn_mla_peer.h"

#include <stdexcept>

#ifndef RPA_ONEDNN_PEER_REASON
#define RPA_ONEDNN_PEER_REASON "built without oneDNN"
#endif

#if RPA_HAVE_ONEDNN

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace rpa::testing {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point& t) {
  const Clock::time_point now = Clock::now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}

std::string IsaName(dnnl::cpu_isa isa) {
  switch (static_cast<dnnl_cpu_isa_t>(isa)) {
    case dnnl_cpu_isa_all: return "all";
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "isa_" + std::to_string(static_cast<int>(isa));
  }
}

// bf16 <-> f32 (round to nearest even; every value here is finite).
inline uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// 64-byte aligned scratch, grown never (sized for the batch's largest
// sequence in the constructor).
template <typename T>
struct Aligned {
  T* data = nullptr;
  explicit Aligned(size_t n)
      : data(static_cast<T*>(::operator new(std::max<size_t>(n, 1) * sizeof(T),
                                            std::align_val_t(64)))) {}
  ~Aligned() { ::operator delete(data, std::align_val_t(64)); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
};

// The x86-64 clones let the loops use AVX-512 or AVX2 (and libmvec's expf
// of that width) where the CPU has them, as a user's -march=native build
// would; the binary still runs on any x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RPA_PEER_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RPA_PEER_CLONES
#endif

// exp((s - max) * scale) in place over a row's first `visible` logits;
// returns their sum.
RPA_PEER_CLONES float ExpRow(float* s, int64_t visible, float scale) {
  float max_s = s[0];
  for (int64_t i = 1; i < visible; ++i) max_s = std::max(max_s, s[i]);
  float sum = 0;
  for (int64_t i = 0; i < visible; ++i) {
    const float e = std::exp((s[i] - max_s) * scale);
    s[i] = e;
    sum += e;
  }
  return sum;
}

// A row of P: the first `visible` of e times inv, the rest of n 0.
RPA_PEER_CLONES void ProbabilityRow(const float* e, uint16_t* p, int64_t visible, int64_t n,
                                    float inv) {
  for (int64_t i = 0; i < visible; ++i) p[i] = ToBf16(e[i] * inv);
  for (int64_t i = visible; i < n; ++i) p[i] = 0;
}
RPA_PEER_CLONES void ProbabilityRow(const float* e, float* p, int64_t visible, int64_t n,
                                    float inv) {
  for (int64_t i = 0; i < visible; ++i) p[i] = e[i] * inv;
  for (int64_t i = visible; i < n; ++i) p[i] = 0;
}

// n f32 values to bf16 at dst.
RPA_PEER_CLONES void RowToBf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ToBf16(src[i]);
}

// n bf16 values widened to f32 at dst (exact).
RPA_PEER_CLONES void RowToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

// The matmuls' input type (Q, K, V and P). bf16 where oneDNN has a bf16
// matmul for this CPU; oneDNN 2.x has none below AVX-512 (avx512_core), and
// there a user widens the bf16 rows to f32 as they gather them (and keeps P
// in f32), as the peer then does.
struct MatmulInputs {
  dt type = dt::bf16;

  explicit MatmulInputs(const dnnl::engine& engine);
  size_t ElemBytes() const { return type == dt::bf16 ? 2 : 4; }
  // "bf16", or "f32 (...why)" for MatmulImpl.
  std::string Describe() const {
    return type == dt::bf16 ? "bf16" : "f32 (oneDNN has no bf16 matmul for this CPU)";
  }
  // n bf16 values into element `index` of the input buffer at base.
  void Store(const uint16_t* src, uint8_t* base, int64_t index, int64_t n) const {
    uint8_t* dst = base + static_cast<size_t>(index) * ElemBytes();
    if (type == dt::bf16) {
      std::memcpy(dst, src, static_cast<size_t>(n) * 2);
    } else {
      RowToF32(src, reinterpret_cast<float*>(dst), n);
    }
  }
  // Softmax of a row of S (f32, clobbered) into element `index` of P: its
  // first `visible` logits times scale, the rest 0.
  void Softmax(float* s, uint8_t* p_base, int64_t index, int64_t visible, int64_t n,
               float scale) const {
    const float inv = 1.0f / ExpRow(s, visible, scale);
    uint8_t* p = p_base + static_cast<size_t>(index) * ElemBytes();
    if (type == dt::bf16) {
      ProbabilityRow(s, reinterpret_cast<uint16_t*>(p), visible, n, inv);
    } else {
      ProbabilityRow(s, reinterpret_cast<float*>(p), visible, n, inv);
    }
  }
};

MatmulInputs::MatmulInputs(const dnnl::engine& engine) {
  // A small bf16 matmul: creating its primitive descriptor fails where
  // oneDNN has no implementation for this CPU.
  const dnnl::memory::desc a({16, 16}, dt::bf16, tag::ab), c({16, 16}, dt::f32, tag::ab);
  try {
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(engine, a, a, c);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine);
#endif
  } catch (const dnnl::error&) {
    type = dt::f32;
  }
}

struct Shape {
  int64_t q_len = 0, kv_len = 0;
  dnnl::matmul qk, pv;
  dnnl::memory q, k, s, p, v, o;
};

// The memory descriptors and buffers of one shape's two matmuls:
// Q x K^T -> S and P x V -> O.
struct MatmulOperands {
  dnnl::memory::desc q, kt, s, p, v, o;
  void *q_data, *k_data, *s_data, *p_data, *v_data, *o_data;
};

// Builds the shape's two matmuls and binds their operands; returns the
// implementations oneDNN chose ("qk impl / pv impl").
std::string BuildMatmuls(const dnnl::engine& engine, const MatmulOperands& m, Shape* shape) {
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::matmul::primitive_desc qk_pd(engine, m.q, m.kt, m.s);
  const dnnl::matmul::primitive_desc pv_pd(engine, m.p, m.v, m.o);
#else
  const dnnl::matmul::primitive_desc qk_pd(dnnl::matmul::desc(m.q, m.kt, m.s), engine);
  const dnnl::matmul::primitive_desc pv_pd(dnnl::matmul::desc(m.p, m.v, m.o), engine);
#endif
  shape->qk = dnnl::matmul(qk_pd);
  shape->pv = dnnl::matmul(pv_pd);
  shape->q = dnnl::memory(m.q, engine, m.q_data);
  shape->k = dnnl::memory(m.kt, engine, m.k_data);
  shape->s = dnnl::memory(m.s, engine, m.s_data);
  shape->p = dnnl::memory(m.p, engine, m.p_data);
  shape->v = dnnl::memory(m.v, engine, m.v_data);
  shape->o = dnnl::memory(m.o, engine, m.o_data);
  return std::string(qk_pd.impl_info_str()) + " / " + pv_pd.impl_info_str();
}

}  // namespace

OnednnPeerInfo GetOnednnPeerInfo() {
  OnednnPeerInfo info;
  info.available = true;
  const dnnl_version_t* v = dnnl_version();
  info.version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                 std::to_string(v->patch);
  info.isa = IsaName(dnnl::get_effective_cpu_isa());
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  info.threading = "OpenMP";
#elif DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_TBB
  info.threading = "TBB";
#elif DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_SEQ
  info.threading = "sequential";
#else
  info.threading = "other";
#endif
  return info;
}

struct OnednnPeer::Impl {
  const SyntheticBatch& batch;
  int threads;
  float scale;
  int64_t H, KH, G, D;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  MatmulInputs inputs{engine};
  size_t max_rows = 0, max_kv = 0;
  std::unique_ptr<Aligned<uint8_t>> q, k, v, p;  // Of inputs.type.
  std::unique_ptr<Aligned<float>> s, o;
  std::vector<Shape> shapes;
  std::vector<int> seq_shape;  // Index into shapes per sequence.
  std::string impl;
  std::vector<OnednnPeerPhases> history;

  Impl(const SyntheticBatch& b, int t, double sm_scale)
      : batch(b),
        threads(std::max(1, t)),
        scale(static_cast<float>(sm_scale)),
        H(b.spec.num_q_heads),
        KH(b.spec.num_kv_heads),
        G(b.spec.num_q_heads / b.spec.num_kv_heads),
        D(b.spec.head_dim) {
    if (b.spec.q_dtype != DType::kBF16 || b.spec.kv_dtype != DType::kBF16) {
      throw std::invalid_argument("the oneDNN peer covers bf16 q and bf16 K/V only");
    }
    // oneDNN sizes its parallel work by the thread count at creation.
    omp_set_num_threads(threads);
    const int32_t num_seqs = b.num_seqs[0];
    std::map<std::pair<int64_t, int64_t>, int> index;
    int64_t largest = -1;
    for (int32_t seq = 0; seq < num_seqs; ++seq) {
      const int64_t q_len = b.cu_q_lens[seq + 1] - b.cu_q_lens[seq];
      const int64_t kv_len = b.kv_lens[seq];
      auto [it, inserted] = index.try_emplace({q_len, kv_len}, static_cast<int>(shapes.size()));
      if (inserted) {
        Shape shape;
        shape.q_len = q_len;
        shape.kv_len = kv_len;
        shapes.push_back(std::move(shape));
      }
      seq_shape.push_back(it->second);
      max_rows = std::max<size_t>(max_rows, static_cast<size_t>(G * q_len));
      max_kv = std::max<size_t>(max_kv, static_cast<size_t>(kv_len));
      if (q_len > 0 && G * q_len * kv_len > largest) {
        largest = G * q_len * kv_len;
      }
    }
    const size_t width = inputs.ElemBytes();
    q = std::make_unique<Aligned<uint8_t>>(max_rows * D * width);
    k = std::make_unique<Aligned<uint8_t>>(max_kv * D * width);
    v = std::make_unique<Aligned<uint8_t>>(max_kv * D * width);
    p = std::make_unique<Aligned<uint8_t>>(max_rows * max_kv * width);
    s = std::make_unique<Aligned<float>>(max_rows * max_kv);
    o = std::make_unique<Aligned<float>>(max_rows * D);
    int64_t largest_seen = -1;
    for (Shape& shape : shapes) {
      if (shape.q_len == 0 || shape.kv_len == 0) continue;
      const int64_t M = G * shape.q_len, N = shape.kv_len;
      // Q [M, D] x K^T [D, N] (K^T as a view of the dense K [N, D]) -> S [M, N].
      const dnnl::memory::desc q_md({M, D}, inputs.type, tag::ab);
      const dnnl::memory::desc kt_md({D, N}, inputs.type, tag::ba);
      const dnnl::memory::desc s_md({M, N}, dt::f32, tag::ab);
      // P [M, N] x V [N, D] -> O [M, D].
      const dnnl::memory::desc p_md({M, N}, inputs.type, tag::ab);
      const dnnl::memory::desc v_md({N, D}, inputs.type, tag::ab);
      const dnnl::memory::desc o_md({M, D}, dt::f32, tag::ab);
      const std::string chosen = BuildMatmuls(
          engine, {q_md, kt_md, s_md, p_md, v_md, o_md, q->data, k->data, s->data, p->data,
                   v->data, o->data},
          &shape);
      if (M * N > largest_seen) {
        largest_seen = M * N;
        impl = chosen + ", inputs " + inputs.Describe();
      }
    }
  }

  void Run(const uint8_t* kv_pages, uint8_t* out_bytes) {
    omp_set_num_threads(threads);
    OnednnPeerPhases phases;
    Clock::time_point clock = Clock::now();
    const int nt = threads;
    const int64_t page_size = batch.spec.page_size;
    const int64_t pages_per_seq = batch.pages_per_seq;
    const int64_t row = 2 * KH * D;  // Elements per (page, slot).
    const auto* cache = reinterpret_cast<const uint16_t*>(kv_pages);
    const auto* q_all = reinterpret_cast<const uint16_t*>(batch.q.data());
    auto* out = reinterpret_cast<uint16_t*>(out_bytes);
    const int32_t num_seqs = batch.num_seqs[0];
    const int64_t first = batch.cu_q_lens[0], last = batch.cu_q_lens[num_seqs];
    // Rows no sequence owns are zeros, as rpa writes them.
    std::memset(out, 0, static_cast<size_t>(first * H * D) * 2);
    std::memset(out + last * H * D, 0, static_cast<size_t>((batch.num_tokens - last) * H * D) * 2);
    phases.write_s += Since(clock);
    for (int32_t seq = 0; seq < num_seqs; ++seq) {
      Shape& shape = shapes[static_cast<size_t>(seq_shape[static_cast<size_t>(seq)])];
      const int64_t q_len = shape.q_len, kv_len = shape.kv_len;
      if (q_len == 0) continue;
      const int64_t q0 = batch.cu_q_lens[seq];
      const int64_t context = kv_len - q_len;
      const int32_t* pages = batch.page_indices.data() + seq * pages_per_seq;
      const int64_t M = G * q_len;
      for (int64_t kh = 0; kh < KH; ++kh) {
        // 1. Gather K, V and the kv head's q rows into dense matmul inputs.
        const MatmulInputs& in = inputs;
        uint8_t* k_dense = k->data;
        uint8_t* v_dense = v->data;
#pragma omp parallel for num_threads(nt) schedule(static) if (kv_len >= 256)
        for (int64_t t = 0; t < kv_len; ++t) {
          const int64_t slot = static_cast<int64_t>(pages[t / page_size]) * page_size + t % page_size;
          const uint16_t* src = cache + slot * row + 2 * kh * D;
          in.Store(src, k_dense, t * D, D);
          in.Store(src + D, v_dense, t * D, D);
        }
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t t = 0; t < q_len; ++t) {
            in.Store(q_all + ((q0 + t) * H + kh * G + g) * D, q->data, (g * q_len + t) * D, D);
          }
        }
        phases.gather_s += Since(clock);
        // 2. S = Q K^T.
        shape.qk.execute(stream, {{DNNL_ARG_SRC, shape.q},
                                  {DNNL_ARG_WEIGHTS, shape.k},
                                  {DNNL_ARG_DST, shape.s}});
        stream.wait();
        phases.qk_s += Since(clock);
        // 3. Scale, causal mask, softmax; P of the inputs' type.
        float* s_rows = s->data;
        uint8_t* p_rows = p->data;
        const float sc = scale;
#pragma omp parallel for num_threads(nt) schedule(static) if (M * kv_len >= 16384)
        for (int64_t r = 0; r < M; ++r) {
          const int64_t visible = context + r % q_len + 1;
          in.Softmax(s_rows + r * kv_len, p_rows, r * kv_len, visible, kv_len, sc);
        }
        phases.softmax_s += Since(clock);
        // 4. O = P V.
        shape.pv.execute(stream, {{DNNL_ARG_SRC, shape.p},
                                  {DNNL_ARG_WEIGHTS, shape.v},
                                  {DNNL_ARG_DST, shape.o}});
        stream.wait();
        phases.pv_s += Since(clock);
        // 5. O to bf16, into the output's [token, q head, dim] rows.
        const float* o_rows = o->data;
#pragma omp parallel for num_threads(nt) schedule(static) if (M * D >= 65536)
        for (int64_t r = 0; r < M; ++r) {
          const int64_t g = r / q_len, t = r % q_len;
          RowToBf16(o_rows + r * D, out + ((q0 + t) * H + kh * G + g) * D, D);
        }
        phases.write_s += Since(clock);
      }
    }
    history.push_back(phases);
  }
};

OnednnPeer::OnednnPeer(const SyntheticBatch& batch, int threads, double sm_scale)
    : impl_(std::make_unique<Impl>(batch, threads, sm_scale)) {}
OnednnPeer::~OnednnPeer() = default;
void OnednnPeer::Run(const uint8_t* kv_pages, uint8_t* out) { impl_->Run(kv_pages, out); }
const std::string& OnednnPeer::MatmulImpl() const { return impl_->impl; }
const std::vector<OnednnPeerPhases>& OnednnPeer::Phases() const { return impl_->history; }
void OnednnPeer::ClearPhases() { impl_->history.clear(); }

// ---- The MLA peer (testing/onednn_mla_peer.h): the same helpers.

struct OnednnMlaPeer::Impl {
  const MlaBatch& batch;
  int threads;
  float scale;
  bool causal;
  int64_t H, C, R, D;  // Heads, ckv, kpe, ckv + kpe.
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  MatmulInputs inputs{engine};
  std::unique_ptr<Aligned<uint8_t>> q, k, p;  // Of inputs.type.
  std::unique_ptr<Aligned<float>> s, o;
  std::vector<Shape> shapes;
  std::vector<int> seq_shape;
  std::string impl;

  Impl(const MlaBatch& b, int t, double sm_scale, bool is_causal)
      : batch(b),
        threads(std::max(1, t)),
        scale(static_cast<float>(sm_scale)),
        causal(is_causal),
        H(b.spec.num_heads),
        C(b.spec.head_dim_ckv),
        R(b.spec.head_dim_kpe),
        D(b.spec.head_dim_ckv + b.spec.head_dim_kpe) {
    if (b.spec.q_dtype != DType::kBF16 || b.spec.kv_dtype != DType::kBF16) {
      throw std::invalid_argument("the oneDNN MLA peer covers bf16 q and latents only");
    }
    omp_set_num_threads(threads);
    std::map<std::pair<int64_t, int64_t>, int> index;
    size_t max_rows = 0, max_kv = 0;
    for (size_t seq = 0; seq < b.kv_len_arr.size(); ++seq) {
      const int64_t q_len = b.qo_indptr[seq + 1] - b.qo_indptr[seq], kv_len = b.kv_len_arr[seq];
      auto [it, inserted] = index.try_emplace({q_len, kv_len}, static_cast<int>(shapes.size()));
      if (inserted) {
        Shape shape;
        shape.q_len = q_len;
        shape.kv_len = kv_len;
        shapes.push_back(std::move(shape));
      }
      seq_shape.push_back(it->second);
      max_rows = std::max<size_t>(max_rows, static_cast<size_t>(H * q_len));
      max_kv = std::max<size_t>(max_kv, static_cast<size_t>(kv_len));
    }
    const size_t width = inputs.ElemBytes();
    q = std::make_unique<Aligned<uint8_t>>(max_rows * D * width);
    k = std::make_unique<Aligned<uint8_t>>(max_kv * D * width);
    p = std::make_unique<Aligned<uint8_t>>(max_rows * max_kv * width);
    s = std::make_unique<Aligned<float>>(max_rows * max_kv);
    o = std::make_unique<Aligned<float>>(max_rows * C);
    for (Shape& shape : shapes) {
      if (shape.q_len == 0 || shape.kv_len == 0) continue;
      const int64_t M = H * shape.q_len, N = shape.kv_len;
      const dnnl::memory::desc q_md({M, D}, inputs.type, tag::ab);
      const dnnl::memory::desc kt_md({D, N}, inputs.type, tag::ba);  // K^T as a view of K.
      const dnnl::memory::desc s_md({M, N}, dt::f32, tag::ab);
      const dnnl::memory::desc p_md({M, N}, inputs.type, tag::ab);
      // V: the first C columns of K's rows of D.
      const dnnl::memory::desc v_md({N, C}, inputs.type, dnnl::memory::dims{D, 1});
      const dnnl::memory::desc o_md({M, C}, dt::f32, tag::ab);
      // V reads K's buffer: the latent's first C columns.
      impl = BuildMatmuls(engine,
                          {q_md, kt_md, s_md, p_md, v_md, o_md, q->data, k->data, s->data,
                           p->data, k->data, o->data},
                          &shape) +
             ", inputs " + inputs.Describe();
    }
  }

  void Run(uint8_t* out_bytes) {
    omp_set_num_threads(threads);
    const int nt = threads;
    const int64_t ps = batch.spec.page_size;
    const TensorView ckv = batch.CkvCache(), kpe = batch.KpeCache();
    const auto* ckv_data = static_cast<const uint16_t*>(ckv.data);
    const auto* kpe_data = static_cast<const uint16_t*>(kpe.data);
    const auto* q_nope = reinterpret_cast<const uint16_t*>(batch.q_nope.data());
    const auto* q_pe = reinterpret_cast<const uint16_t*>(batch.q_pe.data());
    auto* out = reinterpret_cast<uint16_t*>(out_bytes);
    for (size_t seq = 0; seq < batch.kv_len_arr.size(); ++seq) {
      Shape& shape = shapes[static_cast<size_t>(seq_shape[seq])];
      const int64_t q_len = shape.q_len, kv_len = shape.kv_len;
      if (q_len == 0) continue;
      const int64_t q0 = batch.qo_indptr[seq], M = H * q_len;
      const int32_t* pages = batch.kv_indices.data() + batch.kv_indptr[seq];
      const MatmulInputs& in = inputs;
      uint8_t* k_dense = k->data;
#pragma omp parallel for num_threads(nt) schedule(static) if (kv_len >= 256)
      for (int64_t t = 0; t < kv_len; ++t) {
        const int64_t page = pages[t / ps], slot = t % ps;
        in.Store(ckv_data + page * ckv.strides[0] + slot * ckv.strides[1], k_dense, t * D, C);
        in.Store(kpe_data + page * kpe.strides[0] + slot * kpe.strides[1], k_dense, t * D + C, R);
      }
      // Row r = head * q_len + token (rows of one head adjacent).
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < q_len; ++t) {
          const int64_t row = (h * q_len + t) * D;
          in.Store(q_nope + ((q0 + t) * H + h) * C, q->data, row, C);
          in.Store(q_pe + ((q0 + t) * H + h) * R, q->data, row + C, R);
        }
      }
      shape.qk.execute(stream, {{DNNL_ARG_SRC, shape.q}, {DNNL_ARG_WEIGHTS, shape.k},
                                {DNNL_ARG_DST, shape.s}});
      stream.wait();
      float* s_rows = s->data;
      uint8_t* p_rows = p->data;
      const float sc = scale;
      const bool is_causal = causal;
#pragma omp parallel for num_threads(nt) schedule(static) if (M * kv_len >= 16384)
      for (int64_t r = 0; r < M; ++r) {
        const int64_t visible = is_causal ? kv_len - q_len + r % q_len + 1 : kv_len;
        in.Softmax(s_rows + r * kv_len, p_rows, r * kv_len, visible, kv_len, sc);
      }
      shape.pv.execute(stream, {{DNNL_ARG_SRC, shape.p}, {DNNL_ARG_WEIGHTS, shape.v},
                                {DNNL_ARG_DST, shape.o}});
      stream.wait();
      const float* o_rows = o->data;
#pragma omp parallel for num_threads(nt) schedule(static) if (M * C >= 65536)
      for (int64_t r = 0; r < M; ++r) {
        const int64_t h = r / q_len, t = r % q_len;
        RowToBf16(o_rows + r * C, out + ((q0 + t) * H + h) * C, C);
      }
    }
  }
};

OnednnMlaPeer::OnednnMlaPeer(const MlaBatch& batch, int threads, double sm_scale, bool causal)
    : impl_(std::make_unique<Impl>(batch, threads, sm_scale, causal)) {}
OnednnMlaPeer::~OnednnMlaPeer() = default;
void OnednnMlaPeer::Run(uint8_t* out) { impl_->Run(out); }
const std::string& OnednnMlaPeer::MatmulImpl() const { return impl_->impl; }

}  // namespace rpa::testing

#else  // !RPA_HAVE_ONEDNN

namespace rpa::testing {

OnednnPeerInfo GetOnednnPeerInfo() {
  OnednnPeerInfo info;
  info.reason = RPA_ONEDNN_PEER_REASON;
  return info;
}

struct OnednnPeer::Impl {};

OnednnPeer::OnednnPeer(const SyntheticBatch&, int, double) {
  throw std::runtime_error(RPA_ONEDNN_PEER_REASON);
}
OnednnPeer::~OnednnPeer() = default;
void OnednnPeer::Run(const uint8_t*, uint8_t*) { throw std::runtime_error(RPA_ONEDNN_PEER_REASON); }
const std::string& OnednnPeer::MatmulImpl() const {
  static const std::string none;
  return none;
}
const std::vector<OnednnPeerPhases>& OnednnPeer::Phases() const {
  static const std::vector<OnednnPeerPhases> none;
  return none;
}
void OnednnPeer::ClearPhases() {}

struct OnednnMlaPeer::Impl {};

OnednnMlaPeer::OnednnMlaPeer(const MlaBatch&, int, double, bool) {
  throw std::runtime_error(RPA_ONEDNN_PEER_REASON);
}
OnednnMlaPeer::~OnednnMlaPeer() = default;
void OnednnMlaPeer::Run(uint8_t*) { throw std::runtime_error(RPA_ONEDNN_PEER_REASON); }
const std::string& OnednnMlaPeer::MatmulImpl() const {
  static const std::string none;
  return none;
}

}  // namespace rpa::testing

#endif  // RPA_HAVE_ONEDNN
