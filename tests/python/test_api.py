"""rpa's Python API: JAX's signatures, and the numbers of the fast path against
the library's reference (and of the reference against an independent NumPy
port of JAX's)."""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import rpa
from rpa_testing import (DEFAULT_MASK_VALUE, TOLERANCE, make_batch, max_abs_diff, numpy_ref,
                         to_numpy, to_torch, tolerance)

_POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KW = inspect.Parameter.KEYWORD_ONLY
_EMPTY = inspect.Parameter.empty


def _params(fn):
  return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


_RAGGED_JAX = [("kv_pages", _POS, _EMPTY), ("kv_lens", _POS, _EMPTY),
               ("page_indices", _POS, _EMPTY), ("cu_q_lens", _POS, _EMPTY),
               ("num_seqs", _POS, _EMPTY)]


def test_signatures_are_jaxs():
  opts = [("sliding_window", _KW, None), ("soft_cap", _KW, None)]
  tuning = [("num_kv_pages_per_block", _KW, None), ("num_queries_per_block", _KW, None),
            ("vmem_limit_bytes", _KW, None)]
  scales = [("k_scale", _KW, None), ("v_scale", _KW, None)]
  assert _params(rpa.ragged_paged_attention)[:15] == (
      [("q", _POS, _EMPTY)] + _RAGGED_JAX + [("sm_scale", _KW, 1.0)] + opts +
      [("mask_value", _KW, None)] + scales + tuning)
  assert _params(rpa.ref_ragged_paged_attention)[:12] == (
      [("queries", _POS, _EMPTY)] + _RAGGED_JAX + [("sm_scale", _KW, 1.0)] + opts +
      [("mask_value", _KW, rpa.DEFAULT_MASK_VALUE)] + scales)
  for fn in (rpa.static_validate_inputs, rpa.dynamic_validate_inputs):
    assert _params(fn)[:15] == ([("q", _POS, _EMPTY)] + _RAGGED_JAX + [("sm_scale", _KW, None)] +
                                opts + [("mask_value", _KW, None)] + scales + tuning)
  assert _params(rpa.paged_attention)[:10] == [
      ("q", _POS, _EMPTY), ("k_pages", _POS, _EMPTY), ("v_pages", _POS, _EMPTY),
      ("lengths", _POS, _EMPTY), ("page_indices", _POS, _EMPTY),
      ("mask_value", _KW, rpa.DEFAULT_MASK_VALUE), ("attn_logits_soft_cap", _KW, None),
      ("pages_per_compute_block", _KW, _EMPTY), ("megacore_mode", _KW, None),
      ("inline_seq_dim", _KW, True)]
  # Everything beyond JAX's arguments is keyword-only.
  for fn in (rpa.ragged_paged_attention, rpa.ref_ragged_paged_attention, rpa.paged_attention,
             rpa.static_validate_inputs, rpa.dynamic_validate_inputs):
    assert all(p.kind == _KW for p in list(inspect.signature(fn).parameters.values())[6:])


def test_options_come_from_one_list(rng):
  """The ragged calls' keywords are rpa._api.RAGGED_OPTIONS: a misspelt one
  is Python's TypeError, the validators take no result options, arrays may
  be passed by name, and the binding refuses a keyword it does not read."""
  b = make_batch(rng, MIXED)
  names = [o.name for o in rpa._api.RAGGED_OPTIONS]
  assert [p[0] for p in _params(rpa.ragged_paged_attention)[6:]] == names
  with pytest.raises(TypeError, match=r"^ragged_paged_attention\(\) got an unexpected keyword "
                     r"argument 'sliding_windw'$"):
    rpa.ragged_paged_attention(*b.args, sliding_windw=3)
  with pytest.raises(TypeError, match=r"^static_validate_inputs\(\) got an unexpected keyword "
                     r"argument 'return_lse'$"):
    rpa.static_validate_inputs(*b.args, return_lse=True)
  by_name = dict(zip(("q", "kv_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs"),
                     b.args))
  np.testing.assert_array_equal(rpa.ragged_paged_attention(**by_name, sm_scale=0.5),
                                rpa.ragged_paged_attention(*b.args, sm_scale=0.5))
  with pytest.raises(TypeError, match=r"rpa\._rpa\.validate\(\) got an unexpected keyword "
                     r"argument 'soft_capp'"):
    rpa._rpa.validate(False, b.q, b.kv_pages, None, tuple(b.args[2:]), soft_capp=1.0)


def test_public_names_have_docstrings():
  assert rpa.DEFAULT_MASK_VALUE == DEFAULT_MASK_VALUE
  assert issubclass(rpa.Error, ValueError)
  for name in rpa.__all__:
    obj = getattr(rpa, name)
    if callable(obj):
      assert obj.__doc__ and len(obj.__doc__) > 80, name
      if name != "Error":
        assert "Args:" in obj.__doc__ and "Returns:" in obj.__doc__, name
  assert "{kv_pages}" not in rpa.ragged_paged_attention.__doc__


def _check(batch, tol=None, torch_dtype=None, **options):
  """Fast path vs the library's reference on `batch`; returns the output."""
  args = batch.args
  if torch_dtype is not None:
    q = to_torch(batch.q, torch_dtype)
    kv = to_torch(batch.kv_pages, torch_dtype if batch.kv_pages.dtype != np.int8 else None)
    args = (q, kv) + tuple(to_torch(a) for a in args[2:])
  out = rpa.ragged_paged_attention(*args, **options)
  ref = rpa.ref_ragged_paged_attention(*args, **options)
  assert type(out) is type(args[0]) and type(ref) is type(args[0])
  assert tuple(out.shape) == tuple(batch.q.shape) and out.dtype == args[0].dtype
  tol = tolerance(args[1].dtype) if tol is None else tol
  err = max_abs_diff(out, ref)
  assert err <= tol, f"max |out - ref| = {err} > {tol} with {options}"
  # Padding rows are zero, before cu_q_lens[0] and from cu_q_lens[num_seqs].
  o = to_numpy(out)
  n = int(batch.num_seqs[0])
  assert not np.any(o[:batch.cu_q_lens[0]]) and not np.any(o[batch.cu_q_lens[n]:])
  assert np.all(np.isfinite(o))
  return out


MIXED = [(1, 9), (5, 13), (7, 7), (1, 1), (3, 30)]  # decode, chunked, full prefill.


@pytest.mark.parametrize("q_dtype,kv_dtype", [(np.float32, np.float32),
                                              (np.float16, np.float16),
                                              (np.float32, np.float16),
                                              (np.float16, np.float32)])
@pytest.mark.parametrize("heads", [(1, 1), (4, 1), (8, 2), (6, 3)])
def test_numpy_dtypes_and_gqa(rng, q_dtype, kv_dtype, heads):
  b = make_batch(rng, MIXED, num_q_heads=heads[0], num_kv_heads=heads[1], q_dtype=q_dtype,
                 kv_dtype=kv_dtype)
  _check(b, tol=tolerance(kv_dtype, q_dtype=q_dtype), sm_scale=0.25)


@pytest.mark.parametrize("head_dim", [1, 3, 64, 80, 128, 130])
@pytest.mark.parametrize("page_size", [1, 3, 7, 16])
def test_head_dims_and_page_sizes(rng, head_dim, page_size):
  b = make_batch(rng, [(1, 17), (4, 4), (6, 20)], head_dim=head_dim, page_size=page_size)
  _check(b, sm_scale=head_dim**-0.5)


@pytest.mark.parametrize("options", [
    dict(sliding_window=1), dict(sliding_window=5), dict(sliding_window=1000),
    dict(soft_cap=2.0), dict(soft_cap=-3.0), dict(sm_scale=0.125, soft_cap=30.0,
                                                  sliding_window=4),
    dict(mask_value=-1.0, sliding_window=3),  # > -1e4: masked keys still take part.
    dict(mask_value=-1e30), dict(mask_value=float("-inf"), sliding_window=2),
    dict(k_scale=0.5, v_scale=2.0), dict(sm_scale=3.0),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_options(rng, options):
  b = make_batch(rng, MIXED, num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=4)
  _check(b, **options)


@pytest.mark.parametrize("blocks", [(1, 1), (1, 3), (2, 7), (3, 16), (None, 1), (1, None),
                                    (9, 64), (2, None)])
def test_block_sizes(rng, blocks):
  b = make_batch(rng, MIXED, page_size=4, extra_columns=1)
  pages_per_seq = b.page_indices.shape[1]
  kv_block = None if blocks[0] is None else min(blocks[0], pages_per_seq)
  _check(b, num_kv_pages_per_block=kv_block, num_queries_per_block=blocks[1], sliding_window=6)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads(rng, threads):
  b = make_batch(rng, MIXED + [(2, 40)] * 5)
  _check(b, num_threads=threads)


def test_int8_kv_with_scales(rng):
  b = make_batch(rng, MIXED, kv_dtype=np.int8, head_dim=32)
  _check(b, k_scale=0.02, v_scale=0.05, sm_scale=0.2)


@pytest.mark.parametrize("seqs,first_row,max_num_seqs", [
    ([], 0, 1),                 # num_seqs = 0: all zeros.
    ([], 0, 4),
    ([(0, 0)], 0, 2),           # q_len 0, kv_len 0.
    ([(0, 5), (2, 2)], 0, 3),   # q_len 0 with history.
    ([(0, 0), (1, 1), (0, 0)], 0, 3),
    ([(3, 8)], 4, 2),           # padding rows before cu_q_lens[0].
    ([(1, 1)], 0, 1),
])
def test_degenerate_batches(rng, seqs, first_row, max_num_seqs):
  b = make_batch(rng, seqs, first_row=first_row, max_num_seqs=max_num_seqs)
  out = _check(b)
  if not seqs:
    assert not np.any(out)


def test_empty_q(rng):
  b = make_batch(rng, [], pad_tokens=0, max_num_seqs=2)
  assert b.q.shape[0] == 0
  out = rpa.ragged_paged_attention(*b.args)
  assert out.shape == b.q.shape


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_split_caches_match_combined(rng, layout):
  b = make_batch(rng, MIXED, num_q_heads=6, num_kv_heads=3, page_size=5)
  combined = rpa.ragged_paged_attention(*b.args, sliding_window=7)
  k, v = b.split(layout)
  for kv in ((k, v), [k, v]):
    split = rpa.ragged_paged_attention(b.q, kv, *b.args[2:], kv_layout=layout,
                                       sliding_window=7)
    np.testing.assert_array_equal(split, combined)
    ref = rpa.ref_ragged_paged_attention(b.q, kv, *b.args[2:], kv_layout=layout,
                                         sliding_window=7)
    assert max_abs_diff(ref, split) <= TOLERANCE["float32"]
  if layout == "NHD":  # The default for a pair.
    np.testing.assert_array_equal(
        rpa.ragged_paged_attention(b.q, (k, v), *b.args[2:], sliding_window=7), combined)


@pytest.mark.parametrize("case", range(6))
def test_library_reference_matches_numpy_port_of_jax(rng, case):
  options = [dict(), dict(sm_scale=0.3), dict(sliding_window=3, soft_cap=5.0),
             dict(mask_value=-2.0, sliding_window=2), dict(k_scale=0.7, v_scale=1.3),
             dict(sm_scale=0.5, sliding_window=1)][case]
  heads = [(2, 2), (4, 1), (8, 2), (6, 3), (4, 2), (3, 1)][case]
  page_size = [1, 3, 4, 7, 16, 2][case]
  b = make_batch(rng, MIXED + [(0, 3)], num_q_heads=heads[0], num_kv_heads=heads[1],
                 head_dim=[8, 5, 16, 32, 1, 64][case], page_size=page_size, first_row=case % 2)
  ref = rpa.ref_ragged_paged_attention(*b.args, **options)
  expected = numpy_ref(*b.args, **options)
  assert max_abs_diff(ref, expected) <= 2e-6
  f16 = make_batch(rng, MIXED, q_dtype=np.float16)
  assert max_abs_diff(rpa.ref_ragged_paged_attention(*f16.args, **options),
                      numpy_ref(*f16.args, **options)) <= 2e-3


def test_return_lse_and_sinks(rng):
  b = make_batch(rng, MIXED, num_q_heads=4, num_kv_heads=2)
  out, lse = rpa.ragged_paged_attention(*b.args, return_lse=True)
  ref_out, ref_lse = rpa.ref_ragged_paged_attention(*b.args, return_lse=True)
  assert lse.shape == b.q.shape[:2] and lse.dtype == np.float32
  np.testing.assert_allclose(lse, ref_lse, atol=1e-5)
  assert max_abs_diff(out, ref_out) <= TOLERANCE["float32"]
  n = int(b.num_seqs[0])
  assert np.all(np.isneginf(lse[b.cu_q_lens[n]:]))
  # lse of the decode row 0 directly: log sum exp over its 9 keys.
  q0 = b.q[0].astype(np.float64)
  keys = b.kv_pages[b.page_indices[0]].reshape(-1, 4, 16)[:9, 0::2].astype(np.float64)
  logits = np.einsum("hd,khd->hk", q0, np.repeat(keys, 2, axis=1))
  np.testing.assert_allclose(lse[0], np.log(np.exp(logits).sum(-1)), rtol=1e-5)

  sinks = rng.standard_normal(4).astype(np.float32)
  with_sinks = rpa.ragged_paged_attention(*b.args, sinks=sinks)
  assert (max_abs_diff(with_sinks, rpa.ref_ragged_paged_attention(*b.args, sinks=sinks))
          <= TOLERANCE["float32"])
  # A sink only adds to the denominator: output shrinks by sum / (sum + e^sink).
  scale = np.exp(lse) / (np.exp(lse) + np.exp(sinks)[None, :])
  live = slice(int(b.cu_q_lens[0]), int(b.cu_q_lens[n]))
  np.testing.assert_allclose(with_sinks[live], (out * scale[..., None])[live], atol=1e-5)


def _paged_inputs(rng, batch=5, num_q_heads=8, num_kv_heads=2, head_dim=32, page_size=4,
                  pages_per_sequence=6, total_num_pages=40, lengths=None):
  q = rng.standard_normal((batch, num_q_heads, head_dim)).astype(np.float32)
  k = rng.standard_normal((num_kv_heads, total_num_pages, page_size, head_dim)).astype(np.float32)
  v = rng.standard_normal(k.shape).astype(np.float32)
  if lengths is None:
    lengths = rng.integers(1, pages_per_sequence * page_size + 1, size=batch)
  lengths = np.asarray(lengths, np.int32)
  page_indices = rng.integers(0, total_num_pages, size=(batch, pages_per_sequence))
  return q, k, v, lengths, page_indices.astype(np.int32)


@pytest.mark.parametrize("block", [1, 2, 3, 6])
def test_paged_attention_matches_ragged(rng, block):
  q, k, v, lengths, page_indices = _paged_inputs(rng, lengths=[1, 7, 24, 0, 13])
  out = rpa.paged_attention(q, k, v, lengths, page_indices, pages_per_compute_block=block,
                            attn_logits_soft_cap=20.0)
  assert out.shape == q.shape and out.dtype == q.dtype
  # The same decode step as a ragged call over a combined cache.
  combined = np.stack([k, v], axis=3).transpose(1, 2, 0, 3, 4).reshape(40, 4, 4, 32)
  ref = numpy_ref(q, combined, lengths, page_indices, np.arange(6, dtype=np.int32),
                  np.array([5]), soft_cap=20.0)
  ref[3] = 0.0  # length 0: a padded batch entry, output row 0.
  assert max_abs_diff(out, ref) <= TOLERANCE["float32"]
  assert not np.any(out[3])


def test_paged_attention_megacore_and_torch(rng):
  torch = pytest.importorskip("torch")
  q, k, v, lengths, page_indices = _paged_inputs(rng, batch=4, num_kv_heads=2)
  expected = rpa.paged_attention(q, k, v, lengths, page_indices, pages_per_compute_block=2)
  for mode in ("kv_head", "batch", None):
    out = rpa.paged_attention(q, k, v, lengths, page_indices, pages_per_compute_block=2,
                              megacore_mode=mode, inline_seq_dim=False)
    np.testing.assert_array_equal(out, expected)
  t = rpa.paged_attention(*(torch.from_numpy(x) for x in (q, k, v, lengths, page_indices)),
                          pages_per_compute_block=2)
  assert isinstance(t, torch.Tensor)
  np.testing.assert_allclose(t.numpy(), expected, atol=1e-6)


def test_python_lists_and_scalars_as_metadata(rng):
  b = make_batch(rng, [(2, 5)], max_num_seqs=1)
  # Python ints become int64 arrays: JAX's int32 message, as for np.int64.
  with pytest.raises(ValueError, match="must be int32"):
    rpa.ragged_paged_attention(b.q, b.kv_pages, [5], b.page_indices.tolist(), [0, 2], [1])
  out = rpa.ragged_paged_attention(b.q, b.kv_pages, np.array([5], np.int32),
                                   b.page_indices, b.cu_q_lens, np.int32([1]))
  assert max_abs_diff(out, numpy_ref(*b.args)) <= TOLERANCE["float32"]


def test_out_argument(rng):
  b = make_batch(rng, MIXED)
  out = np.full_like(b.q, 5.0)
  result = rpa.ragged_paged_attention(*b.args, out=out)
  assert result is out
  expected = rpa.ragged_paged_attention(*b.args)
  close = dict(rtol=0, atol=1e-6)
  np.testing.assert_allclose(out, expected, **close)
  # out may alias q: rpa computes into scratch and copies.
  q = b.q.copy()
  aliased = rpa.ragged_paged_attention(q, *b.args[1:], out=q)
  assert aliased is q
  np.testing.assert_allclose(q, expected, **close)
  # A strided out (every other head of a wider array) is written in place.
  wide = np.zeros((b.q.shape[0], 2 * b.q.shape[1], b.q.shape[2]), b.q.dtype)
  rpa.ragged_paged_attention(*b.args, out=wide[:, ::2])
  np.testing.assert_allclose(wide[:, ::2], expected, **close)
  assert not np.any(wide[:, 1::2])
  # A transposed out is computed into scratch and copied back.
  t = np.zeros((b.q.shape[2], b.q.shape[1], b.q.shape[0]), b.q.dtype).transpose(2, 1, 0)
  rpa.ragged_paged_attention(*b.args, out=t)
  np.testing.assert_allclose(t, expected, **close)


def test_module_entry_point():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
  run = subprocess.run([sys.executable, "-m", "rpa"], capture_output=True, text=True, env=env,
                       timeout=120)
  assert run.returncode == 0, run.stdout + run.stderr
  assert "rpa " + rpa.__version__ in run.stdout and ": ok" in run.stdout
  assert "must be in range (0, 4]" in run.stdout
  version = subprocess.run([sys.executable, "-m", "rpa", "--version"], capture_output=True,
                           text=True, env=env, timeout=60)
  assert version.stdout.strip() == rpa.__version__
