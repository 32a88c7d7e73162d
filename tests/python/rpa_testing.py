"""Shared helpers of the Python tests: batch builders and an independent
NumPy reference (a straight port of JAX's ref_ragged_paged_attention)."""

from __future__ import annotations

import dataclasses

import numpy as np

DEFAULT_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

# docs/contract.md §1's tolerance table, the one copy of the Python tests (the C++ one is
# testing/tolerance.h): max abs error of the fast path against the reference on
# unit-normal inputs, by K/V dtype (float32 at sm_scale = head_dim ** -0.5).
TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2,
             "float8_e4m3fn": 5e-2, "float8_e5m2": 5e-2, "int8": 5e-2}
FP8 = ("float8_e4m3fn", "float8_e5m2")


def dtype_name(dtype):
  """'float32', 'bfloat16', ... for a NumPy dtype or scalar type, a torch
  dtype or a name."""
  if isinstance(dtype, str):
    return dtype
  if type(dtype).__module__.split(".")[0] == "torch":
    return str(dtype).replace("torch.", "")
  return np.dtype(dtype).name


def tolerance(kv_dtype, expected=None, q_dtype=None):
  """TOLERANCE[kv_dtype]; with q_dtype, at least TOLERANCE[q_dtype] (a 16-bit
  output rounds by about that much); with `expected` and an 8-bit float K/V
  dtype, at least 2e-3 of the outputs' magnitude: their decode may multiply
  and sum in f16 (docs/decisions.md), ~2^-11 of the values summed per
  rounding."""
  kv_dtype = dtype_name(kv_dtype)
  tol = TOLERANCE[kv_dtype]
  if q_dtype is not None:
    tol = max(tol, TOLERANCE[dtype_name(q_dtype)])
  if expected is not None and kv_dtype in FP8:
    tol = max(tol, 2e-3 * float(np.nanmax(np.abs(np.asarray(to_numpy(expected), np.float64)))))
  return tol


def cdiv(a, b):
  return (a + b - 1) // b


@dataclasses.dataclass
class Batch:
  """A ragged batch in JAX's combined layout, all NumPy."""
  q: np.ndarray             # [max_num_batched_tokens, num_q_heads, head_dim]
  kv_pages: np.ndarray      # [total_num_pages, page_size, 2 * num_kv_heads, head_dim]
  kv_lens: np.ndarray       # i32[max_num_seqs]
  page_indices: np.ndarray  # i32[max_num_seqs, pages_per_seq]
  cu_q_lens: np.ndarray     # i32[max_num_seqs + 1]
  num_seqs: np.ndarray      # i32[1]

  @property
  def args(self):
    return (self.q, self.kv_pages, self.kv_lens, self.page_indices, self.cu_q_lens,
            self.num_seqs)

  def split(self, layout="NHD"):
    """(k_pages, v_pages) views of the combined cache in `layout` (copies for
    HND, strided views for NHD)."""
    k = self.kv_pages[:, :, 0::2, :]
    v = self.kv_pages[:, :, 1::2, :]
    if layout == "HND":
      k = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
      v = np.ascontiguousarray(v.transpose(0, 2, 1, 3))
    return k, v


def make_batch(rng, seqs, *, num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4,
               q_dtype=np.float32, kv_dtype=None, max_num_seqs=None, extra_columns=1,
               pad_tokens=3, first_row=0, spare_pages=2, poison=True) -> Batch:
  """`seqs` is a list of (q_len, kv_len). Unused pages, slots beyond kv_len,
  page-table columns beyond what a sequence reads and metadata rows beyond
  num_seqs hold poison (NaN, out-of-range indices, huge lengths): a correct
  implementation never reads them."""
  kv_dtype = kv_dtype or q_dtype
  num_seqs = len(seqs)
  max_num_seqs = max(num_seqs + 1, 1) if max_num_seqs is None else max_num_seqs
  pages_needed = [cdiv(kv, page_size) for _, kv in seqs]
  pages_per_seq = max(pages_needed + [1]) + extra_columns
  total_num_pages = sum(pages_needed) + spare_pages
  total_q = sum(q for q, _ in seqs)

  q = rng.standard_normal((first_row + total_q + pad_tokens, num_q_heads, head_dim))
  q = q.astype(q_dtype)
  shape = (max(total_num_pages, 1), page_size, 2 * num_kv_heads, head_dim)
  if np.dtype(kv_dtype) == np.int8:
    kv_pages = rng.integers(-127, 128, size=shape).astype(np.int8)
  else:
    kv_pages = rng.standard_normal(shape).astype(kv_dtype)

  perm = rng.permutation(total_num_pages)
  page_indices = np.full((max_num_seqs, pages_per_seq), 10**6 if poison else 0, np.int32)
  kv_lens = np.full(max_num_seqs, 10**6 if poison else 0, np.int32)
  cu_q_lens = np.full(max_num_seqs + 1, 0, np.int32)
  cu_q_lens[0] = first_row
  used = np.zeros(shape[0], bool)
  start = 0
  for i, ((q_len, kv_len), n) in enumerate(zip(seqs, pages_needed)):
    page_indices[i, :n] = perm[start:start + n]
    used[perm[start:start + n]] = True
    if poison and n < pages_per_seq:
      page_indices[i, n:] = -7  # Never read.
    start += n
    kv_lens[i] = kv_len
    cu_q_lens[i + 1] = cu_q_lens[i] + q_len
    # Slots beyond kv_len in the last page.
    if poison and n and kv_len % page_size and kv_pages.dtype != np.int8:
      kv_pages[page_indices[i, n - 1], kv_len % page_size:] = np.nan
  cu_q_lens[num_seqs + 1:] = cu_q_lens[num_seqs]
  if poison and kv_pages.dtype != np.int8:
    kv_pages[~used] = np.nan
  return Batch(q, kv_pages, kv_lens, page_indices, cu_q_lens, np.array([num_seqs], np.int32))


def softmax(x, axis):
  m = np.max(x, axis=axis, keepdims=True)
  e = np.exp(x - m)
  return e / np.sum(e, axis=axis, keepdims=True)


def numpy_ref(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale=1.0,
              sliding_window=None, soft_cap=None, mask_value=None, k_scale=None,
              v_scale=None, causal=True, alibi_slopes=None, custom_mask=None):
  """JAX's ref_ragged_paged_attention, ported to NumPy in float64.

  causal=False (rpa's): no causal mask; q_len may exceed kv_len.
  alibi_slopes (rpa's): [num_q_heads], logit += slope * (key - position).
  custom_mask (rpa's, FlashInfer's flat bool form): replaces the causal mask;
  dropped keys take no part, a row without a kept key is 0.

  Differences, all deliberate: only the pages a sequence reads are gathered
  (JAX gathers all of page_indices[i] and clamps out-of-range ones); the
  result has q's shape with zero padding rows (JAX concatenates the live
  rows); no rounding of scaled K/V or probabilities to a narrower dtype.
  """
  if mask_value is None:
    mask_value = DEFAULT_MASK_VALUE
  queries = np.asarray(queries, np.float64)
  kv_pages = np.asarray(kv_pages).astype(np.float64)
  _, page_size, num_combined_kv_heads, head_dim = kv_pages.shape
  num_kv_heads = num_combined_kv_heads // 2
  num_query_per_kv = queries.shape[1] // num_kv_heads
  out = np.zeros(queries.shape)
  mask_at = 0
  for i in range(int(num_seqs[0])):
    q_start, q_end = int(cu_q_lens[i]), int(cu_q_lens[i + 1])
    q_len = q_end - q_start
    kv_len = int(kv_lens[i])
    if custom_mask is not None:
      keep = np.asarray(custom_mask[mask_at:mask_at + q_len * kv_len], bool).reshape(q_len, kv_len)
      mask_at += q_len * kv_len
    if q_len == 0 or kv_len == 0:  # kv_len 0: a padded paged_attention slot.
      continue
    indices = page_indices[i][:cdiv(kv_len, page_size)]
    q = queries[q_start:q_end]
    k = kv_pages[indices, :, 0::2, :].reshape(-1, num_kv_heads, head_dim)[:kv_len]
    v = kv_pages[indices, :, 1::2, :].reshape(-1, num_kv_heads, head_dim)[:kv_len]
    if k_scale is not None:
      k = k * k_scale
    if v_scale is not None:
      v = v * v_scale
    k = np.repeat(k, num_query_per_kv, axis=1)
    v = np.repeat(v, num_query_per_kv, axis=1)
    attn = np.einsum("qhd,khd->hqk", q, k) * sm_scale
    q_span = (kv_len - q_len) + np.arange(q_len)[None, :, None]
    kv_span = np.arange(kv_len)[None, None, :]
    mask = (q_span < kv_span) & causal & (custom_mask is None)
    if sliding_window is not None:
      mask = np.logical_or(mask, q_span - sliding_window >= kv_span)
    if alibi_slopes is not None:
      attn = attn + np.asarray(alibi_slopes, np.float64)[:, None, None] * (kv_span - q_span)
    if soft_cap is not None:
      attn = soft_cap * np.tanh(attn / soft_cap)
    attn = attn + np.where(mask, mask_value, 0.0)
    if custom_mask is not None:
      attn = np.where(keep[None], attn, -np.inf)
      attn[:, ~keep.any(axis=1)] = 0.0  # No kept key: weights 0 below.
    attn = softmax(attn, axis=-1)
    if custom_mask is not None:
      attn = np.where(keep[None], attn, 0.0)
    out[q_start:q_end] = np.einsum("hqk,khd->qhd", attn, v)
  return out


def max_abs_diff(a, b):
  a = np.asarray(to_numpy(a), np.float64)
  b = np.asarray(to_numpy(b), np.float64)
  assert a.shape == b.shape, (a.shape, b.shape)
  if a.size == 0:
    return 0.0
  return float(np.max(np.abs(a - b)))


def to_numpy(x):
  if type(x).__module__.split(".")[0] == "torch":
    import torch

    if x.dtype == torch.bfloat16:
      x = x.float()
    return x.detach().cpu().numpy()
  return np.asarray(x)


def to_torch(x, dtype=None):
  import torch

  t = torch.from_numpy(np.ascontiguousarray(x))
  return t if dtype is None else t.to(dtype)
