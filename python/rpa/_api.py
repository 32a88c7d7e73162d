"""The public functions of rpa, with JAX's names, arguments and defaults.

Every function here is a thin layer over the C++ library (the `_rpa`
extension): it normalizes the Python-level arguments (a `(k_pages, v_pages)`
pair, lists given for arrays), allocates the output like `q`, and lets the
library validate and compute. All checks, and every error message, are the
library's (docs/contract.md §3), so Python and C++ callers read the same text.
"""

from __future__ import annotations

import math

from . import _rpa

# JAX's DEFAULT_MASK_VALUE: -0.7 * float32 max.
DEFAULT_MASK_VALUE: float = _rpa.DEFAULT_MASK_VALUE

# rpa.Error subclasses ValueError: `except ValueError` catches every rejected
# input, as with JAX. `err.kind` says which check failed ('shape', 'dtype',
# 'layout', 'option', 'block_size', 'metadata' or 'page_index').
Error = _rpa.Error


class Option:
  """One keyword of the ragged calls (RAGGED_OPTIONS): its name, its default
  in ragged_paged_attention, its annotation (as text, PEP 563), its type in
  torch.ops.rpa's schemas (rpa/torch.py; None: not there) and the schema's
  default where it differs, and whether BatchAttention.plan takes it (False:
  a run's or the wrapper's). A plain class: `import rpa` stays free of
  typing and collections."""
  __slots__ = ("name", "default", "annotation", "torch", "torch_default", "planned")

  def __init__(self, name, default, annotation, torch, torch_default=None, planned=True):
    self.name, self.default, self.annotation = name, default, annotation
    self.torch, self.torch_default, self.planned = torch, torch_default, planned


# The keyword-only options of ragged_paged_attention, its reference, its
# fused-KV-write variant and the two validators, in their signatures' order:
# the one list their signatures (_ragged_signature), the forwarding to the
# binding, BatchAttention.plan's keywords and torch.ops.rpa's schemas are
# derived from. What each one means: ragged_paged_attention's docstring.
RAGGED_OPTIONS = (
    Option("sm_scale", 1.0, "float", "float"),
    Option("sliding_window", None, "int | None", "int?"),
    Option("soft_cap", None, "float | None", "float?"),
    Option("mask_value", None, "float | None", "float?"),
    Option("k_scale", None, "float | None", "float?"),
    Option("v_scale", None, "float | None", "float?"),
    Option("num_kv_pages_per_block", None, "int | None", "int?"),
    Option("num_queries_per_block", None, "int | None", "int?"),
    Option("vmem_limit_bytes", None, "int | None", "int?"),
    Option("kv_layout", None, "str | None", "str?", planned=False),
    Option("kv_dtype", None, None, "str?", planned=False),
    Option("sinks", None, None, "Tensor?", planned=False),
    Option("return_lse", False, "bool", None, planned=False),
    Option("num_threads", None, "int | None", "int?", planned=False),
    Option("out", None, None, None, planned=False),
    Option("causal", None, "bool | None", "bool", torch_default=True),
    Option("alibi_slopes", None, None, "Tensor?"),
    Option("custom_mask", None, None, None),
    Option("packed_custom_mask", None, None, None),
)
# What only the computing calls take (the validators do not).
_RESULT_OPTIONS = ("return_lse", "num_threads", "out")


def _ragged_signature(omit=(), defaults=None):
  """Gives `fn(<positional arrays>, **options)` the keyword-only parameters
  RAGGED_OPTIONS (less `omit`, with `defaults` where they differ): returns a
  function with fn's name, docstring and positional parameters plus those,
  that calls fn with every option by name. Written as source and compiled,
  as dataclasses writes __init__: a real signature (what inspect.signature
  and help show, and Python's own TypeError for a misspelt keyword) at the
  cost of an ordinary call, without importing inspect."""
  defaults = defaults or {}

  def decorate(fn):
    code = fn.__code__
    positional = ", ".join(code.co_varnames[:code.co_argcount])
    table = {o.name: defaults.get(o.name, o.default) for o in RAGGED_OPTIONS if o.name not in omit}
    keywords = []
    for o in RAGGED_OPTIONS:
      if o.name in table:
        annotation = o.annotation
        if annotation and table[o.name] is None and "None" not in annotation:
          annotation += " | None"  # A default overridden to None: the validators' sm_scale.
        keywords.append(f"{o.name}: {annotation!r}=_table[{o.name!r}]" if annotation else
                        f"{o.name}=_table[{o.name!r}]")
    forward = ", ".join(f"{name}={name}" for name in table)
    source = (f"def {fn.__name__}({positional}, *, {', '.join(keywords)}):\n"
              f"  return _fn({positional}, {forward})\n")
    namespace = {"_fn": fn, "_table": table}
    # dont_inherit: this module's `annotations` future would quote the quoted annotations again.
    exec(compile(source, f"<rpa._api signature of {fn.__name__}>", "exec", dont_inherit=True),
         namespace)
    call = namespace[fn.__name__]
    call.__doc__, call.__module__, call.__qualname__ = fn.__doc__, fn.__module__, fn.__qualname__
    return call

  return decorate


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


# Quantized cache dtypes. NumPy and torch before 2.1 have no float8 dtypes:
# their caches are uint8 arrays of codes plus `kv_dtype=` naming the format.
_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _error(kind, message):
  """rpa.Error for what only the Python layer can see, like the library's."""
  error = Error(message)
  error.kind = kind
  return error


def _name_or_none(dtype):
  return None if dtype is None else _dtype_name(dtype)


def _as_codes(x, kv_dtype, name, keyword="kv_dtype"):
  """(x as the binding reads it, the dtype name to read it as). A float8 array
  (torch >= 2.1, ml_dtypes) goes as a zero-copy uint8 view of its bytes,
  named by its own dtype; anything else as it is, named by `kv_dtype`."""
  x = _as_array(x)
  own = _dtype_name(x.dtype) if _is_array(x) else None
  if own not in _FP8:
    return x, kv_dtype
  if kv_dtype is not None and kv_dtype != own:
    raise _error(
        "dtype", f"{name}.dtype={x.dtype} does not match {keyword}={kv_dtype!r}. Omit "
        f"{keyword} for a float8 array (its own dtype is used), or pass {keyword}={own!r}.")
  if _is_torch(x):
    import torch

    return x.view(torch.uint8), own
  import numpy as np

  return x.view(np.uint8), own


def _cache(kv_pages, kv_layout, kv_dtype):
  """(k_or_kv, v_or_None, kv_dtype name) for the binding."""
  k, v = _split_kv(kv_pages, kv_layout)
  kv_dtype = _name_or_none(kv_dtype)
  k, kv_dtype = _as_codes(k, kv_dtype, "kv_pages" if v is None else "k_pages")
  if v is not None:
    v, kv_dtype = _as_codes(v, kv_dtype, "v_pages")
  return k, v, kv_dtype


def _bool_mask_bytes(custom_mask):
  """A bool custom_mask as a zero-copy uint8 view of its bytes (the library
  reads one byte per key)."""
  custom_mask = _as_array(custom_mask)
  name = _dtype_name(custom_mask.dtype) if _is_array(custom_mask) else None
  if name != "bool":
    raise _error("dtype", f"custom_mask.dtype={getattr(custom_mask, 'dtype', None)} must be "
                 "bool. Pass one bool per key (True keeps it), or packed_custom_mask for "
                 "its bits as uint8.")
  if _is_torch(custom_mask):
    import torch

    return custom_mask.view(torch.uint8)
  import numpy as np

  return custom_mask.view(np.uint8)


def _array_options(options):
  """`options` (a dict of RAGGED_OPTIONS, any subset) with its arrays as the
  binding reads them: lists become arrays, a bool custom_mask its bytes."""
  for name in ("sinks", "alibi_slopes", "packed_custom_mask"):
    if options.get(name) is not None:
      options[name] = _as_array(options[name])
  if options.get("custom_mask") is not None:
    options["custom_mask"] = _bool_mask_bytes(options["custom_mask"])
  return options


def _table(arrays):
  """A page table's four arrays as the binding takes them: one tuple."""
  a, b, c, d = arrays
  return _as_array(a), _as_array(b), _as_array(c), _as_array(d)


def _lse_like(q):
  """float32[q.shape[0], q.shape[1]] of q's kind."""
  shape = tuple(q.shape[:2])
  if _is_torch(q):
    import torch

    return q.new_empty(shape, dtype=torch.float32)
  import numpy as np

  return np.empty(shape, np.float32)


def _attend(call, leading, q, kv_pages, table, *, kv_layout, kv_dtype, return_lse, out,
            **options):
  """The computing ragged calls: `call(*leading, q, k, v, table, out,
  **keywords)` of the binding, out (and lse) allocated like q unless given."""
  options = _array_options(options)
  k, v, kv_dtype = _cache(kv_pages, kv_layout, kv_dtype)
  q = _as_array(q)
  if out is None:
    out = _empty_like(q)
  lse = _lse_like(q) if return_lse else None
  result = call(*leading, q, k, v, _table(table), out, lse=lse, kv_layout=kv_layout,
                kv_dtype=kv_dtype, **options)
  return (result, lse) if return_lse else result




_KV_PAGES_DOC = """kv_pages: the paged KV cache, one of
      - JAX's combined layout: an array of shape
        [total_num_pages, page_size, 2 * num_kv_heads, head_dim], where combined
        head 2h holds K of kv head h and 2h + 1 its V;
      - separate K and V caches (vLLM, FlashInfer): a pair `(k_pages, v_pages)`
        of arrays of one shape and dtype, laid out as `kv_layout` says.
      dtype float32, bfloat16 or float16, or quantized float8_e4m3fn,
      float8_e5m2 or int8 (usually with k_scale / v_scale). NumPy (and torch
      before 2.1) has no float8: pass the codes as uint8 with `kv_dtype`."""

_KV_DTYPE_DOC = """kv_dtype: rpa's: the dtype the cache's bytes hold, "float8_e4m3fn",
      "float8_e5m2" or "int8", for a uint8 cache of codes (rpa.quantize makes
      them), read in place; None for the cache's own dtype (torch and
      ml_dtypes float8 arrays are read natively)."""


@_ragged_signature()
def ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **options):
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
    {kv_dtype}
    sinks: rpa's: float32[num_q_heads] attention sinks, one raw logit per q
      head that joins each row's softmax denominator only (no value, no
      sm_scale, no soft cap), as in gpt-oss, FlashInfer and ggml; None for
      none.
    return_lse: rpa's: also return the log-sum-exp of each row.
    num_threads: rpa's: worker threads; None uses RPA_NUM_THREADS, else every
      core.
    out: rpa's: an array like q to write the result into (and return);
      None allocates one. On error it is left untouched.
    causal: rpa's: False lets every query row of a sequence see all of its
      kv_lens[i] keys (encoders, rerankers, cross attention); q_len may then
      exceed kv_len. A sliding window needs causal=True. None: True, or the
      custom mask when one is given.
    alibi_slopes: rpa's: float32[num_q_heads] ALiBi slopes: each logit gets
      alibi_slopes[h] * (t - p) added (key position t, the query's position
      p = kv_len - q_len + j), before the soft cap, as in vLLM and
      FlashInfer; None for none.
    custom_mask: rpa's: FlashInfer's flat bool mask, the live sequences'
      q_len x kv_len blocks row-major one after another (row r, key j of
      sequence i at sum_{s<i} q_len[s] * kv_len[s] + r * kv_len[i] + j); True
      keeps the key, a masked key takes no part. Replaces the causal mask (no
      causal=True, no window); q_len may exceed kv_len. None for none.
    packed_custom_mask: rpa's: the same bits as uint8, each sequence's block
      packed little-endian from its own byte (FlashInfer's
      segment_packbits(..., bitorder="little")).

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
  return _attend(_rpa.ragged, (False,), q, kv_pages, (kv_lens, page_indices, cu_q_lens,
                 num_seqs), **options)


@_ragged_signature(defaults={"mask_value": DEFAULT_MASK_VALUE})
def ref_ragged_paged_attention(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
                               **options):
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
    kv_layout, kv_dtype, sinks, return_lse, num_threads, out, causal,
    alibi_slopes, custom_mask, packed_custom_mask: as for
    `ragged_paged_attention`.

  Returns:
    An array of queries' shape, dtype and kind. Unlike JAX's reference, which
    concatenates only the live sequences' rows, padding rows are included (as
    zeros): `result[cu_q_lens[0]:cu_q_lens[num_seqs[0]]]` is JAX's result.

  Raises:
    ValueError (rpa.Error): any invalid input; nothing is written first.
  """
  return _attend(_rpa.ragged, (True,), queries, kv_pages, (kv_lens, page_indices, cu_q_lens,
                 num_seqs), **options)


def _validate(dynamic, q, kv_pages, table, *, kv_layout, kv_dtype, **options):
  options = _array_options(options)
  k, v, kv_dtype = _cache(kv_pages, kv_layout, kv_dtype)
  _rpa.validate(dynamic, _as_array(q), k, v, _table(table), kv_layout=kv_layout,
                kv_dtype=kv_dtype, **options)


@_ragged_signature(omit=_RESULT_OPTIONS, defaults={"sm_scale": None})
def static_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **options):
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
  _validate(False, q, kv_pages, (kv_lens, page_indices, cu_q_lens, num_seqs), **options)


@_ragged_signature(omit=_RESULT_OPTIONS, defaults={"sm_scale": None})
def dynamic_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **options):
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
  _validate(True, q, kv_pages, (kv_lens, page_indices, cu_q_lens, num_seqs), **options)


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
    kv_dtype=None,
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
    kv_dtype: rpa's: for uint8 k_pages / v_pages of codes, the dtype they
      hold ("float8_e4m3fn", "float8_e5m2" or "int8"); None for their own.
      JAX's paged_attention has no scales: the codes' values are used as is.
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
  kv_dtype = _name_or_none(kv_dtype)
  k_pages, kv_dtype = _as_codes(k_pages, kv_dtype, "k_pages")
  v_pages, kv_dtype = _as_codes(v_pages, kv_dtype, "v_pages")
  return _rpa.paged(
      q, k_pages, v_pages, _as_array(lengths), _as_array(page_indices),
      out, mask_value=mask_value, attn_logits_soft_cap=attn_logits_soft_cap,
      pages_per_compute_block=pages_per_compute_block, megacore_mode=megacore_mode,
      inline_seq_dim=inline_seq_dim, num_threads=num_threads, kv_dtype=kv_dtype)



@_ragged_signature()
def ragged_paged_attention_with_kv_write(q, new_k, new_v, kv_pages, kv_lens, page_indices,
                                         cu_q_lens, num_seqs, **options):
  """Writes the step's new keys and values into the cache, then attends.

  One call for what a serving step does with `ragged_paged_attention` after
  scattering the new tokens' K/V into their pages (vLLM's
  `reshape_and_cache`, FlashInfer's `append_paged_kv_cache`). The new tokens
  of sequence i are its last q_len positions: row cu_q_lens[i] + j of new_k /
  new_v is the key / value of position p = kv_lens[i] - q_len + j, stored in
  page page_indices[i, p // page_size], slot p % page_size, as x / k_scale
  (x / v_scale) rounded and saturated to the cache's dtype (rpa.quantize's
  conversion). Every other slot of the cache is left bit-identical.

  `kv_pages` is written in place: NumPy arrays and torch tensors (a layout
  rpa cannot write through strides is computed in a copy and copied back).
  Everything is validated before the first write: on error the cache and
  `out` are untouched.

  Args:
    q: [max_num_batched_tokens, num_q_heads, head_dim]; as for
      `ragged_paged_attention`.
    new_k: [max_num_batched_tokens, num_kv_heads, head_dim], the new tokens'
      keys, row r belonging to q row r (padding rows are not written);
      float32, bfloat16, float16, float8_e4m3fn, float8_e5m2 or int8.
    new_v: like new_k, the new tokens' values.
    {kv_pages}
      Must be writable.
    kv_lens: int32[max_num_seqs], each sequence's number of tokens in the
      cache after this step (the new ones included).
    page_indices: int32[max_num_seqs, pages_per_seq].
    cu_q_lens: int32[max_num_seqs + 1].
    num_seqs: int32[1].
    sm_scale, sliding_window, soft_cap, mask_value, num_kv_pages_per_block,
    num_queries_per_block, vmem_limit_bytes, kv_layout, sinks, return_lse,
    num_threads, out, causal, alibi_slopes, custom_mask, packed_custom_mask:
      as for `ragged_paged_attention` (the new tokens must fit in kv_len
      whatever causal is: they are stored at its last q_len positions).
    k_scale, v_scale: the cache's scales: stored K is new_k / k_scale and is
      read back multiplied by k_scale (likewise V).
    {kv_dtype}

  Returns:
    The attention output over the updated cache, as `ragged_paged_attention`
    returns it (with return_lse, a pair (output, lse)).

  Raises:
    ValueError (rpa.Error): any invalid input, e.g. a page index out of
      range or a new_k of the wrong shape; nothing is written first.
  """
  return _attend(_rpa.ragged_kv_write, (_as_rows(new_k), _as_rows(new_v)), q, kv_pages,
                 (kv_lens, page_indices, cu_q_lens, num_seqs), **options)


def _as_rows(x):
  """new_k / new_v: a float8 array (torch >= 2.1, ml_dtypes) becomes float32,
  which holds every float8 value exactly."""
  x = _as_array(x)
  if _is_array(x) and _dtype_name(x.dtype) in _FP8:
    return x.float() if _is_torch(x) else x.astype("float32")
  return x


for _f in (ragged_paged_attention, ref_ragged_paged_attention,
           ragged_paged_attention_with_kv_write):
  _f.__doc__ = _f.__doc__.replace("{kv_pages}", _KV_PAGES_DOC).replace(
      "{kv_dtype}", _KV_DTYPE_DOC)
del _f


def merge_states(out_a, lse_a, out_b, lse_b, *, lse_base: float = math.e):
  """Merges two partial attentions over disjoint key sets into one.

  With `return_lse=True`, attention over keys A and attention over keys B
  (A and B disjoint) combine exactly into attention over A and B:

    lse = log(exp(lse_a) + exp(lse_b))
    out = (exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b)

  rpa's LSEs are natural logs (lse_base=math.e, the default). FlashInfer's
  are base 2 (log2 of the sum of 2^(logit * log2(e))): pass lse_base=2 to
  merge those, with exp2 and log2 in place of exp and log.

  computed stably in float32. This is how cascade (shared-prefix) attention
  combines a shared prefix with each sequence's own suffix, and how context
  parallelism combines the shards of a long sequence's keys. A row whose LSEs
  are both -inf (no key on either side) gets output 0 and LSE -inf. Merging
  is associative, so more than two parts merge pairwise. FlashInfer's
  `merge_state` is the same operation.

  Args:
    out_a: [num_tokens, num_heads, head_dim], float32, bfloat16 (torch) or
      float16: attention over the first key set.
    lse_a: float32[num_tokens, num_heads], its log-sum-exp.
    out_b: like out_a, attention over the second key set.
    lse_b: like lse_a.
    lse_base: the LSEs' base, math.e or 2.

  Returns:
    (out, lse): out like out_a (shape, dtype, kind), lse float32
    [num_tokens, num_heads] of out_a's kind.

  Raises:
    ValueError (rpa.Error): shapes or dtypes that do not match, e.g.
      "lse_b.shape=(3, 4) must be the same as lse_a.shape=(5, 4)."
  """
  out_a, lse_a, out_b, lse_b = (_as_array(x) for x in (out_a, lse_a, out_b, lse_b))
  out = _empty_like(out_a)
  lse = _lse_like(out_a)
  _rpa.merge_states(out_a, lse_a, out_b, lse_b, out, lse, lse_base=lse_base)
  return out, lse


def _flat(x):
  """A 1-D view (or, where the layout needs it, a copy) of x's elements."""
  return x.reshape(-1)


def quantize(x, dtype, scale: float | None = None):
  """Quantizes x into a cache's codes: x / scale as float8 or int8.

  The codes are exactly the bytes the fused KV write
  (`ragged_paged_attention_with_kv_write`) stores for x with k_scale /
  v_scale = scale: x is converted to float32, divided by scale in float32,
  then rounded to nearest (ties to even) and saturated to the format, by the
  library's own conversion: float8_e4m3fn saturates to +-448 (it has no
  infinity; NaN stays NaN), float8_e5m2 to +-57344 (infinities stay
  infinite), int8 rounds and clamps to [-128, 127] (NaN becomes 0).

  Args:
    x: an array (NumPy or torch) of float32, bfloat16, float16 or float64.
    dtype: "float8_e4m3fn", "float8_e5m2" or "int8" (or torch's dtype of
      that name).
    scale: the per-tensor scale; None for 1.

  Returns:
    The codes, of x's shape and kind: uint8 for the float8 formats (NumPy
    and older torch have no float8 dtype: pass them with `kv_dtype`), int8
    for int8.

  Raises:
    ValueError (rpa.Error): an unknown dtype name, a non-finite scale, an
      unsupported x dtype.
  """
  x = _as_array(x)
  name = _dtype_name(dtype)
  code_dtype = "int8" if name in ("int8", "i8") else "uint8"
  if _is_torch(x):
    import torch

    codes = x.new_empty(tuple(x.shape), dtype=getattr(torch, code_dtype))
  else:
    import numpy as np

    codes = np.empty(tuple(np.shape(x)), code_dtype)
  _rpa.quantize(_flat(x), name, scale, _flat(codes))
  return codes


def dequantize(codes, dtype, scale: float | None = None):
  """The values of a cache's codes: f32(codes) * scale, as rpa reads K/V.

  Args:
    codes: uint8 codes of `dtype` (rpa.quantize's result), an int8 array for
      "int8", or a torch / ml_dtypes float8 array of that dtype.
    dtype: "float8_e4m3fn", "float8_e5m2" or "int8".
    scale: the per-tensor scale; None for 1.

  Returns:
    float32 values of codes' shape and kind.

  Raises:
    ValueError (rpa.Error): an unknown dtype name, a non-finite scale, codes
      that are not uint8 (or int8 for "int8").
  """
  name = _dtype_name(dtype)
  codes, name = _as_codes(codes, name, "codes", keyword="dtype")
  if _is_torch(codes):
    import torch

    values = codes.new_empty(tuple(codes.shape), dtype=torch.float32)
  else:
    import numpy as np

    values = np.empty(tuple(np.shape(codes)), np.float32)
  _rpa.dequantize(_flat(codes), name, scale, _flat(values))
  return values


# Block sizes (docs/contract.md §4): the chooser behind num_kv_pages_per_block=None /
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
  configuration from the section of this CPU kind (RPA_TUNED_BLOCK_SIZES or
  rpa.load_tuned_block_sizes, then the shipped table; else the nearest
  section: same vendor and dispatch features, then same vendor, then any),
  else that section's nearest tuned entry for the same heads, head_dim and
  dtypes, else a heuristic from this CPU's cache sizes; always within
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
  pages, queries = _rpa.choose_block_sizes(
      _dtype_name(q_dtype), _dtype_name(kv_dtype), num_q_heads=num_q_heads_per_blk,
      num_kv_heads=num_kv_heads_per_blk, head_dim=head_dim, page_size=page_size,
      max_num_batched_tokens=max_num_batched_tokens, pages_per_seq=pages_per_seq)[:2]
  return pages, queries


def explain_block_sizes(q_dtype, kv_dtype, num_q_heads: int, num_kv_heads: int, head_dim: int,
                        page_size: int, max_num_batched_tokens: int, pages_per_seq: int, *,
                        vmem_limit_bytes: int | None = None) -> dict:
  """The block sizes the library would choose and why (as `rpa explain` prints).

  Args:
    q_dtype, kv_dtype, num_q_heads, num_kv_heads, head_dim, page_size,
    max_num_batched_tokens, pages_per_seq: as for `get_tuned_block_sizes`.
    vmem_limit_bytes: the per-worker scratch budget a call would pass; None
      for no limit.

  Returns:
    {"num_kv_pages_per_block", "num_queries_per_block", "source" ("table",
    "nearest" or "heuristic"), "explanation", "section" (the tuned table's
    section that answered, and why that one; None for the heuristic)}.
  """
  pages, queries, source, why, section = _rpa.choose_block_sizes(
      _dtype_name(q_dtype), _dtype_name(kv_dtype), num_q_heads=num_q_heads,
      num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
      max_num_batched_tokens=max_num_batched_tokens, pages_per_seq=pages_per_seq,
      vmem_limit_bytes=vmem_limit_bytes)
  return {"num_kv_pages_per_block": pages, "num_queries_per_block": queries, "source": source,
          "explanation": why, "section": section or None}


def load_tuned_block_sizes(path: str) -> bool:
  """Loads a tuned table written by `rpa tune`; within each rank of CPU match
  its sections then come before the shipped table's.

  Args:
    path: the JSON file `rpa tune` wrote; an empty path unloads the table.

  Returns:
    True when the table was loaded; False when the file could not be parsed
    (it is then ignored, with a warning naming it).
  """
  return _rpa.load_tuned_block_sizes(path)


def set_cpu_binding(cpus) -> None:
  """Pins rpa's worker threads, process-wide, as RPA_CPU_BIND does (and
  replacing it): worker w >= 1 runs on cpus[w] only; cpus[0] is the calling
  thread's, which rpa never moves. Workers beyond the list keep their mask;
  an empty list unpins every worker. Takes effect at the next call that uses
  more than one thread; a call without num_threads then uses at most
  len(cpus) threads.

  Args:
    cpus: CPU numbers (ints), each in this process's affinity mask, once.

  Returns:
    None; the binding holds for the process until the next call.

  Raises:
    rpa.Error (kind "option"): a CPU outside the affinity mask, or listed
      twice; the binding is then unchanged.
  """
  _rpa.set_cpu_binding([int(c) for c in cpus])


def default_num_threads() -> int:
  """The thread count a call without num_threads uses.

  Args:
    None.

  Returns:
    RPA_NUM_THREADS, else the smallest of the affinity mask's CPUs, the
    cgroup CPU quota and the CPUs bound (set_cpu_binding / RPA_CPU_BIND).
  """
  return _rpa.default_num_threads()


def describe_threads() -> str:
  """Why default_num_threads() is what it is and where the workers run, for
  logs.

  Args:
    None.

  Returns:
    e.g. "2 CPUs (affinity mask 2, cgroup quota none), workers pinned to
    CPUs 0-1" (or "..., workers unpinned").
  """
  return _rpa.describe_threads()
