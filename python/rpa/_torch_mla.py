"""The MLA cache writes as torch operators (registered by rpa.torch):

    concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="auto",
                         scale=None) -> ()
        vLLM's: kv_cache [num_blocks, block_size, head_dim_ckv + head_dim_kpe],
        each token's latent then its rotary key in one row.
    cache_mla(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, kv_cache_dtype="auto",
              scale=None) -> ()
        FlashInfer's two caches: ckv_cache [num_pages, page_size, head_dim_ckv],
        kpe_cache [num_pages, page_size, head_dim_kpe].

Token r goes to slot s = slot_mapping[r] (page s // page_size, offset
s % page_size); s = -1 skips it. kv_cache_dtype "auto" stores the values in
the cache's own float dtype (vLLM ignores `scale` then, and so does this);
"fp8" / "fp8_e4m3" stores x / scale as float8_e4m3fn codes (rpa.quantize's
conversion, saturating) in a uint8 or torch.float8_e4m3fn cache. Everything
is checked before the first write: a bad argument raises rpa.Error and
writes nothing.
"""

from __future__ import annotations

import math

import torch

from . import _api

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_FP8_NAMES = ("fp8", "fp8_e4m3", "float8_e4m3fn")
_FP8_CACHE = tuple(d for d in (torch.uint8, getattr(torch, "float8_e4m3fn", None)) if d)

SCHEMAS = {
    "concat_and_cache_mla":
        "concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, "
        "Tensor slot_mapping, str kv_cache_dtype=\"auto\", Tensor? scale=None) -> ()",
    "cache_mla":
        "cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) ckv_cache, Tensor(b!) kpe_cache, "
        "Tensor slot_mapping, str kv_cache_dtype=\"auto\", Tensor? scale=None) -> ()",
}


def _fail(kind, message):
  raise _api._error(kind, message)


def _shape(x):
  return tuple(x.shape)


def _check_tensors(tensors):
  for name, t in tensors.items():
    if not isinstance(t, torch.Tensor):
      _fail("dtype", f"{name} must be a torch.Tensor; got {type(t).__name__}. Pass tensors.")
    if t.device.type != "cpu":
      _fail("layout", f"{name}.device={t.device} is not supported; rpa runs on the CPU. Pass "
            f"{name}.cpu().")


def _check_rows(kv_c, k_pe, slot_mapping):
  if kv_c.dim() != 2 or k_pe.dim() != 2 or k_pe.shape[0] != kv_c.shape[0]:
    _fail("shape", f"kv_c.shape={_shape(kv_c)} and k_pe.shape={_shape(k_pe)} must be "
          "(num_tokens, head_dim_ckv) and (num_tokens, head_dim_kpe). Pass one latent and one "
          "rotary key per token.")
  if kv_c.dtype not in _FLOATS or k_pe.dtype != kv_c.dtype:
    _fail("dtype", f"kv_c.dtype={kv_c.dtype} and k_pe.dtype={k_pe.dtype} must be one of "
          "torch.float32, torch.float16, torch.bfloat16, and the same.")
  if slot_mapping.dim() != 1 or slot_mapping.shape[0] > kv_c.shape[0]:
    _fail("shape", f"slot_mapping.shape={_shape(slot_mapping)} must be (n,) with n <= "
          f"num_tokens={kv_c.shape[0]} (kv_c.shape[0]). Pass one slot per token, -1 for a "
          "token not to write.")
  if slot_mapping.dtype not in (torch.int64, torch.int32):
    _fail("dtype", f"slot_mapping.dtype={slot_mapping.dtype} is not supported; slot_mapping "
          "must be one of torch.int64, torch.int32. Cast it with slot_mapping.long().")


def _codes_of(kv_cache_dtype, cache_dtype, name):
  """True for float8 codes, False for the cache's own float dtype."""
  if kv_cache_dtype in (None, "auto"):
    if cache_dtype not in _FLOATS:
      _fail("dtype", f"{name}.dtype={cache_dtype} is not supported with "
            f"kv_cache_dtype={kv_cache_dtype!r}; {name} must be one of torch.float32, "
            "torch.float16, torch.bfloat16. For a cache of float8 codes pass "
            "kv_cache_dtype='fp8'.")
    return False
  if kv_cache_dtype not in _FP8_NAMES:
    _fail("option", f"kv_cache_dtype={kv_cache_dtype!r} must be one of 'auto', "
          f"{', '.join(repr(n) for n in _FP8_NAMES)}.")
  if cache_dtype not in _FP8_CACHE:
    _fail("dtype", f"{name}.dtype={cache_dtype} cannot hold kv_cache_dtype={kv_cache_dtype!r} "
          "codes; it must be torch.uint8 or torch.float8_e4m3fn.")
  return True


def _scale_of(scale, codes):
  if scale is None or not codes:
    return None
  if not isinstance(scale, torch.Tensor) or scale.numel() != 1:
    _fail("shape", f"scale must be a one-element tensor (vLLM's k_scale); got "
          f"{_shape(scale) if isinstance(scale, torch.Tensor) else type(scale).__name__}.")
  value = float(scale.reshape(()))
  if not (math.isfinite(value) and value > 0):
    _fail("option", f"scale={value!r} must be positive and finite. The cache stores "
          "x / scale.")
  return value


def checked_slots(slot_mapping, num_slots, page_size):
  """(rows to write, their slots) of vLLM's slot_mapping, every slot checked
  (in range or -1, none twice); also reshape_and_cache's check (torch.py)."""
  slots = slot_mapping.long()
  bad = torch.nonzero((slots < -1) | (slots >= num_slots))
  if bad.numel():
    r = int(bad[0, 0])
    _fail("page_index", f"slot_mapping[{r}]={int(slots[r])} must be -1 or in range [0, "
          f"{num_slots}) (num_pages * page_size = {num_slots // page_size} * {page_size}). A "
          "slot is page * page_size + offset; -1 skips the token.")
  rows = torch.nonzero(slots >= 0).flatten()
  slots = slots[rows]
  if slots.numel() > 1:
    ordered, order = torch.sort(slots, stable=True)
    repeat = torch.nonzero(ordered[1:] == ordered[:-1]).flatten()
    if repeat.numel():
      i = int(repeat[0])
      first, second = sorted((int(rows[order[i]]), int(rows[order[i + 1]])))
      _fail("metadata", f"slot_mapping[{second}]={int(slots[order[i]])} is also "
            f"slot_mapping[{first}]: each slot is written once per call. Give every token its "
            "own slot.")
  return rows, slots


def _write(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, kv_cache_dtype, scale, names):
  """The checks and the write of both forms; names: the caches' argument names."""
  codes = _codes_of(kv_cache_dtype, ckv_cache.dtype, names[0])
  value = _scale_of(scale, codes)
  num_pages, page_size = ckv_cache.shape[0], ckv_cache.shape[1]
  rows, slots = checked_slots(slot_mapping, num_pages * page_size, page_size)

  def stored(x, cache):
    x = x[rows]
    if codes:
      return _api.quantize(x, "float8_e4m3fn", value).view(cache.dtype)
    return x.to(cache.dtype)

  new_c, new_pe = stored(kv_c, ckv_cache), stored(k_pe, kpe_cache)  # Both before writing.
  pages, offsets = slots // page_size, slots % page_size
  with torch.no_grad():
    ckv_cache[pages, offsets] = new_c
    kpe_cache[pages, offsets] = new_pe


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="auto", scale=None):
  """vLLM's MLA cache write into kv_cache [num_blocks, block_size, ckv + kpe] (module doc)."""
  _check_tensors({"kv_c": kv_c, "k_pe": k_pe, "kv_cache": kv_cache,
                  "slot_mapping": slot_mapping})
  _check_rows(kv_c, k_pe, slot_mapping)
  ckv, kpe = kv_c.shape[1], k_pe.shape[1]
  if kv_cache.dim() != 3 or kv_cache.shape[2] != ckv + kpe:
    _fail("shape", f"kv_cache.shape={_shape(kv_cache)} must be (num_blocks, block_size, "
          f"{ckv + kpe}): each row holds kv_c's {ckv} and k_pe's {kpe} values.")
  _write(kv_c, k_pe, kv_cache[..., :ckv], kv_cache[..., ckv:], slot_mapping, kv_cache_dtype,
         scale, ("kv_cache", "kv_cache"))


def cache_mla(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, kv_cache_dtype="auto",
              scale=None):
  """The same write into FlashInfer's two caches (module doc)."""
  _check_tensors({"kv_c": kv_c, "k_pe": k_pe, "ckv_cache": ckv_cache, "kpe_cache": kpe_cache,
                  "slot_mapping": slot_mapping})
  _check_rows(kv_c, k_pe, slot_mapping)
  want = ((ckv_cache, kv_c.shape[1], "ckv_cache", "head_dim_ckv"),
          (kpe_cache, k_pe.shape[1], "kpe_cache", "head_dim_kpe"))
  for cache, dim, name, dim_name in want:
    if cache.dim() != 3 or cache.shape[2] != dim:
      _fail("shape", f"{name}.shape={_shape(cache)} must be (num_pages, page_size, "
            f"{dim_name}={dim}).")
  if _shape(kpe_cache)[:2] != _shape(ckv_cache)[:2] or kpe_cache.dtype != ckv_cache.dtype:
    _fail("shape", f"kpe_cache.shape={_shape(kpe_cache)} ({kpe_cache.dtype}) must have the "
          f"pages and page size of ckv_cache.shape={_shape(ckv_cache)} and its dtype "
          f"{ckv_cache.dtype}. Pass the two caches of one layer.")
  _write(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, kv_cache_dtype, scale,
         ("ckv_cache", "kpe_cache"))


def _meta(*args, **kwargs):
  return None


KERNELS = {
    "concat_and_cache_mla": (concat_and_cache_mla, _meta),
    "cache_mla": (cache_mla, _meta),
}
