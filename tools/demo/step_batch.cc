#include "demo/step_batch.h"

#include <algorithm>
#include <cstring>

namespace rpa::tools {
namespace {

std::vector<std::vector<uint8_t>> LayerBuffers(int layers, size_t bytes) {
  return std::vector<std::vector<uint8_t>>(static_cast<size_t>(layers),
                                           std::vector<uint8_t>(bytes, 0));
}

}  // namespace

StepBatch::StepBatch(const ModelShape& shape, const StepBatchSize& size)
    : shape_(shape), size_(size),
      kv_lens_(static_cast<size_t>(size.max_num_seqs), 0),
      page_indices_(static_cast<size_t>(size.max_num_seqs) * size.pages_per_seq, 0),
      cu_q_lens_(static_cast<size_t>(size.max_num_seqs) + 1, 0),
      num_seqs_(1, 0) {
  const size_t tokens = static_cast<size_t>(size.max_num_batched_tokens);
  const size_t q_bytes = tokens * static_cast<size_t>(shape.QRowElements()) * SizeOf(shape.q_dtype);
  const size_t kv_bytes =
      tokens * static_cast<size_t>(shape.KvRowElements()) * SizeOf(shape.kv_dtype);
  q_ = LayerBuffers(shape.layers, q_bytes);
  out_ = LayerBuffers(shape.layers, q_bytes);
  new_k_ = LayerBuffers(shape.layers, kv_bytes);
  new_v_ = LayerBuffers(shape.layers, kv_bytes);
}

void StepBatch::Build(const StepSchedule& schedule, const ActivationPool& activations) {
  std::fill(kv_lens_.begin(), kv_lens_.end(), 0);
  std::fill(page_indices_.begin(), page_indices_.end(), 0);  // vLLM pads with page 0.
  cu_q_lens_[0] = 0;
  const size_t q_row = activations.QRowBytes();
  const size_t kv_row = activations.KvRowBytes();
  for (size_t i = 0; i < schedule.seqs.size(); ++i) {
    const ScheduledSeq& seq = schedule.seqs[i];
    kv_lens_[i] = seq.kv_len;
    std::copy(seq.pages->begin(), seq.pages->end(),
              page_indices_.begin() + static_cast<ptrdiff_t>(i) * size_.pages_per_seq);
    cu_q_lens_[i + 1] = cu_q_lens_[i] + seq.q_len;
    for (int32_t j = 0; j < seq.q_len; ++j) {
      const size_t row = static_cast<size_t>(cu_q_lens_[i] + j);
      const int32_t position = seq.kv_len - seq.q_len + j;
      for (int l = 0; l < shape_.layers; ++l) {
        std::memcpy(q_[l].data() + row * q_row, activations.Q(l, seq.request, position), q_row);
        std::memcpy(new_k_[l].data() + row * kv_row, activations.K(l, seq.request, position),
                    kv_row);
        std::memcpy(new_v_[l].data() + row * kv_row, activations.V(l, seq.request, position),
                    kv_row);
      }
    }
  }
  const size_t live = schedule.seqs.size();
  std::fill(cu_q_lens_.begin() + static_cast<ptrdiff_t>(live) + 1, cu_q_lens_.end(),
            cu_q_lens_[live]);
  num_seqs_[0] = static_cast<int32_t>(live);
}

PageTable StepBatch::Table() const {
  const int64_t seqs = size_.max_num_seqs;
  return PageTable{TensorView(kv_lens_.data(), DType::kI32, {seqs}),
                   TensorView(page_indices_.data(), DType::kI32, {seqs, size_.pages_per_seq}),
                   TensorView(cu_q_lens_.data(), DType::kI32, {seqs + 1}),
                   TensorView(num_seqs_.data(), DType::kI32, {1})};
}

TensorView StepBatch::Q(int layer) const {
  return TensorView(q_[layer].data(), shape_.q_dtype,
                    {size_.max_num_batched_tokens, shape_.num_q_heads, shape_.head_dim});
}
TensorView StepBatch::NewK(int layer) const {
  return TensorView(new_k_[layer].data(), shape_.kv_dtype,
                    {size_.max_num_batched_tokens, shape_.num_kv_heads, shape_.head_dim});
}
TensorView StepBatch::NewV(int layer) const {
  return TensorView(new_v_[layer].data(), shape_.kv_dtype,
                    {size_.max_num_batched_tokens, shape_.num_kv_heads, shape_.head_dim});
}
MutableTensorView StepBatch::Out(int layer) {
  return MutableTensorView(out_[layer].data(), shape_.q_dtype,
                           {size_.max_num_batched_tokens, shape_.num_q_heads, shape_.head_dim});
}
TensorView StepBatch::Out(int layer) const {
  return TensorView(out_[layer].data(), shape_.q_dtype,
                    {size_.max_num_batched_tokens, shape_.num_q_heads, shape_.head_dim});
}

}  // namespace rpa::tools
