"""The public functions of rpa, with JAX's names, arguments and defaults.

Every function here is a thin layer over the C++ library (the `_rpa`
extension): it normalizes the Python-level arguments (a `(k_pages, v_pages)`
pair, lists given for arrays), allocates the output like `q`, and lets the
library validate and compute. All checks, and every error message, are the
library's (SPEC §3), so Python and C++ callers read the same text.
"""

from __future__ import annotations

from . import _rpa

# JAX's DEFAULT_MASK_VALUE: -0.7 * float32 max.
DEFAULT_MASK_VALUE: float = _rpa.DEFAULT_MASK_VALUE

# rpa.Error subclasses ValueError: `except ValueError` catches every rejected
# input, as with JAX. `err.kind` says which check failed ('shape', 'dtype',
# 'layout', 'option', 'block_size', 'metadata' or 'page_index').
Error = _rpa.Error


def _is_array(x) -> bool:
  return hasattr(x, "shape") and hasattr(x, "dtype")


def _as_array(x):
  """Arrays pass through untouched; lists and scalars become NumPy arrays."""
  if _is_array(x) or hasattr(x, "__dlpack__"):
    return x
  try:
    memoryview(x)  # Anything with the buffer protocol.
    return x
  except TypeError:
    pass
  import numpy as np  # Loaded already by anyone passing lists to an array API.

  return np.asarray(x)


def _is_torch(x) -> bool:
  # torch.Tensor, torch.nn.Parameter, or a subclass elsewhere (torch's
  # allocator method and DLPack export; NumPy arrays have neither new_empty).
  return type(x).__module__.split(".")[0] == "torch" or (
      hasattr(x, "new_empty") and hasattr(x, "__dlpack__"))


def _empty_like(q):
  """An uninitialized array of q's shape and dtype, of q's kind: a torch
  tensor for torch (on q's device), else a NumPy array."""
  if _is_torch(q):
    return q.new_empty(tuple(q.shape))
  import numpy as np

  if _is_array(q):  # NumPy, or e.g. a JAX array: no need to convert q itself.
    return np.empty(tuple(q.shape), np.dtype(q.dtype))
  a = np.asarray(q)
  return np.empty(a.shape, a.dtype)


def _split_kv(kv_pages, kv_layout):
  """(k_or_kv, v_or_None): a `(k_pages, v_pages)` pair selects the separate
  caches; one array is JAX's combined layout."""
  if isinstance(kv_pages, (tuple, list)) and len(kv_pages) == 2 and all(
      _is_array(p) or hasattr(p, "__dlpack__") for p in kv_pages):
    return kv_pages[0], kv_pages[1]
  return _as_array(kv_pages), None


def _lse_like(q):
  """float32[q.shape[0], q.shape[1]] of q's kind."""
  shape = tuple(q.shape[:2])
  if _is_torch(q):
    import torch

    return q.new_empty(shape, dtype=torch.float32)
  import numpy as np

  return np.empty(shape, np.float32)


def _ragged(reference, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, kv_layout,
            sinks, return_lse, out, **options):
  k, v = _split_kv(kv_pages, kv_layout)
  q = _as_array(q)
  if out is None:
    out = _empty_like(q)
  lse = _lse_like(q) if return_lse else None
  result = _rpa.ragged(
      reference, q, k, v, kv_layout, _as_array(kv_lens), _as_array(page_indices),
      _as_array(cu_q_lens), _as_array(num_seqs), out,
      sinks=None if sinks is None else _as_array(sinks), lse=lse, **options)
  return (result, lse) if return_lse else result


_KV_PAGES_DOC = """kv_pages: the paged KV cache, one of
      - JAX's combined layout: an array of shape
        [total_num_pages, page_size, 2 * num_kv_heads, head_dim], where combined
        head 2h holds K of kv head h and 2h + 1 its V;
      - separate K and V caches (vLLM, FlashInfer): a pair `(k_pages, v_pages)`
        of arrays of one shape and dtype, laid out as `kv_layout` says.
      dtype float32, bfloat16 or float16, or quantized float8_e4m3fn,
      float8_e5m2 or int8 (then pass k_scale / v_scale)."""


def ragged_paged_attention(
    q,
    kv_pages,
    kv_lens,
    page_indices,
    cu_q_lens,
    num_seqs,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
    kv_layout: str | None = None,
    sinks=None,
    return_lse: bool = False,
    num_threads: int | None = None,
    out=None,
):
  """Ragged paged attention that supports mixed prefill and decode.

  A drop-in for `jax.experimental.pallas.ops.tpu.ragged_paged_attention`,
  computed on the CPU. Sequence i (i < num_seqs[0]) owns query rows
  cu_q_lens[i] .. cu_q_lens[i+1] - 1 and attends causally to its kv_lens[i]
  cached tokens (the new ones included), stored in pages page_indices[i].

  Args:
    q: concatenated queries of all sequences,
      [max_num_batched_tokens, num_q_heads, head_dim]; float32, bfloat16
      (torch only) or float16.
    {kv_pages}
    kv_lens: int32[max_num_seqs], each sequence's number of tokens in the cache.
    page_indices: int32[max_num_seqs, pages_per_seq], each sequence's pages.
    cu_q_lens: int32[max_num_seqs + 1], cumulative query lengths.
    num_seqs: int32[1], the number of live sequences.
    sm_scale: the softmax scale applied to q . k.
    sliding_window: keep only the last `sliding_window` keys (the query's own
      position included) for each query; None for no window.
    soft_cap: the logit soft cap c: logit = c * tanh(logit / c); None for none.
    mask_value: added to masked logits; None for DEFAULT_MASK_VALUE.
    k_scale: the scale stored K is multiplied by (quantized caches).
    v_scale: the scale stored V is multiplied by (quantized caches).
    num_kv_pages_per_block: K/V pages per tile; None lets the library choose.
    num_queries_per_block: query tokens per tile; None lets the library choose.
    vmem_limit_bytes: on CPU, the budget in bytes for one worker's scratch
      tiles; None for no limit.
    kv_layout: rpa's: for a `(k_pages, v_pages)` pair, "NHD" (the default,
      [num_pages, page_size, num_kv_heads, head_dim]) or "HND"
      ([num_pages, num_kv_heads, page_size, head_dim]).
    sinks: rpa's: float32[num_q_heads] attention sinks, one raw logit per q
      head that joins each row's softmax denominator only (no value, no
      sm_scale, no soft cap), as in gpt-oss, FlashInfer and ggml; None for
      none.
    return_lse: rpa's: also return the log-sum-exp of each row.
    num_threads: rpa's: worker threads; None uses RPA_NUM_THREADS, else every
      core.
    out: rpa's: an array like q to write the result into (and return);
      None allocates one. On error it is left untouched.

  Returns:
    The attention output, of q's shape and dtype and of q's kind (a torch
    tensor for torch inputs, else a NumPy array). Rows that belong to no
    sequence are zero. With return_lse, a pair (output, lse): lse is
    float32[max_num_batched_tokens, num_q_heads], the natural log of each
    row's softmax denominator over its keys (sinks excluded); -inf for rows
    that see no key and for padding rows.

  Raises:
    ValueError (rpa.Error): any invalid input, with JAX's message where JAX
      has one and a sentence on how to fix it. Nothing is written first.
  """
  return _ragged(
      False, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, kv_layout, sinks,
      return_lse, out, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
      mask_value=mask_value, k_scale=k_scale, v_scale=v_scale,
      num_kv_pages_per_block=num_kv_pages_per_block,
      num_queries_per_block=num_queries_per_block,
      vmem_limit_bytes=vmem_limit_bytes, num_threads=num_threads)


def ref_ragged_paged_attention(
    queries,
    kv_pages,
    kv_lens,
    page_indices,
    cu_q_lens,
    num_seqs,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = DEFAULT_MASK_VALUE,
    k_scale: float | None = None,
    v_scale: float | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
    kv_layout: str | None = None,
    sinks=None,
    return_lse: bool = False,
    num_threads: int | None = None,
    out=None,
):
  """The reference ragged paged attention: the oracle rpa is tested against.

  One sequence at a time, accumulating in float64, no tiling; it validates
  exactly as `ragged_paged_attention` does. Slow by design. The signature is
  JAX's `ref_ragged_paged_attention` (first argument `queries`), and it also
  accepts every keyword of `ragged_paged_attention` so the two are
  interchangeable; the tuning keywords are validated and otherwise ignored.

  Args:
    queries: [max_num_batched_tokens, num_q_heads, head_dim].
    {kv_pages}
    kv_lens: int32[max_num_seqs].
    page_indices: int32[max_num_seqs, pages_per_seq].
    cu_q_lens: int32[max_num_seqs + 1].
    num_seqs: int32[1].
    sm_scale, sliding_window, soft_cap, mask_value, k_scale, v_scale,
    num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes,
    kv_layout, sinks, return_lse, num_threads, out: as for
    `ragged_paged_attention`.

  Returns:
    An array of queries' shape, dtype and kind. Unlike JAX's reference, which
    concatenates only the live sequences' rows, padding rows are included (as
    zeros): `result[cu_q_lens[0]:cu_q_lens[num_seqs[0]]]` is JAX's result.

  Raises:
    ValueError (rpa.Error): any invalid input; nothing is written first.
  """
  return _ragged(
      True, queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, kv_layout, sinks,
      return_lse, out, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
      mask_value=mask_value, k_scale=k_scale, v_scale=v_scale,
      num_kv_pages_per_block=num_kv_pages_per_block,
      num_queries_per_block=num_queries_per_block,
      vmem_limit_bytes=vmem_limit_bytes, num_threads=num_threads)


def _validate(dynamic, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, kv_layout,
              sinks, **options):
  k, v = _split_kv(kv_pages, kv_layout)
  _rpa.validate(dynamic, _as_array(q), k, v, kv_layout, _as_array(kv_lens),
                _as_array(page_indices), _as_array(cu_q_lens), _as_array(num_seqs),
                sinks=None if sinks is None else _as_array(sinks), **options)


def static_validate_inputs(
    q,
    kv_pages,
    kv_lens,
    page_indices,
    cu_q_lens,
    num_seqs,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
    kv_layout: str | None = None,
    sinks=None,
):
  """Checks shapes, dtypes, layouts and options, without reading the metadata.

  JAX runs these checks at trace time; rpa runs them (and the dynamic ones)
  on every call. Options left as None are not checked.

  Args:
    The arguments of `ragged_paged_attention`.

  Returns:
    None.

  Raises:
    ValueError (rpa.Error): the first failed check, with JAX's message
      (e.g. "num_kv_pages_per_block=64 must be in range (0, 32].") and a fix.
  """
  _validate(False, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, kv_layout, sinks,
            sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
            mask_value=mask_value, k_scale=k_scale, v_scale=v_scale,
            num_kv_pages_per_block=num_kv_pages_per_block,
            num_queries_per_block=num_queries_per_block, vmem_limit_bytes=vmem_limit_bytes)


def dynamic_validate_inputs(
    q,
    kv_pages,
    kv_lens,
    page_indices,
    cu_q_lens,
    num_seqs,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
    kv_layout: str | None = None,
    sinks=None,
):
  """The static checks, then the metadata's values.

  Checks num_seqs, kv_lens and cu_q_lens, and that every page index a
  sequence will read lies in the cache. O(num_seqs + pages read).

  Args:
    The arguments of `ragged_paged_attention`.

  Returns:
    None.

  Raises:
    ValueError (rpa.Error): the first failed check, e.g.
      "q_len=5 must be less or equal to kv_len=3 at sequence 2.", and a fix.
  """
  _validate(True, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, kv_layout, sinks,
            sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
            mask_value=mask_value, k_scale=k_scale, v_scale=v_scale,
            num_kv_pages_per_block=num_kv_pages_per_block,
            num_queries_per_block=num_queries_per_block, vmem_limit_bytes=vmem_limit_bytes)


def paged_attention(
    q,
    k_pages,
    v_pages,
    lengths,
    page_indices,
    *,
    mask_value: float = DEFAULT_MASK_VALUE,
    attn_logits_soft_cap: float | None = None,
    pages_per_compute_block: int,
    megacore_mode: str | None = None,
    inline_seq_dim: bool = True,
    num_threads: int | None = None,
    out=None,
):
  """Paged grouped query attention for decode: one query token per sequence.

  A drop-in for `jax.experimental.pallas.ops.tpu.paged_attention`, served by
  the same kernel as `ragged_paged_attention`.

  Args:
    q: [batch_size, num_q_heads, head_dim], already scaled (no sm_scale).
    k_pages: [num_kv_heads, total_num_pages, page_size, head_dim].
    v_pages: like k_pages.
    lengths: int32[batch_size], each sequence's number of cached tokens; a
      length of 0 gives a zero output row.
    page_indices: int32[batch_size, pages_per_sequence].
    mask_value: added to masked logits.
    attn_logits_soft_cap: the logit soft cap c: logit = c * tanh(logit / c);
      None for none.
    pages_per_compute_block: K/V pages per tile; must divide
      pages_per_sequence. Required, as in JAX.
    megacore_mode: "kv_head", "batch" or None, validated with JAX's rules;
      no effect on CPU.
    inline_seq_dim: accepted for JAX compatibility; no effect on CPU.
    num_threads: rpa's: worker threads; None uses RPA_NUM_THREADS, else every
      core.
    out: rpa's: an array like q to write the result into (and return).

  Returns:
    The attention output, of q's shape, dtype and kind.

  Raises:
    ValueError (rpa.Error): any invalid input; nothing is written first.
  """
  q = _as_array(q)
  if out is None:
    out = _empty_like(q)
  return _rpa.paged(
      q, _as_array(k_pages), _as_array(v_pages), _as_array(lengths), _as_array(page_indices),
      out, mask_value=mask_value, attn_logits_soft_cap=attn_logits_soft_cap,
      pages_per_compute_block=pages_per_compute_block, megacore_mode=megacore_mode,
      inline_seq_dim=inline_seq_dim, num_threads=num_threads)


for _f in (ragged_paged_attention, ref_ragged_paged_attention):
  _f.__doc__ = _f.__doc__.replace("{kv_pages}", _KV_PAGES_DOC)
del _f

# Block sizes (SPEC §4): the chooser behind num_kv_pages_per_block=None /
# num_queries_per_block=None.


def _dtype_name(dtype) -> str:
  # numpy/JAX dtypes and type objects, torch dtypes ("torch.bfloat16"), or names.
  name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
  return str(name).replace("torch.", "")


def get_tuned_block_sizes(
    q_dtype,
    kv_dtype,
    num_q_heads_per_blk: int,
    num_kv_heads_per_blk: int,
    head_dim: int,
    page_size: int,
    max_num_batched_tokens: int,
    pages_per_seq: int,
) -> tuple[int, int]:
  """Look up the best (num_kv_pages_per_blk, num_queries_per_blk), as JAX does.

  The library's choice when a call passes None: a tuned table entry for the
  configuration (RPA_TUNED_BLOCK_SIZES or rpa.load_tuned_block_sizes, then the
  shipped table), else the nearest tuned entry for the same heads, head_dim
  and dtypes, else a heuristic from this CPU's cache sizes; always within
  [1, pages_per_seq], so it can never fail validation.

  Args:
    q_dtype, kv_dtype: dtypes (numpy, torch or JAX) or their names.
    num_q_heads_per_blk, num_kv_heads_per_blk: query and KV heads.
    head_dim: the head dimension.
    page_size: tokens per KV-cache page.
    max_num_batched_tokens: q's rows.
    pages_per_seq: page_indices.shape[1].

  Returns:
    (num_kv_pages_per_block, num_queries_per_block).
  """
  pages, queries, _, _ = _rpa.choose_block_sizes(
      _dtype_name(q_dtype), _dtype_name(kv_dtype), num_q_heads_per_blk, num_kv_heads_per_blk,
      head_dim, page_size, max_num_batched_tokens, pages_per_seq)
  return pages, queries


def explain_block_sizes(q_dtype, kv_dtype, num_q_heads: int, num_kv_heads: int, head_dim: int,
                        page_size: int, max_num_batched_tokens: int, pages_per_seq: int, *,
                        vmem_limit_bytes: int | None = None) -> dict:
  """The block sizes the library would choose and why (as `rpa explain` prints).

  Returns:
    {"num_kv_pages_per_block", "num_queries_per_block", "source" ("table",
    "nearest" or "heuristic"), "explanation"}.
  """
  pages, queries, source, why = _rpa.choose_block_sizes(
      _dtype_name(q_dtype), _dtype_name(kv_dtype), num_q_heads, num_kv_heads, head_dim,
      page_size, max_num_batched_tokens, pages_per_seq, vmem_limit_bytes)
  return {"num_kv_pages_per_block": pages, "num_queries_per_block": queries, "source": source,
          "explanation": why}


def load_tuned_block_sizes(path: str) -> bool:
  """Loads a tuned table written by `rpa tune`; it then takes precedence over
  the shipped one. A file that cannot be parsed is ignored with a warning
  naming it (returns False). An empty path unloads it."""
  return _rpa.load_tuned_block_sizes(path)
