"""Plan once per step, run per layer: rpa.BatchAttention, in FlashInfer's style.

An engine calls attention once per layer with the same page table. The
wrapper's `plan` does the per-step work once (the library validates the page
table, keeps its own copy of it, chooses block sizes and builds the task
plan); each `run` checks only the layer's tensors against the plan and
computes. The C++ object is rpa::AttentionPlan (rpa/plan.h); every check and
message is the library's except the few about how the Python arguments are
given (kv_layout, a pair or a 5-D cache).
"""

from __future__ import annotations

import operator

from . import _rpa
from ._api import (RAGGED_OPTIONS, _array_options, _as_array, _as_codes, _dtype_name,
                   _empty_like, _error, _is_array, _lse_like, _table)

_LAYOUTS = ("combined", "NHD", "HND")
# plan()'s options beyond the shape: rpa.ragged_paged_attention's that fix
# the step (sm_scale has FlashInfer's default here) and FlashInfer's
# window_left; each None when not given.
_PLAN_OPTIONS = ("window_left",) + tuple(
    o.name for o in RAGGED_OPTIONS if o.planned and o.name != "sm_scale")


def _unknown(options):
  """Raises TypeError for a keyword plan() does not take."""
  extra = sorted(set(options) - set(_PLAN_OPTIONS))
  if extra:
    raise TypeError(f"plan() got an unexpected keyword argument {extra[0]!r}")


def _name(dtype):
  return None if dtype is None else _dtype_name(dtype)


def _default_sm_scale(head_dim):
  """FlashInfer's default sm_scale, 1 / sqrt(head_dim); None (the library's
  1.0) for a head_dim the library will reject with its own message."""
  try:
    d = operator.index(head_dim)
  except TypeError:
    return None
  return d ** -0.5 if d > 0 else None


def _soft_cap(options):
  """The soft cap from rpa's `soft_cap` or FlashInfer's `logits_soft_cap`,
  where 0.0 means no cap as in FlashInfer (rpa's soft_cap=0.0 is an error)."""
  soft_cap, logits_soft_cap = options.get("soft_cap"), options.get("logits_soft_cap")
  if logits_soft_cap is None:
    return soft_cap
  if soft_cap is not None:
    raise _error("option", f"soft_cap={soft_cap!r} and logits_soft_cap={logits_soft_cap!r} are "
                 "the same option. Pass one: logits_soft_cap is FlashInfer's name for soft_cap.")
  return None if logits_soft_cap == 0.0 else logits_soft_cap


class BatchAttention:
  """Ragged paged attention planned once per step and run for every layer.

      w = rpa.BatchAttention(kv_layout="NHD")
      w.plan(kv_lens, page_indices, cu_q_lens, num_seqs, num_q_heads=32,
             num_kv_heads=8, head_dim=128, page_size=16, num_pages=k_cache.shape[0],
             q_dtype="bfloat16")  # sm_scale: 1 / sqrt(head_dim) unless given
      for layer in range(num_layers):
        out = w.run(q[layer], (k_cache[layer], v_cache[layer]))

  A plan is reused for any number of runs and re-planned (`plan` again, or
  `plan_csr`) for the next step; a rejected plan leaves the previous one.
  The plan keeps its own copy of the page table, so the arrays may change or
  be freed after `plan` returns. Runs of one wrapper may come from several
  threads at once (the GIL is released while it computes); `plan` waits for
  them.

  Args:
    kv_layout: the cache every run takes: "combined" (JAX's one kv_pages
      array [num_pages, page_size, 2 * num_kv_heads, head_dim]), "NHD"
      ([num_pages, page_size, num_kv_heads, head_dim] K and V: a pair
      (k_pages, v_pages), or FlashInfer's one array
      [num_pages, 2, page_size, num_kv_heads, head_dim]) or "HND"
      ([num_pages, num_kv_heads, page_size, head_dim]; one array
      [num_pages, 2, num_kv_heads, page_size, head_dim]).
    num_threads: worker threads; None uses RPA_NUM_THREADS, else every core.

  Returns:
    A wrapper without a plan: `plan` (or `plan_csr`) before `run`.
  """

  def __init__(self, kv_layout: str = "combined", num_threads: int | None = None):
    if kv_layout not in _LAYOUTS:
      raise _error("option", f"kv_layout={kv_layout!r} must be 'combined', 'NHD' or 'HND'. "
                   "'combined' is JAX's kv_pages [num_pages, page_size, 2 * num_kv_heads, "
                   "head_dim]; 'NHD' and 'HND' are separate K and V caches (vLLM, FlashInfer).")
    self._kv_layout = kv_layout
    self._num_threads = num_threads
    self._plan_object = _rpa.AttentionPlan()

  @property
  def kv_layout(self) -> str:
    return self._kv_layout

  def _plan(self, form, tables, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
            page_size: int, num_pages: int, q_dtype, kv_dtype=None, num_tokens=None,
            sm_scale: float | None = None, **options):
    if sm_scale is None:
      sm_scale = _default_sm_scale(head_dim)
    options["soft_cap"] = _soft_cap(options)
    options.pop("logits_soft_cap", None)
    _unknown(options)
    self._plan_object.plan(
        form, _table(tables), num_tokens=num_tokens, num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, num_pages=num_pages,
        page_size=page_size, q_dtype=_dtype_name(q_dtype), kv_dtype=_name(kv_dtype),
        kv_layout=None if self._kv_layout == "combined" else self._kv_layout,
        num_threads=self._num_threads, sm_scale=sm_scale, **_array_options(options))

  def plan(self, kv_lens, page_indices, cu_q_lens, num_seqs, **shape_and_options) -> None:
    """Plans the step from JAX's page table (or vLLM's, see vllm_page_table).

    Args:
      kv_lens, page_indices, cu_q_lens, num_seqs: as for
        rpa.ragged_paged_attention (int32).
      Keyword-only:
      num_q_heads, num_kv_heads, head_dim, page_size: the model's and the
        cache's (required).
      num_pages: the cache's total_num_pages: every page index read must be
        below it (required).
      q_dtype: q's (and out's) dtype, or its name ("bfloat16") (required).
      kv_dtype: the cache's; None for q_dtype. A quantized cache
        ("float8_e4m3fn", "float8_e5m2", "int8") may then be run as uint8
        codes.
      num_tokens: q.shape[0] (JAX's max_num_batched_tokens: rows past the
        batch's tokens are padding, written as zeros); None for exactly the
        batch's tokens, cu_q_lens[num_seqs[0]].
      sliding_window: keys a query sees, its own included; or
      window_left: FlashInfer's, sliding_window - 1 (-1: no window).
      sm_scale: the scale of q . k; None for 1 / sqrt(head_dim), FlashInfer's
        default (rpa.ragged_paged_attention keeps JAX's 1.0).
      soft_cap, or FlashInfer's logits_soft_cap (0.0 there: no cap; both is
        an error), mask_value, k_scale, v_scale, num_kv_pages_per_block,
        num_queries_per_block, vmem_limit_bytes: as for
        rpa.ragged_paged_attention; k_scale / v_scale are the runs' defaults.
      alibi_slopes: float32[num_q_heads] ALiBi slopes, as for
        rpa.ragged_paged_attention; the plan keeps its own copy.
      causal: None or True: causal attention (rpa's default; FlashInfer's
        plan defaults to False); False: every row sees all of its
        sequence's keys, and q_len may exceed kv_len. None with a custom mask:
        the mask alone.
      custom_mask, packed_custom_mask: FlashInfer's custom mask (bool, flat;
        or its bits, uint8), as for rpa.ragged_paged_attention: sequence by
        sequence, each q_len x kv_len block row-major. The plan keeps its own
        packed copy; tiles no row keeps are skipped.

    Returns:
      None.

    Raises:
      ValueError (rpa.Error): the library's message for any invalid input;
        the previous plan is kept. TypeError: a keyword plan() does not take.
    """
    self._plan("jax", (kv_lens, page_indices, cu_q_lens, num_seqs), **shape_and_options)

  def plan_csr(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
               **shape_and_options) -> None:
    """Plans the step from FlashInfer's CSR page table, read natively.

    Sequence i has query rows qo_indptr[i]:qo_indptr[i+1], pages
    kv_indices[kv_indptr[i]:kv_indptr[i+1]] and kv_len
    (pages - 1) * page_size + kv_last_page_len[i] (0 without pages); every
    array int32, all batch_size = len(qo_indptr) - 1 sequences live.
    FlashInfer's rules are checked (indptrs from 0, never decreasing;
    1 <= kv_last_page_len <= page_size for a sequence with pages, 0 for one
    without; indices in [0, num_pages)), and rpa's q_len <= kv_len when
    causal.

    Args:
      qo_indptr, kv_indptr, kv_indices, kv_last_page_len: the page table.
      Keyword-only: plan()'s; num_tokens=None is qo_indptr[-1], FlashInfer's
        q.

    Returns:
      None.
    """
    self._plan("csr", (qo_indptr, kv_indptr, kv_indices, kv_last_page_len),
               **shape_and_options)

  def _caches(self, kv_pages):
    """(k_or_kv, v_or_None) as the wrapper's layout takes them."""
    pair = isinstance(kv_pages, (tuple, list))
    if self._kv_layout == "combined":
      if pair:
        raise _error("layout", "kv_pages is a (k_pages, v_pages) pair, but this BatchAttention "
                     "has kv_layout='combined' (JAX's one kv_pages array). Pass one array, or "
                     "make the wrapper with kv_layout='NHD' or 'HND'.")
      return _as_array(kv_pages), None
    if pair and len(kv_pages) == 2:
      return _as_array(kv_pages[0]), _as_array(kv_pages[1])
    kv = _as_array(kv_pages)
    shape = tuple(kv.shape) if _is_array(kv) else None
    if shape is None or len(shape) != 5 or shape[1] != 2:
      five = ("[num_pages, 2, page_size, num_kv_heads, head_dim]" if self._kv_layout == "NHD"
              else "[num_pages, 2, num_kv_heads, page_size, head_dim]")
      raise _error("shape", f"kv_pages.shape={shape} does not hold separate K and V caches for "
                   f"kv_layout={self._kv_layout!r}. Pass a pair (k_pages, v_pages), or "
                   f"FlashInfer's one array {five}.")
    return kv[:, 0], kv[:, 1]  # Views: K and V of each page.

  def run(self, q, kv_pages, *, out=None, lse=None, return_lse: bool = False, sinks=None,
          k_scale: float | None = None, v_scale: float | None = None):
    """Runs the plan for one layer.

    Args:
      q: [num_tokens, num_q_heads, head_dim] of the planned q_dtype.
      kv_pages: the layer's cache in the wrapper's kv_layout (see the class).
        A uint8 cache holds codes of the planned quantized kv_dtype.
      out: an array like q to write into (and return); None allocates one.
        Untouched on error.
      lse: a float32[num_tokens, num_q_heads] array to write each row's
        natural-log log-sum-exp into (FlashInfer's run(..., lse=)); None
        allocates one when return_lse. Untouched on error.
      return_lse: also return the LSE (rpa.merge_states combines them).
      sinks: float32[num_q_heads] attention sinks of this layer.
      k_scale, v_scale: this layer's cache scales; None for the plan's.

    Returns:
      out, or (out, lse) with return_lse: exactly what
      rpa.ragged_paged_attention returns for the planned page table.

    Raises:
      ValueError (rpa.Error): a tensor whose shape, dtype or layout is not
        the plan's, or before any plan; nothing is written.
    """
    k, v = self._caches(kv_pages)
    k, own = _as_codes(k, None, "kv_pages" if v is None else "k_pages")
    if v is not None:
      v, own = _as_codes(v, own, "v_pages")
    q = _as_array(q)
    if out is None:
      out = _empty_like(q)
    if lse is None and return_lse:
      lse = _lse_like(q)
    elif lse is not None:
      lse = _as_array(lse)
    result = self._plan_object.run(q, k, v, out, sinks=None if sinks is None else _as_array(sinks),
                            lse=lse, k_scale=k_scale, v_scale=v_scale, kv_dtype=own)
    return (result, lse) if return_lse else result

  @property
  def info(self) -> dict:
    """The plan: shape (num_tokens resolved), num_seqs, num_threads, the
    tiles (num_kv_pages_per_block, num_queries_per_block) and the kernels;
    planned=False before the first plan."""
    return self._plan_object.info()


def vllm_page_table(query_start_loc, seq_lens, block_table, num_seqs=None):
  """vLLM's attention metadata as JAX's page table, without copying.

  seq_lens is kv_lens, block_table[:num_reqs] page_indices and
  query_start_loc[:num_reqs + 1] cu_q_lens (views of vLLM's persistent
  buffers, which may have more rows), num_reqs = len(seq_lens).

  Args:
    query_start_loc: int32[>= num_reqs + 1].
    seq_lens: int32[num_reqs].
    block_table: int32[>= num_reqs, max_num_blocks_per_req].
    num_seqs: the live requests; None for num_reqs.

  Returns:
    (kv_lens, page_indices, cu_q_lens, num_seqs) for
    rpa.ragged_paged_attention or BatchAttention.plan; num_seqs is a new
    int32[1] array (of seq_lens' kind), the rest views.
  """
  seq_lens = _as_array(seq_lens)
  reqs = int(seq_lens.shape[0])
  live = reqs if num_seqs is None else int(num_seqs)
  if hasattr(seq_lens, "new_full"):  # torch
    count = seq_lens.new_full((1,), live)
  else:
    import numpy as np

    count = np.array([live], np.int32)
  return seq_lens, _as_array(block_table)[:reqs], _as_array(query_start_loc)[:reqs + 1], count
