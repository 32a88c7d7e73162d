// `rpa bench`'s peer for MLA (mla-decode): the user's obvious alternative
// built from oneDNN's bf16 matmuls and a plain softmax, as
// testing/onednn_peer.h is for attention.
//
// Per sequence (its q_len * num_heads rows stacked as the M dimension):
//   1. gather its latents from the paged caches into dense bf16 K [kv_len,
//      ckv + kpe] (ckv then kpe per key) and its q rows into Q [M, ckv +
//      kpe] (q_nope then q_pe);
//   2. S = Q K^T, a oneDNN matmul (bf16 in, f32 out), every key;
//   3. scale, causal mask, softmax in plain C++, P rounded to bf16;
//   4. O = P V with V the first ckv columns of K (a strided view: no copy), a
//      oneDNN matmul, f32 out, rounded to bf16 into the output.
// f32 inputs where oneDNN has no bf16 matmul, as onednn_peer.h says.
// Steps 1 and 3 on `threads` OpenMP threads, the matmuls on oneDNN's.
// bf16 q and latents only. Without oneDNN (OnednnPeerInfo in
// onednn_peer.h says why), the constructor throws std::runtime_error.
#ifndef RPA_TESTING_ONEDNN_MLA_PEER_H_
#define RPA_TESTING_ONEDNN_MLA_PEER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "testing/mla_batch.h"

namespace rpa::testing {

class OnednnMlaPeer {
 public:
  // Creates the primitives for `batch` (bf16; it must outlive the peer) on
  // `threads` threads. Throws std::runtime_error without oneDNN and
  // std::invalid_argument for a batch it does not cover.
  OnednnMlaPeer(const MlaBatch& batch, int threads, double sm_scale, bool causal);
  ~OnednnMlaPeer();
  OnednnMlaPeer(const OnednnMlaPeer&) = delete;
  OnednnMlaPeer& operator=(const OnednnMlaPeer&) = delete;

  // One MLA of the batch into out (bf16 [num_tokens, num_heads, ckv]).
  void Run(uint8_t* out);

  // oneDNN's implementation of the QK^T / PV matmuls.
  const std::string& MatmulImpl() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rpa::testing

#endif  // RPA_TESTING_ONEDNN_MLA_PEER_H_
