"""rpa.BatchMLAAttention: DeepSeek's multi-head latent attention, FlashInfer's calls.

MLA in the absorbed form (FlashInfer's BatchMLAPagedAttentionWrapper): every
cached token holds one latent ckv [head_dim_ckv] and one rotary key kpe
[head_dim_kpe], shared by all heads; each q head attends with
    logit = (q_nope . ckv + q_pe . kpe) * sm_scale * kv_scale
    out   = softmax(logit) . ckv * kv_scale.
The C++ object is rpa::MlaPlan (rpa/mla.h); every check and message is the
library's. docs/mla.md maps FlashInfer's and vLLM's calls onto this one.
"""

from __future__ import annotations

from . import _rpa
from ._api import _as_array, _as_codes, _dtype_name, _empty_like, _lse_like, _table


class BatchMLAAttention:
  """MLA over a paged latent cache, planned once per step and run per layer.

      w = rpa.BatchMLAAttention()
      w.plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads=16,
             head_dim_ckv=512, head_dim_kpe=64, page_size=64, causal=True,
             sm_scale=192 ** -0.5, q_data_type="bfloat16",
             num_pages=ckv_cache.shape[0])
      for layer in range(num_layers):
        out = w.run(q_nope[layer], q_pe[layer], ckv_cache[layer], kpe_cache[layer])

  vLLM's combined cache kv_cache [num_blocks, block_size, 576] is passed as
  its two slices, kv_cache[..., :512] and kv_cache[..., 512:] (no copy). The
  plan keeps its own copy of the page table; runs may come from several
  threads at once, and `plan` waits for them.

  Args:
    num_threads: worker threads; None uses RPA_NUM_THREADS, else every core.

  Returns:
    A wrapper without a plan: `plan` before `run`.
  """

  def __init__(self, num_threads: int | None = None):
    self._num_threads = num_threads
    self._plan_object = _rpa.MlaPlan()

  def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads: int,
           head_dim_ckv: int, head_dim_kpe: int, page_size: int, causal: bool,
           sm_scale: float, q_data_type, kv_data_type=None, *, num_pages: int) -> None:
    """Plans the step (FlashInfer's plan(); num_pages beyond it).

    Args:
      qo_indptr, kv_indptr: int32[batch_size + 1]: sequence i's query rows
        qo_indptr[i]:qo_indptr[i+1] and pages
        kv_indices[kv_indptr[i]:kv_indptr[i+1]].
      kv_indices: int32 page indices, kv_len_arr: int32[batch_size] each
        sequence's keys (its new tokens included: q_len <= kv_len).
      num_heads: q heads (1..128); head_dim_ckv / head_dim_kpe: 512 / 64 for
        DeepSeek (multiples of 16); page_size: tokens per page.
      causal: each query sees the keys up to its own position, bottom-right
        aligned (a sequence's q_len queries are its last q_len keys).
      sm_scale: the logit scale (DeepSeek: 192 ** -0.5 times its mscale**2).
      q_data_type: q's and out's dtype (bfloat16, float16, float32);
        kv_data_type: the caches' (None for q's; also float8_e4m3fn).
      num_pages: the caches' shape[0]: every page read must be below it.

    Returns:
      None.

    Raises:
      ValueError (rpa.Error): the library's message; the previous plan stays.
    """
    self._plan_object.plan(
        _table((qo_indptr, kv_indptr, kv_indices, kv_len_arr)), num_heads=num_heads,
        head_dim_ckv=head_dim_ckv, head_dim_kpe=head_dim_kpe, page_size=page_size,
        causal=bool(causal), sm_scale=sm_scale, q_data_type=_dtype_name(q_data_type),
        kv_data_type=None if kv_data_type is None else _dtype_name(kv_data_type),
        num_pages=num_pages, num_threads=self._num_threads)

  def run(self, q_nope, q_pe, ckv_cache, kpe_cache, *, out=None, lse=None,
          return_lse: bool = False, kv_scale: float | None = None):
    """Runs the plan for one layer.

    Args:
      q_nope: [num_tokens, num_heads, head_dim_ckv], q_pe: [num_tokens,
        num_heads, head_dim_kpe], of the planned q_data_type; num_tokens =
        qo_indptr[-1].
      ckv_cache: [num_pages, page_size, head_dim_ckv], kpe_cache: [num_pages,
        page_size, head_dim_kpe], of the planned kv_data_type (a float8
        tensor, or its uint8 codes); any strides but the last.
      out: [num_tokens, num_heads, head_dim_ckv] to write (and return); None
        allocates one. Untouched on error.
      lse: float32[num_tokens, num_heads] to write each row's log-sum-exp
        into (natural log: FlashInfer's base-2 LSE is lse * log2(e)).
      return_lse: also return the LSE (a new array when lse is None).
      kv_scale: the caches' dequantization scale (vLLM's fp8 k_scale).

    Returns:
      out, or (out, lse) with return_lse.
    """
    ckv, own = _as_codes(ckv_cache, None, "ckv_cache")
    kpe, own = _as_codes(kpe_cache, own, "kpe_cache")
    q_nope = _as_array(q_nope)
    if out is None:
      out = _empty_like(q_nope)
    if lse is None and return_lse:
      lse = _lse_like(q_nope)
    result = self._plan_object.run(q_nope, _as_array(q_pe), ckv, kpe, out, lse=lse,
                                   kv_scale=kv_scale, kv_dtype=own)
    return (result, lse) if return_lse else result

  @property
  def info(self) -> dict:
    """The plan: shape (num_tokens resolved), causal, num_seqs, num_threads
    and the kernel; planned=False before the first plan."""
    return self._plan_object.info()
