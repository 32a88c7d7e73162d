"""rpa's operations as torch operators: `torch.ops.rpa.*` (torch.library).

Registered when torch is loaded: `import rpa` registers them at once if
torch is already imported, else right after torch's own import finishes
(`import rpa` itself never imports torch). `import rpa.torch` registers them
explicitly (importing torch). The operators, on CPU tensors:

    ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens,
                           num_seqs, *, <options>) -> Tensor
    ragged_paged_attention.out(..., *, <options>, Tensor(a!) out) -> Tensor(a!)
    ragged_paged_attention_with_lse(..., *, <options>) -> (Tensor, Tensor)
    reshape_and_cache(key, value, k_cache, v_cache, slot_mapping,
                      kv_cache_dtype="auto", k_scale=None, v_scale=None, *,
                      kv_layout="NHD") -> ()
    merge_states(out_a, lse_a, out_b, lse_b, *, lse_base=e) -> (Tensor, Tensor)
    concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="auto",
                         scale=None) -> ()
    cache_mla(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, kv_cache_dtype="auto",
              scale=None) -> ()

<options> are `rpa.ragged_paged_attention`'s keywords (sm_scale,
sliding_window, soft_cap, mask_value, k_scale, v_scale,
num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes, kv_layout,
kv_dtype, sinks, num_threads, causal, alibi_slopes) plus `v_pages`: given, `kv_pages` is the K
cache and `v_pages` the V cache of separate caches in `kv_layout` (NHD by
default), the Python API's `kv_pages=(k_pages, v_pages)`. Threads: an
attention operator called without `num_threads` uses `torch.get_num_threads()`
threads (unless RPA_NUM_THREADS is set), so `torch.set_num_threads(n)` sizes
torch's intra-op pool and rpa's together (docs/python.md, "Threads"). Every operator
validates as the Python API does and raises its rpa.Error (a ValueError)
with the same message, before anything is written. Meta kernels give the
output shapes (torch.device("meta"), FakeTensor, make_fx).
"""

from __future__ import annotations

import math
import os

import torch

from . import _api, _torch_mla
from ._torch_mla import cache_mla, concat_and_cache_mla

__all__ = ["reshape_and_cache", "concat_and_cache_mla", "cache_mla", "OPS"]

# torch.ops.rpa.<name>: what this module registers.
OPS = ("ragged_paged_attention", "ragged_paged_attention_with_lse", "reshape_and_cache",
       "merge_states", *_torch_mla.SCHEMAS)

_ARGS = ("Tensor q, Tensor kv_pages, Tensor kv_lens, Tensor page_indices, Tensor cu_q_lens, "
         "Tensor num_seqs")
# rpa.ragged_paged_attention's options that a schema can carry (_api's one
# list), then v_pages: a schema has no tuple argument, so separate caches are
# kv_pages = K and v_pages = V.
_OPTIONS = ", ".join(
    [f"{o.torch} {o.name}={o.torch_default if o.torch_default is not None else o.default!r}"
     for o in _api.RAGGED_OPTIONS if o.torch] + ["Tensor? v_pages=None"])

SCHEMAS = {
    "ragged_paged_attention": f"ragged_paged_attention({_ARGS}, *, {_OPTIONS}) -> Tensor",
    "ragged_paged_attention.out":
        f"ragged_paged_attention.out({_ARGS}, *, {_OPTIONS}, Tensor(a!) out) -> Tensor(a!)",
    "ragged_paged_attention_with_lse":
        f"ragged_paged_attention_with_lse({_ARGS}, *, {_OPTIONS}) -> (Tensor, Tensor)",
    "reshape_and_cache":
        "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slot_mapping, str kv_cache_dtype=\"auto\", float? k_scale=None, "
        "float? v_scale=None, *, str kv_layout=\"NHD\") -> ()",
    "merge_states":
        f"merge_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b, *, "
        f"float lse_base={math.e!r}) -> (Tensor, Tensor)",
    **_torch_mla.SCHEMAS,  # The MLA cache writes (rpa/_torch_mla.py).
}


def _cache_arg(kv_pages, v_pages):
  return kv_pages if v_pages is None else (kv_pages, v_pages)


def _num_threads(num_threads):
  """The op's thread count: the caller's, else RPA_NUM_THREADS (None: the
  library reads it), else torch's intra-op count. An op runs inline on
  torch's thread between torch's own parallel ops, so it takes the count the
  user gave torch (torch.set_num_threads) rather than rpa's own default
  (every CPU of the process): one knob for both pools, and no more rpa
  threads than torch was allowed."""
  if num_threads is not None or os.environ.get("RPA_NUM_THREADS"):
    return num_threads
  return torch.get_num_threads()


def _ragged(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, v_pages=None,
            return_lse=False, out=None, num_threads=None, **options):
  options["num_threads"] = _num_threads(num_threads)
  return _api.ragged_paged_attention(q, _cache_arg(kv_pages, v_pages), kv_lens, page_indices,
                                     cu_q_lens, num_seqs, return_lse=return_lse, out=out,
                                     **options)


def _ragged_out(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, out, **options):
  _ragged(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, out=out, **options)
  return out


def _ragged_lse(*args, **options):
  return tuple(_ragged(*args, return_lse=True, **options))


def _merge_states(out_a, lse_a, out_b, lse_b, *, lse_base=math.e):
  return tuple(_api.merge_states(out_a, lse_a, out_b, lse_b, lse_base=lse_base))


# ---- reshape_and_cache: vLLM's KV write, validated like the rest of rpa.

# kv_cache_dtype: vLLM's names and rpa's, for a uint8 (int8) cache of codes.
_CODES = {
    "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2", "int8": "int8",
}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_LAYOUT_SHAPE = {"NHD": "(num_pages, page_size, num_kv_heads, head_dim)",
                 "HND": "(num_pages, num_kv_heads, page_size, head_dim)"}


def _fail(kind, message):
  raise _api._error(kind, message)


def _shape(x):
  return tuple(x.shape)


def _check_scale(scale, name):
  if scale is not None and not math.isfinite(scale):
    _fail("option", f"{name}={scale!r} must be finite. Pass a finite float for {name}, or None "
          "to leave it out.")


def reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, kv_cache_dtype="auto",
                      k_scale=None, v_scale=None, *, kv_layout="NHD"):
  """Writes a step's new keys and values into separate paged caches, in place.

  vLLM's convention: token r goes to slot s = slot_mapping[r], i.e. page
  s // page_size, offset s % page_size; s = -1 skips the row (padding).
  Rows of key beyond len(slot_mapping) are not written either. Stored as
  key / k_scale (value / v_scale) rounded to the cache's dtype, or as
  float8 / int8 codes (rpa.quantize's conversion, the fused write's) when
  kv_cache_dtype names them, so what it writes is bit for bit what
  `ragged_paged_attention_with_kv_write` writes.

  Args:
    key, value: [num_tokens, num_kv_heads, head_dim], float32, float16 or
      bfloat16.
    k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim] (NHD) or
      [num_pages, num_kv_heads, page_size, head_dim] (HND), one shape and
      dtype: float32, float16, bfloat16; int8 (codes); uint8 codes with
      kv_cache_dtype.
    slot_mapping: int64 or int32 [n], n <= num_tokens.
    kv_cache_dtype: "auto" (the cache's own dtype; an int8 cache holds int8
      codes), or "fp8" / "fp8_e4m3" / "float8_e4m3fn", "fp8_e5m2" /
      "float8_e5m2", "int8" for a cache of codes.
    k_scale, v_scale: the caches' scales (None for 1).
    kv_layout: "NHD" or "HND".

  Raises:
    ValueError (rpa.Error): a shape, dtype, layout or slot that does not fit;
      nothing is written.
  """
  if kv_layout not in _LAYOUT_SHAPE:
    _fail("option", f"kv_layout={kv_layout!r} must be 'NHD' or 'HND'. 'NHD' is [num_pages, "
          "page_size, num_kv_heads, head_dim] (vLLM, FlashInfer), 'HND' is [num_pages, "
          "num_kv_heads, page_size, head_dim].")
  tensors = {"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache,
             "slot_mapping": slot_mapping}
  for name, t in tensors.items():
    if not isinstance(t, torch.Tensor):
      _fail("dtype", f"{name} must be a torch.Tensor; got {type(t).__name__}. Pass tensors to "
            "torch.ops.rpa.reshape_and_cache (rpa.ragged_paged_attention_with_kv_write "
            "takes NumPy arrays).")
    if t.device.type != "cpu":
      _fail("layout", f"{name}.device={t.device} is not supported; rpa runs on the CPU. Pass "
            f"{name}.cpu().")
  if key.dim() != 3:
    _fail("shape", f"key.shape={_shape(key)} must be (num_tokens, num_kv_heads, head_dim). "
          "Pass the step's new keys, one row per token.")
  if _shape(value) != _shape(key):
    _fail("shape", f"value.shape={_shape(value)} must be the same as key.shape={_shape(key)}. "
          "Pass one key row and one value row per token.")
  if k_cache.dim() != 4:
    _fail("shape", f"k_cache.shape={_shape(k_cache)} must be {_LAYOUT_SHAPE[kv_layout]} for "
          f"kv_layout={kv_layout!r}.")
  if _shape(v_cache) != _shape(k_cache):
    _fail("shape", f"v_cache.shape={_shape(v_cache)} must be the same as "
          f"k_cache.shape={_shape(k_cache)}. Pass the K and V caches of one layer.")
  if kv_layout == "NHD":
    num_pages, page_size, heads, head_dim = _shape(k_cache)
  else:
    num_pages, heads, page_size, head_dim = _shape(k_cache)
  if (heads, head_dim) != _shape(key)[1:]:
    _fail("shape", f"k_cache.shape={_shape(k_cache)} holds num_kv_heads={heads} and "
          f"head_dim={head_dim}, but key.shape={_shape(key)} has num_kv_heads={key.shape[1]} "
          f"and head_dim={key.shape[2]}. Pass the cache of the layer these keys belong to "
          f"(kv_layout={kv_layout!r}: {_LAYOUT_SHAPE[kv_layout]}).")
  if slot_mapping.dim() != 1 or slot_mapping.shape[0] > key.shape[0]:
    _fail("shape", f"slot_mapping.shape={_shape(slot_mapping)} must be (n,) with n <= "
          f"num_tokens={key.shape[0]} (key.shape[0]). Pass one slot per token, -1 for a token "
          "not to write.")

  if key.dtype not in _FLOATS or value.dtype != key.dtype:
    _fail("dtype", f"key.dtype={key.dtype} and value.dtype={value.dtype} must be one of "
          "torch.float32, torch.float16, torch.bfloat16, and the same. Cast key and value to "
          "the model's dtype.")
  if v_cache.dtype != k_cache.dtype:
    _fail("dtype", f"v_cache.dtype={v_cache.dtype} must be the same as "
          f"k_cache.dtype={k_cache.dtype}. Pass the K and V caches of one layer.")
  if slot_mapping.dtype not in (torch.int64, torch.int32):
    _fail("dtype", f"slot_mapping.dtype={slot_mapping.dtype} is not supported; slot_mapping "
          "must be one of torch.int64, torch.int32. Cast it with slot_mapping.long().")
  if kv_cache_dtype in (None, "auto"):
    codes = "int8" if k_cache.dtype == torch.int8 else None
    if codes is None and k_cache.dtype not in _FLOATS:
      _fail("dtype", f"k_cache.dtype={k_cache.dtype} is not supported with "
            f"kv_cache_dtype={kv_cache_dtype!r}; k_cache must be one of torch.float32, "
            "torch.float16, torch.bfloat16, torch.int8. For a uint8 cache of float8 codes pass "
            "kv_cache_dtype='fp8' (e4m3fn) or 'fp8_e5m2'.")
  else:
    codes = _CODES.get(str(kv_cache_dtype))
    if codes is None:
      _fail("option", f"kv_cache_dtype={kv_cache_dtype!r} must be one of 'auto', "
            f"{', '.join(repr(n) for n in _CODES)}.")
    allowed = (torch.uint8, torch.int8) if codes == "int8" else (torch.uint8,)
    if k_cache.dtype not in allowed:
      _fail("dtype", f"k_cache.dtype={k_cache.dtype} cannot hold kv_cache_dtype="
            f"{kv_cache_dtype!r} codes; it must be "
            f"{' or '.join(str(d) for d in allowed)}. Pass kv_cache_dtype='auto' for a cache "
            "of its own dtype.")
  _check_scale(k_scale, "k_scale")
  _check_scale(v_scale, "v_scale")

  rows, slots = _torch_mla.checked_slots(slot_mapping, num_pages * page_size, page_size)

  def stored(x, scale):
    x = x[rows]
    if codes is not None:
      return _api.quantize(x, codes, scale)
    if scale is not None:
      x = x.float() / scale
    return x.to(k_cache.dtype)

  # Everything is checked; convert both before writing either.
  new_k, new_v = stored(key, k_scale), stored(value, v_scale)
  pages, offsets = slots // page_size, slots % page_size
  with torch.no_grad():
    if kv_layout == "NHD":
      k_cache[pages, offsets] = new_k
      v_cache[pages, offsets] = new_v
    else:
      k_cache[pages, :, offsets] = new_k
      v_cache[pages, :, offsets] = new_v


# ---- Meta kernels: output shapes only (meta tensors, FakeTensor, make_fx).


def _meta_ragged(q, *args, **options):
  return q.new_empty(_shape(q))


def _meta_ragged_out(q, *args, out, **options):
  return out


def _meta_ragged_lse(q, *args, **options):
  return q.new_empty(_shape(q)), q.new_empty(_shape(q)[:2], dtype=torch.float32)


def _meta_reshape_and_cache(*args, **kwargs):
  return None


def _meta_merge_states(out_a, lse_a, out_b, lse_b, **options):
  return out_a.new_empty(_shape(out_a)), out_a.new_empty(_shape(out_a)[:2], dtype=torch.float32)


_KERNELS = {
    "ragged_paged_attention": (_ragged, _meta_ragged),
    "ragged_paged_attention.out": (_ragged_out, _meta_ragged_out),
    "ragged_paged_attention_with_lse": (_ragged_lse, _meta_ragged_lse),
    "reshape_and_cache": (reshape_and_cache, _meta_reshape_and_cache),
    "merge_states": (_merge_states, _meta_merge_states),
    **_torch_mla.KERNELS,
}


def _register():
  """Defines torch.ops.rpa.* once per process; returns the Library (keep it:
  torch drops the registrations when it is collected)."""
  lib = torch.library.Library("rpa", "DEF")
  for name, schema in SCHEMAS.items():
    lib.define(schema)
    cpu, meta = _KERNELS[name]
    lib.impl(name, cpu, "CPU")
    lib.impl(name, meta, "Meta")
    try:
      # torch 1.13 has no autograd fallthrough for meta tensors.
      lib.impl(name, meta, "AutogradMeta")
    except RuntimeError:
      pass
  return lib


_LIBRARY = _register()
