"""Beyond JAX, from Python: quantized caches (float8_e4m3fn, float8_e5m2 and
int8 codes with scales, `kv_dtype=`), quantize / dequantize, merge_states,
and the fused KV write (ragged_paged_attention_with_kv_write).

Each is checked against the library's reference and against an independent
NumPy computation: float8 codes are decoded here from their bit fields, the
fused write's slots are computed here from docs/contract.md §1's positions."""

import numpy as np
import pytest

import rpa
from rpa_testing import (FP8, TOLERANCE, cdiv, make_batch, max_abs_diff, numpy_ref, to_numpy,
                         tolerance)

QUANTIZED = list(FP8) + ["int8"]
MIXED = [(1, 9), (5, 13), (7, 7), (1, 1), (3, 30)]  # decode, chunked, full prefill.


def decode(codes, dtype):
  """float64 values of codes, from the formats' bit fields (not the library's
  conversion): e4m3fn has bias 7, no infinity and S.1111.111 as NaN; e5m2 is
  IEEE-like with bias 15."""
  codes = np.asarray(codes)
  if dtype == "int8":
    return codes.view(np.int8).astype(np.float64)
  exp_bits, man_bits, bias = (4, 3, 7) if dtype == "float8_e4m3fn" else (5, 2, 15)
  c = codes.view(np.uint8).astype(np.int64)
  sign = np.where(c >> 7, -1.0, 1.0)
  exp = (c >> man_bits) & ((1 << exp_bits) - 1)
  man = (c & ((1 << man_bits) - 1)).astype(np.float64)
  value = np.where(exp == 0, man / 2**man_bits * 2.0**(1 - bias),
                   (1 + man / 2**man_bits) * 2.0**(exp - bias))
  top = (1 << exp_bits) - 1
  if dtype == "float8_e4m3fn":
    value = np.where((exp == top) & (man == 7), np.nan, value)
  else:
    value = np.where(exp == top, np.where(man == 0, np.inf, np.nan), value)
  return sign * value


ALL_CODES = np.arange(256, dtype=np.uint8)


def code_array(dtype, values):
  return np.asarray(values, np.int8 if dtype == "int8" else np.uint8)


# ---- quantize / dequantize.


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_dequantize_matches_bit_fields(dtype):
  codes = ALL_CODES.view(np.int8) if dtype == "int8" else ALL_CODES
  np.testing.assert_array_equal(rpa.dequantize(codes, dtype), decode(codes, dtype))
  scaled = rpa.dequantize(codes, dtype, 0.37)
  assert scaled.dtype == np.float32 and scaled.shape == (256,)
  np.testing.assert_array_equal(scaled, decode(codes, dtype).astype(np.float32) *
                                np.float32(0.37))


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_quantize_round_trips_every_code(dtype):
  codes = ALL_CODES.view(np.int8) if dtype == "int8" else ALL_CODES
  values = decode(codes, dtype)
  finite = ~np.isnan(values)
  back = rpa.quantize(values[finite].astype(np.float32), dtype)
  assert back.dtype == codes.dtype
  np.testing.assert_array_equal(back, codes[finite])  # -0.0 included.


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_quantize_rounds_to_nearest(rng, dtype):
  table = decode(ALL_CODES, dtype)
  table = np.unique(table[np.isfinite(table)])
  x = (rng.standard_normal(4000) * [0.01, 1, 30, 300][rng.integers(4)]).astype(np.float32)
  x = np.concatenate([x, rng.uniform(-table.max(), table.max(), 1000).astype(np.float32)])
  got = decode(rpa.quantize(x, dtype), dtype)
  nearest = np.min(np.abs(table[None, :] - x[:, None].astype(np.float64)), axis=1)
  np.testing.assert_array_equal(np.abs(got - x), nearest)


def test_quantize_saturates():
  e4m3 = rpa.dequantize(rpa.quantize(np.float32([1000, -1000, 448, 464, 1e30]),
                                     "float8_e4m3fn"), "float8_e4m3fn")
  np.testing.assert_array_equal(e4m3, [448, -448, 448, 448, 448])
  assert np.isnan(rpa.dequantize(rpa.quantize(np.float32([np.nan]), "float8_e4m3fn"),
                                 "float8_e4m3fn")[0])
  e5m2 = rpa.dequantize(rpa.quantize(np.float32([np.inf, -np.inf, 1e6, 57344, np.nan]),
                                     "float8_e5m2"), "float8_e5m2")
  np.testing.assert_array_equal(e5m2[:4], [np.inf, -np.inf, 57344, 57344])
  assert np.isnan(e5m2[4])
  i8 = rpa.quantize(np.float32([300, -300, 127.4, -128.6, 2.5, 3.5, -2.5, np.nan]), "int8")
  assert i8.dtype == np.int8
  np.testing.assert_array_equal(i8, [127, -128, 127, -128, 2, 4, -2, 0])


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_quantize_scale_and_shapes(rng, dtype):
  x = rng.standard_normal((3, 2, 5, 4, 2)).astype(np.float32) * 40  # 5-D, any rank.
  codes = rpa.quantize(x, dtype, 0.25)
  assert codes.shape == x.shape
  np.testing.assert_array_equal(codes, rpa.quantize(x / np.float32(0.25), dtype))
  # Strided and float16 / float64 inputs: converted to float32 first.
  np.testing.assert_array_equal(rpa.quantize(x[:, ::2, :, ::-1], dtype, 0.25),
                                codes[:, ::2, :, ::-1])
  np.testing.assert_array_equal(rpa.quantize(x.astype(np.float64), dtype, 0.25), codes)
  half = x.astype(np.float16)
  np.testing.assert_array_equal(rpa.quantize(half, dtype),
                                rpa.quantize(half.astype(np.float32), dtype))
  assert rpa.quantize(np.float32(3.0), dtype).shape == ()


def test_quantize_torch():
  torch = pytest.importorskip("torch")
  x = torch.randn(4, 3, 8) * 100
  for dtype in QUANTIZED:
    codes = rpa.quantize(x, dtype, 0.5)
    assert isinstance(codes, torch.Tensor)
    assert codes.dtype == (torch.int8 if dtype == "int8" else torch.uint8)
    np.testing.assert_array_equal(codes.numpy(), rpa.quantize(x.numpy(), dtype, 0.5))
    values = rpa.dequantize(codes, dtype, 0.5)
    assert isinstance(values, torch.Tensor) and values.dtype == torch.float32
    np.testing.assert_array_equal(values.numpy(),
                                  rpa.dequantize(codes.numpy(), dtype, 0.5))
  bf16 = x.to(torch.bfloat16)
  np.testing.assert_array_equal(rpa.quantize(bf16, "float8_e5m2").numpy(),
                                rpa.quantize(bf16.float().numpy(), "float8_e5m2"))


def test_quantize_errors():
  x = np.ones(4, np.float32)
  with pytest.raises(rpa.Error) as e:
    rpa.quantize(x, "float16")
  assert str(e.value) == ("dtype='float16' is not supported; dtype must be one of "
                          "'float8_e4m3fn', 'float8_e5m2', 'int8'. Pass one of these names.")
  assert e.value.kind == "dtype"
  with pytest.raises(rpa.Error, match=r"^scale=nan must be finite\. ") as e:
    rpa.quantize(x, "int8", float("nan"))
  assert e.value.kind == "option"
  with pytest.raises(rpa.Error, match=r"^x\.dtype=dtype\('int32'\) is not supported; x must "
                     r"be one of float32, bfloat16, float16, float64\."):
    rpa.quantize(np.ones(4, np.int32), "int8")
  with pytest.raises(rpa.Error) as e:
    rpa.dequantize(x, "float8_e5m2")
  assert str(e.value) == (
      "codes.dtype=dtype('float32') cannot be read as dtype='float8_e5m2'; dtype reads the "
      "bytes of a uint8 array as float8_e5m2 codes. Pass codes as uint8 (rpa.quantize makes "
      "such codes).")
  with pytest.raises(TypeError):
    rpa.quantize(x, "int8", "2")


# ---- Quantized caches.


def quantized_batch(rng, dtype, seqs=MIXED, k_scale=0.05, v_scale=0.02, **kwargs):
  """A batch whose float32 cache is replaced by codes of `dtype`: K heads
  quantized with k_scale, V heads with v_scale. NaN poison in unused slots
  stays NaN in the float8 formats."""
  b = make_batch(rng, seqs, **kwargs)
  codes = np.empty(b.kv_pages.shape, np.int8 if dtype == "int8" else np.uint8)
  codes[:, :, 0::2] = rpa.quantize(b.kv_pages[:, :, 0::2], dtype, k_scale)
  codes[:, :, 1::2] = rpa.quantize(b.kv_pages[:, :, 1::2], dtype, v_scale)
  b.kv_pages = codes
  return b


def dequantized(b, dtype, k_scale, v_scale):
  """The cache's values, float64, decoded here."""
  kv = decode(b.kv_pages, dtype)
  kv[:, :, 0::2] *= np.float32(k_scale)
  kv[:, :, 1::2] *= np.float32(v_scale)
  return kv


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_quantized_cache_vs_reference_and_numpy(rng, dtype):
  scales = dict(k_scale=0.05, v_scale=0.02)
  b = quantized_batch(rng, dtype, num_q_heads=8, num_kv_heads=2, head_dim=32, **scales)
  options = dict(sm_scale=32**-0.5, kv_dtype=dtype, **scales)
  out = rpa.ragged_paged_attention(*b.args, **options)
  ref = rpa.ref_ragged_paged_attention(*b.args, **options)
  assert out.dtype == np.float32 and out.shape == b.q.shape
  assert max_abs_diff(out, ref) <= tolerance(dtype, ref)
  # The library's reference vs dequantize-first in NumPy, from the bit fields.
  expected = numpy_ref(b.q, dequantized(b, dtype, **scales), *b.args[2:], sm_scale=32**-0.5)
  assert max_abs_diff(ref, expected) <= 1e-5
  # Dequantizing with rpa.dequantize first gives the reference bit for bit.
  f32 = np.empty(b.kv_pages.shape, np.float32)
  f32[:, :, 0::2] = rpa.dequantize(b.kv_pages[:, :, 0::2], dtype, scales["k_scale"])
  f32[:, :, 1::2] = rpa.dequantize(b.kv_pages[:, :, 1::2], dtype, scales["v_scale"])
  np.testing.assert_array_equal(
      rpa.ref_ragged_paged_attention(b.q, f32, *b.args[2:], sm_scale=32**-0.5), ref)


@pytest.mark.parametrize("dtype", QUANTIZED)
@pytest.mark.parametrize("options", [dict(), dict(sliding_window=5, soft_cap=20.0),
                                     dict(q_dtype=np.float16)],
                         ids=["plain", "window_softcap", "q_f16"])
def test_quantized_cache_options(rng, dtype, options):
  options = dict(options)
  q_dtype = options.pop("q_dtype", np.float32)
  b = quantized_batch(rng, dtype, q_dtype=q_dtype, page_size=5)
  kw = dict(kv_dtype=dtype, k_scale=0.05, v_scale=0.02, **options)
  out, lse = rpa.ragged_paged_attention(*b.args, return_lse=True, **kw)
  ref, ref_lse = rpa.ref_ragged_paged_attention(*b.args, return_lse=True, **kw)
  assert out.dtype == q_dtype
  tol = tolerance(dtype, ref, q_dtype=q_dtype)
  assert max_abs_diff(out, ref) <= tol
  n = int(b.num_seqs[0])
  live = slice(int(b.cu_q_lens[0]), int(b.cu_q_lens[n]))
  # 8-bit float decode may run in f16 (docs/decisions.md): logits, and so the
  # LSE, off by ~2^-11 of their partial sums.
  np.testing.assert_allclose(lse[live], ref_lse[live], atol=1e-2)
  # Without scales: the codes' own values.
  plain = rpa.ragged_paged_attention(*b.args, kv_dtype=dtype, sm_scale=0.01)
  plain_ref = numpy_ref(b.q, decode(b.kv_pages, dtype), *b.args[2:], sm_scale=0.01)
  assert max_abs_diff(plain, plain_ref) <= max(tol, tolerance(dtype, plain_ref))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", QUANTIZED)
def test_quantized_split_caches(rng, dtype, layout):
  b = quantized_batch(rng, dtype, num_q_heads=6, num_kv_heads=3, page_size=4)
  kw = dict(kv_dtype=dtype, k_scale=0.05, v_scale=0.02)
  combined = rpa.ref_ragged_paged_attention(*b.args, **kw)
  kv = b.split(layout)
  split = rpa.ragged_paged_attention(b.q, kv, *b.args[2:], kv_layout=layout, **kw)
  assert max_abs_diff(split, combined) <= tolerance(dtype, combined)
  np.testing.assert_array_equal(
      rpa.ref_ragged_paged_attention(b.q, kv, *b.args[2:], kv_layout=layout, **kw), combined)


def test_int8_and_uint8_caches(rng):
  b = quantized_batch(rng, "int8")
  kw = dict(k_scale=0.05, v_scale=0.02)
  out = rpa.ragged_paged_attention(*b.args, **kw)  # An int8 array is int8 on its own.
  np.testing.assert_array_equal(rpa.ragged_paged_attention(*b.args, kv_dtype="int8", **kw), out)
  as_bytes = b.kv_pages.view(np.uint8)
  np.testing.assert_array_equal(
      rpa.ragged_paged_attention(b.q, as_bytes, *b.args[2:], kv_dtype="int8", **kw), out)
  # kv_dtype naming the cache's own dtype changes nothing.
  f = make_batch(rng, MIXED)
  np.testing.assert_array_equal(rpa.ragged_paged_attention(*f.args, kv_dtype="float32"),
                                rpa.ragged_paged_attention(*f.args))


def test_quantized_cache_is_read_in_place(rng):
  b = quantized_batch(rng, "float8_e4m3fn")
  info = rpa._rpa.view_info(b.kv_pages)
  assert info["data"] == b.kv_pages.ctypes.data and not info["copied"]
  assert info["dtype"] == "uint8"  # kv_dtype reinterprets it inside the call.


def test_quantized_cache_torch(rng):
  torch = pytest.importorskip("torch")
  b = quantized_batch(rng, "float8_e5m2", q_dtype=np.float32)
  kw = dict(kv_dtype="float8_e5m2", k_scale=0.05, v_scale=0.02)
  expected = rpa.ref_ragged_paged_attention(*b.args, **kw)
  q = torch.from_numpy(b.q).to(torch.bfloat16)
  args = (q, torch.from_numpy(b.kv_pages)) + tuple(torch.from_numpy(a) for a in b.args[2:])
  out = rpa.ragged_paged_attention(*args, **kw)
  assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
  assert max_abs_diff(out, expected) <= TOLERANCE["float8_e5m2"]
  # torch's dtype objects name kv_dtype too, where torch has them.
  if hasattr(torch, "float8_e5m2"):
    native = torch.from_numpy(b.kv_pages).view(torch.float8_e5m2)
    out8 = rpa.ragged_paged_attention(q, native, *args[2:], k_scale=0.05, v_scale=0.02)
    np.testing.assert_array_equal(to_numpy(out8), to_numpy(out))
    with pytest.raises(rpa.Error, match="does not match kv_dtype='float8_e4m3fn'"):
      rpa.ragged_paged_attention(q, native, *args[2:], kv_dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_quantized_paged_attention(rng, dtype):
  k = rng.standard_normal((2, 30, 4, 16)).astype(np.float32)
  v = rng.standard_normal(k.shape).astype(np.float32)
  kc, vc = rpa.quantize(k * 8, dtype), rpa.quantize(v * 8, dtype)
  q = rng.standard_normal((4, 8, 16)).astype(np.float32) * 0.05
  lengths = np.array([1, 9, 24, 13], np.int32)
  page_indices = rng.integers(0, 30, size=(4, 6)).astype(np.int32)
  out = rpa.paged_attention(q, kc, vc, lengths, page_indices, pages_per_compute_block=2,
                            kv_dtype=dtype)
  combined = np.stack([decode(kc, dtype), decode(vc, dtype)], axis=3)
  combined = combined.transpose(1, 2, 0, 3, 4).reshape(30, 4, 4, 16)
  expected = numpy_ref(q, combined, lengths, page_indices, np.arange(5, dtype=np.int32),
                       np.array([4]))
  assert max_abs_diff(out, expected) <= tolerance(dtype, expected)


def test_validate_and_kv_dtype_errors(rng):
  b = quantized_batch(rng, "float8_e4m3fn")
  for fn in (rpa.static_validate_inputs, rpa.dynamic_validate_inputs):
    assert fn(*b.args, kv_dtype="float8_e4m3fn", k_scale=0.5) is None
    with pytest.raises(rpa.Error, match=r"^kv_pages\.dtype=dtype\('uint8'\) is not supported;"):
      fn(*b.args)  # The library's message: uint8 is not a KV dtype.
  for fn in (rpa.ragged_paged_attention, rpa.static_validate_inputs):
    with pytest.raises(rpa.Error) as e:
      fn(*b.args, kv_dtype="float4")
    assert str(e.value) == (
        "kv_dtype='float4' is not supported; kv_dtype must be one of 'float8_e4m3fn', "
        "'float8_e5m2', 'int8' or None. Pass one of these names (None reads the cache in its "
        "own dtype).")
    assert e.value.kind == "dtype"
  f = make_batch(rng, MIXED)
  out = np.full_like(f.q, 3.0)
  with pytest.raises(rpa.Error) as e:
    rpa.ragged_paged_attention(*f.args, kv_dtype="float8_e4m3fn", out=out)
  assert str(e.value) == (
      "kv_pages.dtype=dtype('float32') cannot be read as kv_dtype='float8_e4m3fn'; kv_dtype "
      "reads the bytes of a uint8 array as float8_e4m3fn codes. Pass kv_pages as uint8 "
      "(rpa.quantize makes such codes), or omit kv_dtype to use its own dtype.")
  assert np.all(out == 3.0)
  k, v = b.split("NHD")
  with pytest.raises(rpa.Error, match=r"^v_pages\.dtype=dtype\('int8'\) cannot be read as "):
    rpa.ragged_paged_attention(b.q, (k, v.view(np.int8)), *b.args[2:], kv_dtype="float8_e5m2")


# ---- merge_states.


def paged_cache(k, v, page_size, rng, num_pages_extra=1):
  """A combined cache holding keys k / values v ([n, num_kv_heads, head_dim])
  in shuffled pages, NaN in every other slot, and its page-table row."""
  n, heads, dim = k.shape
  pages = max(cdiv(n, page_size), 1)
  total = pages + num_pages_extra
  cache = np.full((total, page_size, 2 * heads, dim), np.nan, k.dtype)
  order = rng.permutation(total)[:pages]
  for t in range(n):
    cache[order[t // page_size], t % page_size, 0::2] = k[t]
    cache[order[t // page_size], t % page_size, 1::2] = v[t]
  return cache, order.astype(np.int32)


def attend(q, k, v, q_len, page_size, rng, rows_alone=False, **options):
  """Attention of q (the last q_len positions' queries) over keys k / values
  v, with return_lse. rows_alone: each row is its own decode sequence that
  sees every key (no causal mask within k)."""
  cache, pages = paged_cache(k, v, page_size, rng)
  if rows_alone:
    num = q.shape[0]
    kv_lens = np.full(num, k.shape[0], np.int32)
    cu_q_lens = np.arange(num + 1, dtype=np.int32)
    page_indices = np.tile(pages, (num, 1))
    num_seqs = np.array([num], np.int32)
  else:
    kv_lens = np.array([k.shape[0]], np.int32)
    cu_q_lens = np.array([0, q_len], np.int32)
    page_indices = pages[None, :]
    num_seqs = np.array([1], np.int32)
  return rpa.ragged_paged_attention(q, cache, kv_lens, page_indices, cu_q_lens, num_seqs,
                                    return_lse=True, **options)


def empty_part(q):
  """What rpa returns for rows that see no key: output 0, LSE -inf."""
  return np.zeros_like(q), np.full(q.shape[:2], -np.inf, np.float32)


@pytest.mark.parametrize("page_size", [1, 4, 5])
def test_merge_states_split_anywhere_decode(rng, page_size):
  kv_len, heads, kv_heads, dim = 17, 4, 2, 16
  q = rng.standard_normal((1, heads, dim)).astype(np.float32)
  k = rng.standard_normal((kv_len, kv_heads, dim)).astype(np.float32)
  v = rng.standard_normal((kv_len, kv_heads, dim)).astype(np.float32)
  options = dict(sm_scale=0.3, soft_cap=10.0)
  whole, whole_lse = attend(q, k, v, 1, page_size, rng, **options)
  for split in range(kv_len + 1):
    a = attend(q, k[:split], v[:split], 1, page_size, rng, rows_alone=True,
               **options) if split else empty_part(q)
    b = attend(q, k[split:], v[split:], 1, page_size, rng, **options) \
        if split < kv_len else empty_part(q)
    out, lse = rpa.merge_states(*a, *b)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    assert max_abs_diff(out, whole) <= 1e-5, split
    np.testing.assert_allclose(lse, whole_lse, atol=1e-5, err_msg=str(split))


def test_merge_states_split_anywhere_prefill(rng):
  # A chunk of q_len new tokens at the end of kv_len: keys [0, split) lie
  # before every query (seen in full); keys [split, kv_len) keep the causal
  # mask, with the same relative positions.
  kv_len, q_len, heads, kv_heads, dim = 19, 5, 6, 3, 8
  q = rng.standard_normal((q_len, heads, dim)).astype(np.float32)
  k = rng.standard_normal((kv_len, kv_heads, dim)).astype(np.float32)
  v = rng.standard_normal((kv_len, kv_heads, dim)).astype(np.float32)
  whole, whole_lse = attend(q, k, v, q_len, 4, rng)
  for split in range(1, kv_len - q_len + 1):
    a = attend(q, k[:split], v[:split], q_len, 4, rng, rows_alone=True)
    b = attend(q, k[split:], v[split:], q_len, 4, rng)
    out, lse = rpa.merge_states(*a, *b)
    assert max_abs_diff(out, whole) <= 1e-5, split
    np.testing.assert_allclose(lse, whole_lse, atol=1e-5, err_msg=str(split))
    # Merging is symmetric.
    np.testing.assert_allclose(rpa.merge_states(*b, *a)[0], out, atol=1e-6)


def test_merge_states_torch(rng):
  torch = pytest.importorskip("torch")
  kv_len, heads, kv_heads, dim = 23, 4, 1, 32
  q = rng.standard_normal((3, heads, dim)).astype(np.float32)
  k = rng.standard_normal((kv_len, kv_heads, dim)).astype(np.float32)
  v = rng.standard_normal((kv_len, kv_heads, dim)).astype(np.float32)
  whole, whole_lse = attend(q, k, v, 1, 4, rng, rows_alone=True)
  for split in (1, 8, 15, 22):
    a = attend(q, k[:split], v[:split], 1, 4, rng, rows_alone=True)
    b = attend(q, k[split:], v[split:], 1, 4, rng, rows_alone=True)
    out, lse = rpa.merge_states(*(torch.from_numpy(x) for x in a + b))
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert max_abs_diff(out, whole) <= 1e-5
    np.testing.assert_allclose(lse.numpy(), whole_lse, atol=1e-5)
    # bfloat16 outputs merge in float32 and round once.
    out16, lse16 = rpa.merge_states(torch.from_numpy(a[0]).bfloat16(), torch.from_numpy(a[1]),
                                    torch.from_numpy(b[0]).bfloat16(), torch.from_numpy(b[1]))
    assert out16.dtype == torch.bfloat16
    assert max_abs_diff(out16, whole) <= 2e-2
    np.testing.assert_allclose(lse16.numpy(), whole_lse, atol=1e-5)


def test_merge_states_empty_rows_and_errors(rng):
  out_a = rng.standard_normal((3, 2, 4)).astype(np.float32)
  lse_a = np.array([[0.5, -np.inf], [-np.inf, -np.inf], [1.0, 2.0]], np.float32)
  out_b, lse_b = empty_part(out_a)
  out, lse = rpa.merge_states(out_a, lse_a, out_b, lse_b)
  # One side empty: the other side unchanged. Both empty: 0 and -inf.
  np.testing.assert_array_equal(out[0, 0], out_a[0, 0])
  np.testing.assert_array_equal(out[2], out_a[2])
  assert not np.any(out[1]) and not np.any(out[0, 1])
  np.testing.assert_array_equal(lse, lse_a)
  with pytest.raises(rpa.Error) as e:
    rpa.merge_states(out_a, lse_a, out_b, lse_b[:2])
  assert str(e.value) == ("lse_b.shape=(2, 2) must be the same as lse_a.shape=(3, 2). Merge "
                          "states of the same rows and heads.")
  assert e.value.kind == "shape"
  with pytest.raises(rpa.Error, match=r"^out_b\.dtype=dtype\('float16'\) must be the same as "
                     r"out_a\.dtype=dtype\('float32'\)\."):
    rpa.merge_states(out_a, lse_a, out_b.astype(np.float16), lse_b)
  with pytest.raises(rpa.Error, match=r"^lse_a\.dtype=dtype\('float64'\) must be float32\."):
    rpa.merge_states(out_a, lse_a.astype(np.float64), out_b, lse_b)


# ---- Fused KV write.


def expected_write(cache, new_k, new_v, kv_lens, page_indices, cu_q_lens, num_seqs, store):
  """docs/contract.md §1's slots, computed here: position kv_len - q_len + j of sequence i
  takes row cu_q_lens[i] + j. `store(rows, which)` converts rows of new_k
  (which=0) or new_v (which=1) to the cache's bytes. Returns the written
  cache and a mask of the slots written."""
  cache = cache.copy()
  written = np.zeros(cache.shape[:2], bool)
  page_size = cache.shape[1]
  for i in range(int(num_seqs[0])):
    q_start, q_len = int(cu_q_lens[i]), int(cu_q_lens[i + 1] - cu_q_lens[i])
    for j in range(q_len):
      p = int(kv_lens[i]) - q_len + j
      page, slot = page_indices[i, p // page_size], p % page_size
      cache[page, slot, 0::2] = store(new_k[q_start + j], 0)
      cache[page, slot, 1::2] = store(new_v[q_start + j], 1)
      written[page, slot] = True
  return cache, written


WRITE_SEQS = [(1, 7), (4, 4), (3, 11), (0, 5), (2, 2), (6, 20)]


def write_case(rng, cache_dtype, heads=(4, 2), head_dim=16, page_size=3, new_dtype=np.float32):
  b = make_batch(rng, WRITE_SEQS, num_q_heads=heads[0], num_kv_heads=heads[1],
                 head_dim=head_dim, page_size=page_size, poison=False, pad_tokens=2)
  rows = b.q.shape[0]
  new_k = rng.standard_normal((rows, heads[1], head_dim)).astype(new_dtype)
  new_v = rng.standard_normal((rows, heads[1], head_dim)).astype(new_dtype)
  if cache_dtype in QUANTIZED:
    b.kv_pages = rpa.quantize(b.kv_pages, cache_dtype, 0.1)
  else:
    b.kv_pages = b.kv_pages.astype(cache_dtype)
  return b, new_k, new_v


def store_for(cache_dtype, k_scale, v_scale):
  scales = (np.float32(k_scale), np.float32(v_scale))
  if cache_dtype in QUANTIZED:
    return lambda rows, which: rpa.quantize(rows, cache_dtype, float(scales[which]))
  # float32 / float16: x / scale in float32, then NumPy's nearest-even cast.
  return lambda rows, which: (rows.astype(np.float32) / scales[which]).astype(cache_dtype)


@pytest.mark.parametrize("cache_dtype", ["float32", "float16"] + QUANTIZED)
def test_fused_write_bytes_and_output(rng, cache_dtype):
  b, new_k, new_v = write_case(rng, cache_dtype)
  k_scale, v_scale = 0.5, 0.125
  kw = dict(k_scale=k_scale, v_scale=v_scale, sm_scale=0.25)
  if cache_dtype in FP8:
    kw["kv_dtype"] = cache_dtype
  before = b.kv_pages.copy()
  expected, written = expected_write(before, new_k, new_v, *b.args[2:],
                                     store_for(cache_dtype, k_scale, v_scale))
  cache = b.kv_pages
  out = rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v, *b.args[1:], **kw)
  assert cache is b.kv_pages
  np.testing.assert_array_equal(cache.view(np.uint8), expected.view(np.uint8))  # Every byte.
  np.testing.assert_array_equal(cache[~written].view(np.uint8), before[~written].view(np.uint8))
  assert written.sum() == sum(q for q, _ in WRITE_SEQS)
  untouched_pages = ~written.any(axis=1)
  assert untouched_pages.any()
  np.testing.assert_array_equal(cache[untouched_pages].view(np.uint8),
                                before[untouched_pages].view(np.uint8))
  ref = rpa.ref_ragged_paged_attention(*b.args, **kw)
  tol = tolerance(cache_dtype, ref)
  assert max_abs_diff(out, ref) <= tol
  if cache_dtype in QUANTIZED:  # And dequantize-first in NumPy.
    kv = dequantized(b, cache_dtype, k_scale, v_scale)
    expected_out = numpy_ref(b.q, kv, *b.args[2:], sm_scale=0.25)
  else:
    expected_out = numpy_ref(b.q, cache.astype(np.float64), *b.args[2:], sm_scale=0.25,
                             k_scale=k_scale, v_scale=v_scale)
  assert max_abs_diff(out, expected_out) <= tol


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("cache_dtype", ["float32", "float8_e4m3fn"])
def test_fused_write_split_caches(rng, layout, cache_dtype):
  b, new_k, new_v = write_case(rng, cache_dtype, heads=(6, 3), page_size=4)
  kw = dict(k_scale=0.5, v_scale=2.0, kv_dtype=None if cache_dtype == "float32" else
            cache_dtype)
  expected, _ = expected_write(b.kv_pages, new_k, new_v, *b.args[2:],
                               store_for(cache_dtype, 0.5, 2.0))
  k, v = b.split(layout)  # NHD: strided views of the combined cache, written in place.
  out, lse = rpa.ragged_paged_attention_with_kv_write(
      b.q, new_k, new_v, (k, v), *b.args[2:], kv_layout=layout, return_lse=True, **kw)
  b.kv_pages = expected
  ek, ev = b.split(layout)
  np.testing.assert_array_equal(k.view(np.uint8), ek.view(np.uint8))
  np.testing.assert_array_equal(v.view(np.uint8), ev.view(np.uint8))
  ref, ref_lse = rpa.ref_ragged_paged_attention(b.q, (ek, ev), *b.args[2:], kv_layout=layout,
                                                return_lse=True, **kw)
  assert max_abs_diff(out, ref) <= tolerance(cache_dtype, ref)
  np.testing.assert_allclose(lse, ref_lse, atol=1e-2 if cache_dtype != "float32" else 1e-5)


def test_fused_write_torch_in_place(rng):
  torch = pytest.importorskip("torch")
  b, new_k, new_v = write_case(rng, "float8_e5m2")
  expected, _ = expected_write(b.kv_pages, new_k, new_v, *b.args[2:],
                               store_for("float8_e5m2", 1.0, 1.0))
  cache = torch.from_numpy(b.kv_pages.copy())
  pointer = cache.data_ptr()
  t = [torch.from_numpy(a) for a in b.args[2:]]
  out = rpa.ragged_paged_attention_with_kv_write(
      torch.from_numpy(b.q).bfloat16(), torch.from_numpy(new_k).bfloat16(),
      torch.from_numpy(new_v).bfloat16(), cache, *t, kv_dtype="float8_e5m2")
  assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
  assert cache.data_ptr() == pointer
  # new rows in bfloat16: expected from the same bfloat16 values.
  expected, _ = expected_write(
      b.kv_pages, torch.from_numpy(new_k).bfloat16().float().numpy(),
      torch.from_numpy(new_v).bfloat16().float().numpy(), *b.args[2:],
      store_for("float8_e5m2", 1.0, 1.0))
  np.testing.assert_array_equal(cache.numpy(), expected)
  ref = rpa.ref_ragged_paged_attention(torch.from_numpy(b.q).bfloat16(), cache, *t,
                                       kv_dtype="float8_e5m2")
  assert max_abs_diff(out, ref) <= TOLERANCE["float8_e5m2"]


def test_fused_write_into_a_layout_that_needs_a_copy(rng):
  # A cache whose head_dim runs backwards: rpa writes a contiguous copy and
  # copies it back after success.
  b, new_k, new_v = write_case(rng, "float32")
  expected, _ = expected_write(b.kv_pages, new_k, new_v, *b.args[2:],
                               store_for("float32", 1.0, 1.0))
  storage = np.ascontiguousarray(b.kv_pages[..., ::-1])
  cache = storage[..., ::-1]
  assert not cache.flags.c_contiguous
  out = rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v, cache, *b.args[2:])
  np.testing.assert_array_equal(cache, expected)
  assert (max_abs_diff(out, rpa.ref_ragged_paged_attention(b.q, expected, *b.args[2:]))
          <= TOLERANCE["float32"])


def test_fused_write_with_sinks_and_out(rng):
  b, new_k, new_v = write_case(rng, "int8")
  sinks = rng.standard_normal(4).astype(np.float32)
  out = np.full_like(b.q, 9.0)
  kw = dict(k_scale=0.05, v_scale=0.05, sinks=sinks, sliding_window=4)
  result = rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v, *b.args[1:], out=out,
                                                    **kw)
  assert result is out
  assert max_abs_diff(out, rpa.ref_ragged_paged_attention(*b.args, **kw)) <= TOLERANCE["int8"]


def misaligned(a):
  """A copy of `a` whose data starts one byte past an element boundary."""
  raw = np.zeros(a.nbytes + 1, np.uint8)
  odd = raw[1:].view(a.dtype).reshape(a.shape)
  odd[...] = a
  return odd


def test_misaligned_new_rows_and_merge_states_are_copied(rng):
  # The library rejects views at odd byte addresses (finding F4 in
  # docs/robustness.md), new_k / new_v and merge_states' arrays included;
  # the Python layer copies such arrays first, so these calls succeed.
  b, new_k, new_v = write_case(rng, "float32")
  assert rpa._rpa.view_info(misaligned(new_k))["copied"]
  want = rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v, b.kv_pages.copy(),
                                                  *b.args[2:])
  got = rpa.ragged_paged_attention_with_kv_write(b.q, misaligned(new_k), misaligned(new_v),
                                                 b.kv_pages.copy(), *b.args[2:])
  np.testing.assert_array_equal(got, want)
  parts = [rng.standard_normal(shape).astype(np.float32) for shape in [(3, 2, 4), (3, 2)] * 2]
  for want, got in zip(rpa.merge_states(*parts), rpa.merge_states(*map(misaligned, parts))):
    np.testing.assert_array_equal(got, want)


def test_fused_write_errors_touch_nothing(rng):
  b, new_k, new_v = write_case(rng, "float8_e4m3fn")
  cache = b.kv_pages
  before = cache.copy()
  out = np.full_like(b.q, 7.0)
  kw = dict(kv_dtype="float8_e4m3fn", out=out, k_scale=0.5)

  # A page index out of range in a page sequence 5 reads (it writes too).
  page_indices = b.page_indices.copy()
  page_indices[5, 6] = cache.shape[0]
  args = (b.kv_lens, page_indices, b.cu_q_lens, b.num_seqs)
  with pytest.raises(ValueError) as e:
    rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v, cache, *args, **kw)
  assert isinstance(e.value, rpa.Error) and e.value.kind == "page_index"
  assert str(e.value) == (
      f"page_indices[5, 6]={cache.shape[0]} must be in range [0, total_num_pages="
      f"{cache.shape[0]}) because sequence 5 reads it (kv_lens[5]=20, page_size=3). Point "
      "every page a sequence's kv_len covers at a page of the cache; columns beyond "
      "ceil(kv_len / page_size) are never read and may hold anything.")
  with pytest.raises(ValueError) as same:  # The library's check, the same text.
    rpa.dynamic_validate_inputs(b.q, cache, *args, kv_dtype="float8_e4m3fn")
  assert str(same.value) == str(e.value)
  np.testing.assert_array_equal(cache, before)
  assert np.all(out == 7.0)

  # new_k of the wrong shape.
  with pytest.raises(ValueError) as e:
    rpa.ragged_paged_attention_with_kv_write(b.q, new_k[:-1], new_v, cache, *b.args[2:], **kw)
  rows, heads, dim = new_k.shape
  assert str(e.value) == (
      f"new_k.shape=({rows - 1}, {heads}, {dim}) must be ({rows}, {heads}, {dim}) = "
      "(max_num_batched_tokens, num_kv_heads, head_dim). Row r of new_k belongs to q row r: "
      "give it q's rows, the cache's kv heads and head_dim.")
  assert e.value.kind == "shape"
  with pytest.raises(rpa.Error, match=r"^new_v\.dtype=dtype\('int32'\) is not supported"):
    rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v.astype(np.int32), cache,
                                             *b.args[2:], **kw)
  np.testing.assert_array_equal(cache, before)
  assert np.all(out == 7.0)

  # A read-only cache cannot be written.
  cache.flags.writeable = False
  with pytest.raises(rpa.Error) as e:
    rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v, cache, *b.args[2:], **kw)
  assert str(e.value) == ("kv_pages is read-only, and this call writes into it. Pass a "
                          "writable array (a NumPy copy is).")
  cache.flags.writeable = True
  np.testing.assert_array_equal(cache, before)
  assert np.all(out == 7.0)

  # The same batch, valid: now it writes.
  rpa.ragged_paged_attention_with_kv_write(b.q, new_k, new_v, cache, *b.args[2:], **kw)
  assert not np.array_equal(cache, before) and not np.all(out == 7.0)


def test_fused_write_signature():
  import inspect

  params = list(inspect.signature(rpa.ragged_paged_attention_with_kv_write).parameters.values())
  names = [p.name for p in params]
  assert names[:8] == ["q", "new_k", "new_v", "kv_pages", "kv_lens", "page_indices",
                       "cu_q_lens", "num_seqs"]
  # Every option of ragged_paged_attention, keyword-only, with its default.
  ragged = list(inspect.signature(rpa.ragged_paged_attention).parameters.values())[6:]
  assert [(p.name, p.kind, p.default) for p in params[8:]] == [
      (p.name, p.kind, p.default) for p in ragged]
