// The user's obvious alternative to rpa, timed beside it by `rpa bench`
// (issue 15, "a peer in the same run"): an unfused attention built from
// oneDNN's bf16 matmuls and a plain softmax.
//
// Per sequence and per kv head (its G = num_q_heads / num_kv_heads q heads
// stacked as the M dimension):
//   1. gather that sequence's K and V rows of the kv head from the paged
//      cache into dense bf16 [kv_len, head_dim], and its q rows into dense
//      bf16 [G * q_len, head_dim];
//   2. S = Q K^T, a oneDNN matmul (bf16 in, f32 out), [G * q_len, kv_len],
//      every key (the masked ones too, as an unfused matmul must);
//   3. scale, causal mask and softmax in plain C++ (f32, one vectorizable
//      loop per row), P rounded to bf16 (masked keys: 0);
//   4. O = P V, a oneDNN matmul (bf16 in, f32 out), [G * q_len, head_dim];
//   5. O rounded to bf16 into the output, rows outside the batch zeroed.
// oneDNN 2.x has bf16 matmuls only on AVX-512 CPUs; elsewhere (AVX2) the
// peer does what a user there does: it widens the gathered rows to f32,
// keeps P in f32 and runs f32 matmuls (MatmulImpl says which).
// Steps 1, 3 and 5 run on `threads` OpenMP threads, the matmuls on oneDNN's
// (OpenMP) threads, as many. The primitives are created once per (q_len,
// kv_len, threads) in the constructor and reused by every Run.
//
// Only rpa's default options: bf16 q and bf16 K/V in JAX's combined layout,
// sm_scale, causal; no sliding window, soft cap, sinks or scales.
//
// Built without oneDNN (CMake did not find libdnnl-dev, or
// RPA_ONEDNN_PEER=OFF), OnednnPeerInfo().available is false with the reason
// and the constructor throws std::runtime_error.
#ifndef RPA_TESTING_ONEDNN_PEER_H_
#define RPA_TESTING_ONEDNN_PEER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "testing/synthetic_batch.h"

namespace rpa::testing {

struct OnednnPeerInfo {
  bool available = false;
  std::string reason;    // Why not, when !available.
  std::string version;   // "2.6.3"
  std::string isa;       // dnnl_get_effective_cpu_isa(), e.g. "avx512_core_amx".
  std::string threading; // "OpenMP", "TBB", ...
};
OnednnPeerInfo GetOnednnPeerInfo();

// Where one Run's time went, in seconds.
struct OnednnPeerPhases {
  double gather_s = 0;   // K, V and q rows to dense bf16.
  double qk_s = 0;       // The QK^T matmuls.
  double softmax_s = 0;  // Scale, mask, softmax, P to bf16.
  double pv_s = 0;       // The PV matmuls.
  double write_s = 0;    // O to bf16 into the output (and the zeroed rows).
};

class OnednnPeer {
 public:
  // Creates the primitives for `batch`'s sequences on `threads` threads
  // (>= 1). Throws std::runtime_error without oneDNN, and
  // std::invalid_argument for a batch it does not cover (not bf16).
  OnednnPeer(const SyntheticBatch& batch, int threads, double sm_scale);
  ~OnednnPeer();
  OnednnPeer(const OnednnPeer&) = delete;
  OnednnPeer& operator=(const OnednnPeer&) = delete;

  // One attention of `batch` (the q, page table and shapes given to the
  // constructor, which must outlive the peer) over `kv_pages`, a cache of
  // the batch's layout and size (batch.kv_pages or a copy of it), into
  // `out` (bf16, [batch.num_tokens, num_q_heads, head_dim]).
  void Run(const uint8_t* kv_pages, uint8_t* out);

  // One entry per Run since the last ClearPhases, in order.
  const std::vector<OnednnPeerPhases>& Phases() const;
  void ClearPhases();

  // oneDNN's implementations of the largest sequence's QK^T / PV matmuls
  // and their input type, e.g. "brg:avx512_core_amx_bf16 / ..., inputs bf16".
  const std::string& MatmulImpl() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rpa::testing

#endif  // RPA_TESTING_ONEDNN_PEER_H_
