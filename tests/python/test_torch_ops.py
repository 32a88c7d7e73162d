"""torch.ops.rpa: the operators rpa registers with torch.library (rpa/torch.py).

Each operator is checked against the Python API it wraps (same numbers, same
errors, nothing written on error), reshape_and_cache against the fused KV
write byte for byte, and the operators inside torch.jit.trace /
torch.jit.script graphs and on meta tensors."""

import os
import subprocess
import sys

import numpy as np
import pytest

import rpa
from rpa_testing import TOLERANCE, make_batch, max_abs_diff, numpy_ref, to_torch

torch = pytest.importorskip("torch")
import rpa.torch  # noqa: E402,F401  (registered already; explicit import is a no-op)

ops = torch.ops.rpa
SEQS = [(1, 9), (5, 12), (6, 6)]  # Decode, chunked prefill, prefill.


def _split(b, dtype=torch.float32):
  """Separate NHD K and V caches (contiguous torch copies) of a combined batch."""
  return (to_torch(b.kv_pages[:, :, 0::2], dtype), to_torch(b.kv_pages[:, :, 1::2], dtype))


def _metadata(b):
  return tuple(torch.from_numpy(x) for x in (b.kv_lens, b.page_indices, b.cu_q_lens,
                                             b.num_seqs))


def _slot_mapping(b, page_size):
  """vLLM's slot_mapping for the batch's new tokens: row cu_q_lens[i] + j is
  position kv_len - q_len + j of sequence i; padding rows are -1."""
  slots = np.full(b.q.shape[0], -1, np.int64)
  for i in range(int(b.num_seqs[0])):
    start, end = int(b.cu_q_lens[i]), int(b.cu_q_lens[i + 1])
    kv_len = int(b.kv_lens[i])
    for j in range(end - start):
      p = kv_len - (end - start) + j
      slots[start + j] = int(b.page_indices[i, p // page_size]) * page_size + p % page_size
  return torch.from_numpy(slots)


def test_import_rpa_registers_the_ops_before_or_after_torch():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
  for first, second in (("rpa", "torch"), ("torch", "rpa")):
    code = (f"import sys; import {first}; import {second}; import torch; "
            "print(torch.ops.rpa.ragged_paged_attention.default._schema.name, "
            "sorted(n for n in rpa.torch.OPS if hasattr(torch.ops.rpa, n)) == "
            "sorted(rpa.torch.OPS))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, check=True)
    assert result.stdout.split() == ["rpa::ragged_paged_attention", "True"], result.stderr
  # import rpa alone never loads torch.
  result = subprocess.run([sys.executable, "-c", "import sys, rpa; print('torch' in sys.modules)"],
                          capture_output=True, text=True, env=env, check=True)
  assert result.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ragged_op_is_the_python_api(rng, dtype):
  b = make_batch(rng, SEQS)
  q, kv = to_torch(b.q, dtype), to_torch(b.kv_pages, dtype)
  meta = _metadata(b)
  out = ops.ragged_paged_attention(q, kv, *meta, sm_scale=0.25, sliding_window=7)
  # The op's default thread count is torch's (rpa/torch.py); the flash-decoding
  # split, and so the last bits, depend on it.
  expected = rpa.ragged_paged_attention(q, kv, *meta, sm_scale=0.25, sliding_window=7,
                                        num_threads=torch.get_num_threads())
  assert out.dtype == dtype and out.shape == q.shape
  assert torch.equal(out, expected)
  ref = numpy_ref(b.q, b.kv_pages, *b.args[2:], sm_scale=0.25, sliding_window=7)
  tol = TOLERANCE["float32" if dtype == torch.float32 else "bfloat16"]
  if dtype == torch.bfloat16:
    ref = numpy_ref(q.float().numpy(), kv.float().numpy(), *b.args[2:], sm_scale=0.25,
                    sliding_window=7)
  assert max_abs_diff(out, ref) <= tol


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_op_separate_caches(rng, layout):
  b = make_batch(rng, SEQS)
  k, v = _split(b)
  if layout == "HND":
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
  q = to_torch(b.q)
  out = ops.ragged_paged_attention(q, k, *_metadata(b), v_pages=v, kv_layout=layout,
                                   sm_scale=0.5)
  ref = numpy_ref(b.q, b.kv_pages, *b.args[2:], sm_scale=0.5)
  assert max_abs_diff(out, ref) <= TOLERANCE["float32"]


def test_out_variant_writes_and_returns_out(rng):
  b = make_batch(rng, SEQS)
  q, kv, meta = to_torch(b.q), to_torch(b.kv_pages), _metadata(b)
  out = torch.full_like(q, 7.0)
  result = ops.ragged_paged_attention.out(q, kv, *meta, sm_scale=0.25, out=out)
  assert result.data_ptr() == out.data_ptr()
  assert torch.equal(out, ops.ragged_paged_attention(q, kv, *meta, sm_scale=0.25))
  schema = str(ops.ragged_paged_attention.out._schema)
  assert "Tensor(a!) out) -> Tensor(a!)" in schema
  # The overload packet picks .out for an out= call too.
  out2 = torch.empty_like(q)
  ops.ragged_paged_attention(q, kv, *meta, sm_scale=0.25, out=out2)
  assert torch.equal(out2, out)


@pytest.fixture
def torch_threads():
  """Restores torch's intra-op thread count after the test."""
  before = torch.get_num_threads()
  yield
  torch.set_num_threads(before)


def test_attention_ops_take_torchs_thread_count(rng, monkeypatch, torch_threads):
  """Without num_threads an op runs on torch.get_num_threads() threads, so
  torch.set_num_threads sizes both pools; num_threads= and RPA_NUM_THREADS
  still win."""
  import rpa._api as api
  seen = []
  real = api.ragged_paged_attention

  def spy(*args, **kwargs):
    seen.append(kwargs["num_threads"])
    return real(*args, **kwargs)

  monkeypatch.setattr(api, "ragged_paged_attention", spy)
  monkeypatch.delenv("RPA_NUM_THREADS", raising=False)
  b = make_batch(rng, SEQS)
  q, kv, meta = to_torch(b.q), to_torch(b.kv_pages), _metadata(b)
  for threads in (1, 3):
    torch.set_num_threads(threads)
    seen.clear()
    out = ops.ragged_paged_attention(q, kv, *meta, sm_scale=0.25)
    ops.ragged_paged_attention.out(q, kv, *meta, sm_scale=0.25, out=torch.empty_like(q))
    ops.ragged_paged_attention_with_lse(q, kv, *meta, sm_scale=0.25)
    assert seen == [threads] * 3
    assert torch.equal(out, real(q, kv, *meta, sm_scale=0.25, num_threads=threads))
  seen.clear()
  ops.ragged_paged_attention(q, kv, *meta, sm_scale=0.25, num_threads=2)
  monkeypatch.setenv("RPA_NUM_THREADS", "2")
  ops.ragged_paged_attention(q, kv, *meta, sm_scale=0.25)
  assert seen == [2, None]  # None: the library reads RPA_NUM_THREADS itself.


def test_lse_and_merge_states_ops(rng):
  """Attention over a sequence's keys split in two (a decode row that sees
  the first part, and the rest), merged, equals one call over all keys."""
  kv_len, split = 13, 6
  b = make_batch(rng, [(1, kv_len)], page_size=1, poison=False, pad_tokens=0)
  q, kv = to_torch(b.q), to_torch(b.kv_pages)
  kv_lens, page_indices, cu_q_lens, num_seqs = _metadata(b)
  whole = ops.ragged_paged_attention(q, kv, *_metadata(b))
  first = ops.ragged_paged_attention_with_lse(
      q, kv, torch.tensor([split, 0], dtype=torch.int32), page_indices, cu_q_lens, num_seqs)
  second = ops.ragged_paged_attention_with_lse(
      q, kv, torch.tensor([kv_len - split, 0], dtype=torch.int32),
      torch.roll(page_indices, -split, dims=1).contiguous(), cu_q_lens, num_seqs)
  out, lse = ops.merge_states(first[0], first[1], second[0], second[1])
  assert lse.dtype == torch.float32 and lse.shape == q.shape[:2]
  assert max_abs_diff(out, whole) <= 1e-5
  expected = rpa.merge_states(first[0], first[1], second[0], second[1])
  assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])


def test_op_errors_are_rpas_and_touch_nothing(rng):
  b = make_batch(rng, SEQS)
  q, kv, meta = to_torch(b.q), to_torch(b.kv_pages), _metadata(b)
  pages_per_seq = b.page_indices.shape[1]
  with pytest.raises(rpa.Error) as api:
    rpa.ragged_paged_attention(q, kv, *meta, num_kv_pages_per_block=64)
  out = torch.full_like(q, 3.0)
  with pytest.raises(rpa.Error) as op:
    ops.ragged_paged_attention.out(q, kv, *meta, num_kv_pages_per_block=64, out=out)
  assert str(op.value) == str(api.value)
  assert str(op.value).startswith(f"num_kv_pages_per_block=64 must be in range (0, "
                                  f"{pages_per_seq}].")
  assert op.value.kind == "block_size"
  assert torch.all(out == 3.0)
  with pytest.raises(ValueError, match=r"sliding_window=0 must be positive\."):
    ops.ragged_paged_attention(q, kv, *meta, sliding_window=0)
  bad = meta[0].clone()
  bad[1] = 2  # q_len 5 > kv_len 2.
  with pytest.raises(rpa.Error, match=r"q_len=5 must be less or equal to kv_len=2 at sequence 1"):
    ops.ragged_paged_attention(q, kv, bad, *meta[1:])
  with pytest.raises(rpa.Error, match=r"lse_b.shape=\(3, 4\) must be the same as "
                                      r"lse_a.shape=\(5, 4\)"):
    ops.merge_states(torch.zeros(5, 4, 8), torch.zeros(5, 4), torch.zeros(5, 4, 8),
                     torch.zeros(3, 4))


# ---- reshape_and_cache


def _write_case(rng, cache, page_size=4):
  """A batch whose new tokens go through reshape_and_cache, with NHD torch
  caches of the `cache` kind: (batch, key, value, k_cache, v_cache, kwargs)."""
  b = make_batch(rng, SEQS, num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=page_size)
  tokens = b.q.shape[0]
  key = torch.from_numpy(rng.standard_normal((tokens, 2, 16)).astype(np.float32))
  value = torch.from_numpy(rng.standard_normal((tokens, 2, 16)).astype(np.float32))
  k, v = _split(b)
  kw = {}
  if cache in ("float8_e4m3fn", "float8_e5m2", "int8"):
    k, v = rpa.quantize(k, cache, 0.5), rpa.quantize(v, cache, 2.0)
    kw = dict(kv_cache_dtype=cache, k_scale=0.5, v_scale=2.0)
  elif cache == "bfloat16":
    k, v, key, value = (x.to(torch.bfloat16) for x in (k, v, key, value))
  return b, key, value, k, v, kw


@pytest.mark.parametrize("cache", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                   "int8"])
def test_reshape_and_cache_is_the_fused_write(rng, cache):
  b, key, value, k, v, kw = _write_case(rng, cache)
  slots = _slot_mapping(b, 4)
  k2, v2 = k.clone(), v.clone()
  before = k.clone()
  ops.reshape_and_cache(key, value, k, v, slots, **kw)
  assert not torch.equal(k.view(torch.uint8), before.view(torch.uint8))
  q = to_torch(b.q, key.dtype)
  scales = dict(k_scale=kw.get("k_scale"), v_scale=kw.get("v_scale"))
  kv_dtype = None if cache in ("float32", "bfloat16", "int8") else cache
  fused = rpa.ragged_paged_attention_with_kv_write(
      q, key, value, (k2, v2), *_metadata(b), kv_dtype=kv_dtype, sm_scale=0.25, **scales)
  assert torch.equal(k.view(torch.uint8), k2.view(torch.uint8))  # Every byte.
  assert torch.equal(v.view(torch.uint8), v2.view(torch.uint8))
  out = ops.ragged_paged_attention(q, k, *_metadata(b), v_pages=v, kv_dtype=kv_dtype,
                                   sm_scale=0.25, **scales)
  assert torch.equal(out, fused)


def test_reshape_and_cache_skips_minus_one_and_rows_beyond_the_mapping(rng):
  b, key, value, k, v, _ = _write_case(rng, "float32")
  slots = torch.tensor([5, -1, 0], dtype=torch.int32)
  expected_k, expected_v = k.clone(), v.clone()
  expected_k[1, 1], expected_v[1, 1] = key[0], value[0]  # Slot 5: page 1, offset 1.
  expected_k[0, 0], expected_v[0, 0] = key[2], value[2]
  ops.reshape_and_cache(key, value, k, v, slots)
  assert torch.equal(k.view(torch.uint8), expected_k.view(torch.uint8))
  assert torch.equal(v.view(torch.uint8), expected_v.view(torch.uint8))


def test_reshape_and_cache_hnd_and_strided_views(rng):
  b, key, value, k, v, _ = _write_case(rng, "float32")
  slots = _slot_mapping(b, 4)
  # HND caches, written through a transposed view.
  k_hnd, v_hnd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
  ops.reshape_and_cache(key, value, k_hnd, v_hnd, slots, kv_layout="HND")
  # NHD K and V as strided views of one combined cache.
  combined = to_torch(b.kv_pages)
  ops.reshape_and_cache(key, value, combined[:, :, 0::2], combined[:, :, 1::2], slots)
  ops.reshape_and_cache(key, value, k, v, slots)
  assert torch.equal(k_hnd.transpose(1, 2).view(torch.uint8), k.view(torch.uint8))
  assert torch.equal(v_hnd.transpose(1, 2).view(torch.uint8), v.view(torch.uint8))
  assert torch.equal(combined[:, :, 0::2].view(torch.uint8), k.view(torch.uint8))


def _bad_calls(key, value, k, v, slots):
  n = k.shape[0] * k.shape[1]
  big = slots.clone()
  big[2] = n
  dup = slots.clone()
  dup[4] = dup[2]
  return [
      ((key, value[:, :1], k, v, slots), {}, "shape",
       r"value.shape=\(\d+, 1, 16\) must be the same as key.shape=\(\d+, 2, 16\)\."),
      ((key, value, k[..., :8], v[..., :8], slots), {}, "shape",
       r"holds num_kv_heads=2 and head_dim=8, but key.shape=.* has num_kv_heads=2 and "
       r"head_dim=16"),
      ((key, value, k, v[:-1], slots), {}, "shape", r"v_cache.shape=.* must be the same as "
       r"k_cache.shape="),
      ((key[0], value[0], k, v, slots), {}, "shape", r"key.shape=\(2, 16\) must be "
       r"\(num_tokens, num_kv_heads, head_dim\)"),
      ((key, value, k[0], v[0], slots), {}, "shape", r"k_cache.shape=.* must be \(num_pages, "
       r"page_size, num_kv_heads, head_dim\) for kv_layout='NHD'"),
      ((key, value, k, v, torch.cat([slots, slots])), {}, "shape",
       r"slot_mapping.shape=\(\d+,\) must be \(n,\) with n <= num_tokens="),
      ((key, value.double(), k, v, slots), {}, "dtype",
       r"key.dtype=torch.float32 and value.dtype=torch.float64 must be one of"),
      ((key, value, k, v.half(), slots), {}, "dtype",
       r"v_cache.dtype=torch.float16 must be the same as k_cache.dtype=torch.float32"),
      ((key, value, k, v, slots.float()), {}, "dtype",
       r"slot_mapping.dtype=torch.float32 is not supported"),
      ((key, value, k.to(torch.uint8), v.to(torch.uint8), slots), {}, "dtype",
       r"k_cache.dtype=torch.uint8 is not supported with kv_cache_dtype='auto'"),
      ((key, value, k, v, slots), dict(kv_cache_dtype="fp8"), "dtype",
       r"k_cache.dtype=torch.float32 cannot hold kv_cache_dtype='fp8' codes"),
      ((key, value, k, v, slots), dict(kv_cache_dtype="fp4"), "option",
       r"kv_cache_dtype='fp4' must be one of 'auto', 'fp8'"),
      ((key, value, k, v, slots), dict(k_scale=float("inf")), "option",
       r"k_scale=inf must be finite\."),
      ((key, value, k, v, slots), dict(kv_layout="NDH"), "option",
       r"kv_layout='NDH' must be 'NHD' or 'HND'"),
      ((key, value, k, v, big), {}, "page_index",
       rf"slot_mapping\[2\]={n} must be -1 or in range \[0, {n}\) \(num_pages \* page_size"),
      ((key, value, k, v, torch.where(slots < 0, -2, slots)), {}, "page_index",
       r"slot_mapping\[\d+\]=-2 must be -1 or in range"),
      ((key, value, k, v, dup), {}, "metadata",
       rf"slot_mapping\[4\]={int(slots[2])} is also slot_mapping\[2\]: each slot is written "
       r"once"),
  ]


def test_reshape_and_cache_errors_touch_nothing(rng):
  b, key, value, k, v, _ = _write_case(rng, "float32")
  slots = _slot_mapping(b, 4)
  assert int(slots[2]) >= 0 and int(slots[4]) >= 0
  for args, kw, kind, message in _bad_calls(key, value, k, v, slots):
    caches = [a for a in args[2:4]]
    before = [c.clone() for c in caches]
    with pytest.raises(rpa.Error, match=message) as e:
      ops.reshape_and_cache(*args, **kw)
    assert e.value.kind == kind, message
    assert isinstance(e.value, ValueError)
    for c, c0 in zip(caches, before):
      assert torch.equal(c.view(torch.uint8), c0.view(torch.uint8)), message


# ---- Graphs and meta tensors


def _step(q, key, value, k_cache, v_cache, slots, kv_lens, page_indices, cu_q_lens, num_seqs):
  """A serving step as an engine writes it with rpa's ops."""
  torch.ops.rpa.reshape_and_cache(key, value, k_cache, v_cache, slots)
  out, lse = torch.ops.rpa.ragged_paged_attention_with_lse(
      q, k_cache, kv_lens, page_indices, cu_q_lens, num_seqs, v_pages=v_cache, sm_scale=0.25)
  return out * 2.0, lse


def _step_args(rng):
  b, key, value, k, v, _ = _write_case(rng, "float32")
  return b, (to_torch(b.q), key, value, k, v, _slot_mapping(b, 4), *_metadata(b))


def test_ops_in_a_traced_function(rng):
  b, args = _step_args(rng)
  eager_args = tuple(a.clone() for a in args)
  expected = _step(*eager_args)
  traced = torch.jit.trace(_step, tuple(a.clone() for a in args), check_trace=False)
  graph = str(traced.graph)
  assert "rpa::reshape_and_cache" in graph and "rpa::ragged_paged_attention_with_lse" in graph
  out, lse = traced(*args)
  assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
  assert torch.equal(args[3].view(torch.uint8), eager_args[3].view(torch.uint8))  # In place.


def test_ops_in_a_scripted_function(rng):
  scripted = torch.jit.script(_step)
  assert "rpa::reshape_and_cache" in str(scripted.graph)
  b, args = _step_args(rng)
  eager_args = tuple(a.clone() for a in args)
  expected = _step(*eager_args)
  out, lse = scripted(*args)
  assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])

  @torch.jit.script
  def merged(out_a, lse_a, out_b, lse_b):
    return torch.ops.rpa.merge_states(out_a, lse_a, out_b, lse_b)

  m = merged(out, lse, out, lse)
  assert torch.allclose(m[0], out) and torch.allclose(m[1], lse + np.log(2.0))
  # A bad slot: the scripted call fails and writes nothing. (torch 1.13's
  # TorchScript interpreter reports a Python kernel's error as a RuntimeError
  # without its message; eager calls carry rpa's.)
  bad = list(args)
  bad[5] = args[5].clone()
  bad[5][0] = 10**6
  before = args[3].clone()
  with pytest.raises(Exception):
    scripted(*bad)
  assert torch.equal(args[3].view(torch.uint8), before.view(torch.uint8))


def test_meta_kernels_give_shapes():
  meta = torch.device("meta")
  q = torch.empty(10, 8, 64, device=meta)
  kv = torch.empty(16, 4, 4, 64, device=meta, dtype=torch.bfloat16)
  i32 = dict(dtype=torch.int32, device=meta)
  md = (torch.empty(3, **i32), torch.empty(3, 5, **i32), torch.empty(4, **i32),
        torch.empty(1, **i32))
  out = ops.ragged_paged_attention(q, kv, *md)
  assert out.device.type == "meta" and out.shape == q.shape and out.dtype == q.dtype
  out, lse = ops.ragged_paged_attention_with_lse(q, kv, *md)
  assert lse.shape == (10, 8) and lse.dtype == torch.float32
  o = torch.empty_like(q)
  assert ops.ragged_paged_attention.out(q, kv, *md, out=o) is not None
  m, l = ops.merge_states(q, lse, q, lse)
  assert m.shape == q.shape and l.shape == (10, 8)
  ops.reshape_and_cache(torch.empty(10, 2, 64, device=meta), torch.empty(10, 2, 64, device=meta),
                        kv, kv, torch.empty(10, dtype=torch.int64, device=meta))


def test_fake_tensors_and_make_fx(rng):
  fake = pytest.importorskip("torch._subclasses")
  with fake.FakeTensorMode():
    q = torch.empty(10, 8, 64)
    out = ops.ragged_paged_attention(q, torch.empty(16, 4, 4, 64), torch.empty(3, dtype=torch.int32),
                                     torch.empty(3, 5, dtype=torch.int32),
                                     torch.empty(4, dtype=torch.int32),
                                     torch.empty(1, dtype=torch.int32))
    assert out.shape == q.shape
  make_fx = pytest.importorskip("torch.fx.experimental.proxy_tensor").make_fx
  b, args = _step_args(rng)
  graph = make_fx(_step)(*args).graph
  targets = {str(n.target) for n in graph.nodes if n.op == "call_function"}
  assert {"rpa.reshape_and_cache.default", "rpa.ragged_paged_attention_with_lse.default"} <= targets
