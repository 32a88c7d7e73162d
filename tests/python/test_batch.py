"""rpa.BatchAttention (plan once per step, run per layer), FlashInfer's CSR
page table, vLLM's metadata and merge_states' lse_base: each equals the
one-call API bit for bit, and every message arrives verbatim (the C++ suite,
tests/plan_test.cc, checks every CSR and run message)."""

import math
import threading

import numpy as np
import pytest

import rpa
from rpa_testing import cdiv, make_batch, to_numpy, to_torch

HEADS = dict(num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4)
SEQS = [(1, 9), (5, 5), (0, 0), (3, 17), (1, 1)]


def _shape(b, **extra):
  # sm_scale 1.0 unless given: the one-call API's default (the plan's is
  # FlashInfer's 1 / sqrt(head_dim), tests/python/test_masks.py).
  return dict(HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype,
              num_tokens=b.q.shape[0], **{"sm_scale": 1.0, **extra})


def _csr(b):
  """(qo_indptr, kv_indptr, kv_indices, kv_last_page_len) of the batch."""
  n = int(b.num_seqs[0])
  page_size = HEADS["page_size"]
  pages = [cdiv(int(b.kv_lens[i]), page_size) for i in range(n)]
  kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
  kv_indices = np.concatenate(
      [b.page_indices[i, :p] for i, p in enumerate(pages)] + [np.zeros(0, np.int32)])
  last = np.array([int(b.kv_lens[i]) - (p - 1) * page_size if p else 0
                   for i, p in enumerate(pages)], np.int32)
  return b.cu_q_lens[:n + 1].copy(), kv_indptr, kv_indices.astype(np.int32), last


def _caches(b, layout):
  if layout == "combined":
    return b.kv_pages
  if layout == "NHD5":  # FlashInfer's one array [pages, 2, page_size, heads, dim].
    k, v = b.split("NHD")
    return np.stack([k, v], axis=1)
  return b.split(layout)


def _one_call(b, layout, **options):
  kv = b.kv_pages if layout == "combined" else b.split(layout[:3])
  kw = {} if layout == "combined" else {"kv_layout": layout[:3]}
  return rpa.ragged_paged_attention(*(b.q, kv) + b.args[2:], **kw, **options)


@pytest.mark.parametrize("layout", ["combined", "NHD", "HND", "NHD5"])
def test_plan_run_equals_one_call_bit_for_bit(rng, layout):
  b = make_batch(rng, SEQS, **HEADS)
  sinks = rng.standard_normal(4).astype(np.float32)
  w = rpa.BatchAttention(kv_layout=layout[:3] if layout != "combined" else "combined",
                         num_threads=3)
  w.plan(*b.args[2:], **_shape(b, sm_scale=0.3, sliding_window=6))
  want, want_lse = _one_call(b, layout, sm_scale=0.3, sliding_window=6, sinks=sinks,
                             return_lse=True, num_threads=3)
  for _ in range(3):  # One plan, many layers.
    out, lse = w.run(b.q, _caches(b, layout), sinks=sinks, return_lse=True)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
  # A layer's scales, as the one call's.
  out = w.run(b.q, _caches(b, layout), k_scale=0.5, v_scale=2.0)
  assert np.array_equal(out, _one_call(b, layout, sm_scale=0.3, sliding_window=6, k_scale=0.5,
                                       v_scale=2.0, num_threads=3))
  info = w.info
  assert info["planned"] and info["num_seqs"] == len(SEQS) and info["num_threads"] == 3
  assert info["kv_layout"] == (None if layout == "combined" else layout[:3])


def test_window_left_is_sliding_window_minus_one(rng):
  b = make_batch(rng, SEQS, **HEADS)
  w = rpa.BatchAttention()
  w.plan(*b.args[2:], **_shape(b, window_left=4))
  assert np.array_equal(w.run(b.q, b.kv_pages), _one_call(b, "combined", sliding_window=5))
  w.plan(*b.args[2:], **_shape(b, window_left=-1))
  assert np.array_equal(w.run(b.q, b.kv_pages), _one_call(b, "combined"))
  with pytest.raises(rpa.Error) as e:
    w.plan(*b.args[2:], **_shape(b, window_left=4, sliding_window=5))
  assert str(e.value) == ("sliding_window=5 and window_left=4 are the same option. Pass one: "
                          "sliding_window = window_left + 1.")
  with pytest.raises(rpa.Error) as e:
    w.plan(*b.args[2:], **_shape(b, window_left=-2))
  assert str(e.value).startswith("window_left=-2 must be -1 (no window) or >= 0.")


def test_replan_for_the_next_step_and_num_tokens_from_the_table(rng):
  w = rpa.BatchAttention(kv_layout="NHD")
  for step in range(3):
    b = make_batch(rng, [(1, 3 + step), (step + 1, 2 * step + 4)], pad_tokens=0, **HEADS)
    w.plan(*b.args[2:], **dict(_shape(b), num_tokens=None))
    assert w.info["num_tokens"] == b.q.shape[0]
    assert np.array_equal(w.run(b.q, b.split("NHD")), _one_call(b, "NHD"))


def test_plan_keeps_its_own_copy_of_the_page_table(rng):
  b = make_batch(rng, SEQS, **HEADS)
  want = _one_call(b, "combined")
  tables = [a.copy() for a in b.args[2:]]
  w = rpa.BatchAttention()
  w.plan(*tables, **_shape(b))
  for a in tables:
    a[...] = 2**31 - 1  # Would read far outside the cache.
  del tables
  assert np.array_equal(w.run(b.q, b.kv_pages), want)


def test_csr_equals_the_jax_form(rng):
  b = make_batch(rng, SEQS, extra_columns=0, **HEADS)
  jax, flashinfer = rpa.BatchAttention(), rpa.BatchAttention()
  jax.plan(*b.args[2:], **_shape(b, sm_scale=0.25))
  flashinfer.plan_csr(*_csr(b), **_shape(b, sm_scale=0.25))
  assert np.array_equal(flashinfer.run(b.q, b.kv_pages), jax.run(b.q, b.kv_pages))
  # FlashInfer's q: exactly qo_indptr[-1] rows.
  rows = int(b.cu_q_lens[int(b.num_seqs[0])])
  exact = rpa.BatchAttention()
  exact.plan_csr(*_csr(b), **dict(_shape(b, sm_scale=0.25), num_tokens=None))
  assert np.array_equal(exact.run(b.q[:rows], b.kv_pages), jax.run(b.q, b.kv_pages)[:rows])


def test_csr_errors_keep_the_plan(rng):
  b = make_batch(rng, SEQS, **HEADS)
  w = rpa.BatchAttention()
  w.plan_csr(*_csr(b), **_shape(b))
  want = w.run(b.q, b.kv_pages)
  qo, kv_indptr, kv_indices, last = _csr(b)
  bad_last = last.copy()
  bad_last[0] = 0
  cases = [
      ((qo, kv_indptr, kv_indices, bad_last), "metadata",
       "kv_last_page_len[0]=0 must be in range [1, page_size=4] because sequence 0 has 3 pages "
       "(kv_indptr[0]=0, kv_indptr[1]=3)."),
      ((qo, kv_indptr, kv_indices.astype(np.int64), last), "dtype",
       "The dtype of `qo_indptr`, `kv_indptr`, `kv_indices` and `kv_last_page_len` must be "
       "int32."),
      ((qo, kv_indptr, np.full_like(kv_indices, 10**6), last), "page_index",
       "kv_indices[0]=1000000 must be in range [0, num_pages="),
  ]
  for tables, kind, text in cases:
    with pytest.raises(rpa.Error) as e:
      w.plan_csr(*tables, **_shape(b))
    assert e.value.kind == kind and str(e.value).startswith(text), str(e.value)
    assert np.array_equal(w.run(b.q, b.kv_pages), want)


def test_vllm_page_table_is_jax_form_without_copies(rng):
  b = make_batch(rng, SEQS, max_num_seqs=len(SEQS), **HEADS)
  n = len(SEQS)
  block_table = np.full((n + 4, b.page_indices.shape[1]), -1, np.int32)  # Persistent buffer.
  block_table[:n] = b.page_indices
  query_start_loc = np.zeros(n + 5, np.int32)
  query_start_loc[:n + 1] = b.cu_q_lens
  table = rpa.vllm_page_table(query_start_loc, b.kv_lens, block_table)
  assert np.shares_memory(table[1], block_table) and np.shares_memory(table[2], query_start_loc)
  assert table[3].tolist() == [n]
  want = _one_call(b, "combined")
  assert np.array_equal(rpa.ragged_paged_attention(b.q, b.kv_pages, *table), want)
  w = rpa.BatchAttention()
  w.plan(*table, **_shape(b))
  assert np.array_equal(w.run(b.q, b.kv_pages), want)


def test_run_errors_write_nothing(rng):
  b = make_batch(rng, SEQS, **HEADS)
  with pytest.raises(rpa.Error) as e:
    rpa.BatchAttention().run(b.q, b.kv_pages)
  assert str(e.value).startswith("This AttentionPlan has no plan yet.")
  w = rpa.BatchAttention()
  w.plan(*b.args[2:], **_shape(b))
  out = np.full_like(b.q, 7.0)
  cases = [
      (lambda: w.run(b.q[:-1], b.kv_pages, out=out[:-1]), "shape",
       f"q.shape={tuple(b.q[:-1].shape)} must be {tuple(b.q.shape)} as planned"),
      (lambda: w.run(b.q.astype(np.float16), b.kv_pages, out=out.astype(np.float16)), "dtype",
       "q.dtype=dtype('float16') must be the planned q_dtype=dtype('float32')."),
      (lambda: w.run(b.q, b.split("NHD"), out=out), "layout",
       "kv_pages is a (k_pages, v_pages) pair, but this BatchAttention has "
       "kv_layout='combined'"),
      (lambda: w.run(b.q, b.kv_pages, out=out, sinks=np.zeros(3, np.float32)), "shape",
       "sinks.shape=(3,) must be (num_q_heads=4,)."),
  ]
  for call, kind, text in cases:
    with pytest.raises(rpa.Error) as e:
      call()
    assert e.value.kind == kind and str(e.value).startswith(text), str(e.value)
    assert (out == 7.0).all()
  split = rpa.BatchAttention(kv_layout="HND")
  with pytest.raises(rpa.Error) as e:
    split.run(b.q, b.kv_pages)
  assert e.value.kind == "shape" and "does not hold separate K and V caches" in str(e.value)
  with pytest.raises(rpa.Error) as e:
    rpa.BatchAttention(kv_layout="XYZ")
  assert e.value.kind == "option"


def test_torch_and_quantized_codes(rng):
  torch = pytest.importorskip("torch")
  b = make_batch(rng, SEQS, **HEADS)
  q = to_torch(b.q, torch.bfloat16)
  kv = to_torch(b.kv_pages, torch.bfloat16)
  w = rpa.BatchAttention()
  w.plan(*(to_torch(a) for a in b.args[2:]), **dict(_shape(b), q_dtype=torch.bfloat16))
  out = torch.empty_like(q)
  assert w.run(q, kv, out=out) is out
  want = rpa.ragged_paged_attention(q, kv, *(to_torch(a) for a in b.args[2:]))
  assert torch.equal(out, want)
  # A uint8 cache of codes is read as the planned kv_dtype.
  codes = rpa.quantize(np.nan_to_num(b.kv_pages), "float8_e4m3fn", 0.5)
  w8 = rpa.BatchAttention()
  w8.plan(*b.args[2:], **_shape(b, kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=0.5))
  want8 = rpa.ragged_paged_attention(*(b.q, codes) + b.args[2:], kv_dtype="float8_e4m3fn",
                                     k_scale=0.5, v_scale=0.5)
  assert np.array_equal(w8.run(b.q, codes), want8)


def test_runs_from_many_threads(rng):
  b = make_batch(rng, SEQS, **HEADS)
  w = rpa.BatchAttention(num_threads=2)
  w.plan(*b.args[2:], **_shape(b))
  want = w.run(b.q, b.kv_pages)
  bad = []

  def caller():
    for _ in range(10):
      if not np.array_equal(w.run(b.q, b.kv_pages), want):
        bad.append(1)

  threads = [threading.Thread(target=caller) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not bad


def test_merge_states_base_2_like_flashinfer(rng):
  b = make_batch(rng, [(1, 12)], pad_tokens=0, **HEADS)
  whole, whole_lse = rpa.ragged_paged_attention(*b.args, return_lse=True)
  parts = []
  page_size = HEADS["page_size"]
  for lo, hi in ((0, 8), (8, 12)):  # Each part as its own sequence, on page boundaries.
    pages = b.page_indices[0, lo // page_size:cdiv(hi, page_size)]
    parts.append(rpa.ragged_paged_attention(
        b.q, b.kv_pages, np.array([hi - lo, 0], np.int32), pages[None, :].repeat(2, 0),
        np.array([0, 1, 1], np.int32), np.array([1], np.int32), return_lse=True))
  (out_a, lse_a), (out_b, lse_b) = parts
  out, lse = rpa.merge_states(out_a, lse_a, out_b, lse_b)
  np.testing.assert_allclose(out, whole, atol=1e-5)
  np.testing.assert_allclose(lse, whole_lse, atol=1e-5)
  log2e = math.log2(math.e)
  out2, lse2 = rpa.merge_states(out_a, lse_a * log2e, out_b, lse_b * log2e, lse_base=2)
  np.testing.assert_allclose(out2, whole, atol=1e-5)
  np.testing.assert_allclose(lse2, whole_lse * log2e, atol=1e-5)
  with pytest.raises(rpa.Error) as e:
    rpa.merge_states(out_a, lse_a, out_b, lse_b, lse_base=10)
  assert str(e.value) == ("lse_base=10 must be math.e or 2. rpa's LSEs (return_lse=True) are "
                          "natural logs (math.e, the default); FlashInfer's are base 2.")
  torch = pytest.importorskip("torch")  # Registers torch.ops.rpa (rpa's import hook).
  t = [to_torch(x) for x in (out_a, lse_a * log2e, out_b, lse_b * log2e)]
  tout, tlse = torch.ops.rpa.merge_states(*t, lse_base=2.0)
  np.testing.assert_allclose(to_numpy(tout), whole, atol=1e-5)
