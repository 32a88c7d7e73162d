"""Shared-prefix (cascade) attention: rpa.CascadeAttention, FlashInfer's
MultiLevelCascadeAttentionWrapper on the CPU.

Requests that share a system prompt or a few-shot prefix read the same pages
again for every request in a flat page table. A cascade gives each level of
sharing its own CSR page table over the same query rows: level 0 typically
has one entry per shared prefix holding every row that shares it, the last
level each request's own tokens. Each level is one rpa.BatchAttention plan;
a shared level's entry is one sequence of many query rows, so its pages are
read once per kv head for all of those rows (a many-row task, the matrix
kernels) instead of once per request. The levels' partial attentions are
combined by their log-sum-exps (rpa.merge_states), which is exact: the result
is attention over the union of each row's keys (docs/contract.md §1.6).
"""

from __future__ import annotations

from ._api import _as_array, _error, merge_states
from ._batch import BatchAttention, _default_sm_scale

# The per-level table arguments of plan(), in order.
_TABLES = ("qo_indptr_arr", "kv_indptr_arr", "kv_indices_arr", "kv_last_page_len_arr")


class CascadeAttention:
  """Multi-level cascade attention, planned once per step and run per layer.

      w = rpa.CascadeAttention(2, kv_layout="NHD")
      w.plan([shared_qo, unique_qo], [shared_kv_indptr, unique_kv_indptr],
             [shared_indices, unique_indices], [shared_last, unique_last],
             num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
             num_pages=k_cache.shape[0], q_dtype="bfloat16")
      out = w.run(q, (k_cache, v_cache))

  Args:
    num_levels: the page tables each plan takes (>= 1).
    kv_layout: "NHD", "HND" or "combined", as for rpa.BatchAttention.
    num_threads: worker threads; None uses RPA_NUM_THREADS, else every core.

  Returns:
    A wrapper without a plan: `plan` before `run`.
  """

  def __init__(self, num_levels: int, kv_layout: str = "NHD", num_threads: int | None = None):
    if not isinstance(num_levels, int) or isinstance(num_levels, bool) or num_levels < 1:
      raise _error("option", f"num_levels={num_levels!r} must be an int >= 1. Pass the number "
                   "of page tables each plan takes (2: a shared prefix and each request's own "
                   "tokens).")
    self._levels = [BatchAttention(kv_layout=kv_layout, num_threads=num_threads)
                    for _ in range(num_levels)]

  @property
  def num_levels(self) -> int:
    return len(self._levels)

  def plan(self, qo_indptr_arr, kv_indptr_arr, kv_indices_arr, kv_last_page_len_arr, *,
           num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, num_pages: int,
           q_dtype, kv_dtype=None, sm_scale: float | None = None, causal: bool = False,
           **options) -> None:
    """Plans every level from its FlashInfer CSR page table.

    Args:
      qo_indptr_arr, kv_indptr_arr, kv_indices_arr, kv_last_page_len_arr:
        num_levels arrays each, level l's CSR page table as for
        BatchAttention.plan_csr. Every level's query rows are rows of the
        same q: qo_indptr_arr[l][-1] <= qo_indptr_arr[-1][-1], the last
        level's, which is q.shape[0].
      Keyword-only: num_q_heads, num_kv_heads, head_dim, page_size,
        num_pages, q_dtype, kv_dtype as for BatchAttention.plan.
      sm_scale: None for 1 / sqrt(head_dim), as FlashInfer.
      causal: the last level's mask (FlashInfer's default False); the levels
        above it are never causal: every row sees all of a shared level's
        keys.
      soft_cap / logits_soft_cap, window_left / sliding_window (last level
        only, with causal), mask_value, k_scale, v_scale, alibi_slopes,
        num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes: as
        for BatchAttention.plan, for every level (a window or custom mask is
        the last level's only).

    Raises:
      ValueError (rpa.Error): a table list of the wrong length, or the
        library's message for any level (naming it); the previous plan is
        kept only if the error came before any level was planned.
    """
    tables = (qo_indptr_arr, kv_indptr_arr, kv_indices_arr, kv_last_page_len_arr)
    for name, table in zip(_TABLES, tables):
      if not isinstance(table, (list, tuple)) or len(table) != self.num_levels:
        got = len(table) if isinstance(table, (list, tuple)) else type(table).__name__
        raise _error("shape", f"{name} holds {got} page tables, but this CascadeAttention has "
                     f"num_levels={self.num_levels}. Pass one array per level, level 0 the "
                     "most shared.")
    last_only = ("window_left", "sliding_window", "custom_mask", "packed_custom_mask")
    shared = {k: v for k, v in options.items() if k not in last_only}
    if sm_scale is None:
      sm_scale = _default_sm_scale(head_dim)
    num_tokens = int(_as_array(qo_indptr_arr[-1])[-1])
    shape = dict(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                 page_size=page_size, num_pages=num_pages, q_dtype=q_dtype, kv_dtype=kv_dtype,
                 num_tokens=num_tokens, sm_scale=sm_scale)
    for level, wrapper in enumerate(self._levels):
      last = level == self.num_levels - 1
      level_options = dict(options if last else shared, causal=bool(causal) if last else False)
      try:
        wrapper.plan_csr(*(t[level] for t in tables), **shape, **level_options)
      except ValueError as e:
        raise _error(getattr(e, "kind", "metadata"), f"level {level}: {e}") from e

  def run(self, q, kv_pages, *, out=None, return_lse: bool = False):
    """Attention over every level's keys for each row of q.

    Args:
      q: [num_tokens, num_q_heads, head_dim] of the planned q_dtype.
      kv_pages: the layer's cache in the wrapper's kv_layout.
      out: an array like q to write into; None allocates one.
      return_lse: also return the merged natural-log LSE,
        float32[num_tokens, num_q_heads].

    Returns:
      out, or (out, lse): each level's attention merged by its LSE.
    """
    merged, lse = self._levels[0].run(q, kv_pages, return_lse=True)
    for wrapper in self._levels[1:]:
      part, part_lse = wrapper.run(q, kv_pages, return_lse=True)
      merged, lse = merge_states(merged, lse, part, part_lse)
    if out is not None:
      out[...] = merged
      merged = out
    return (merged, lse) if return_lse else merged
