"""Attention beyond causal (docs/contract.md §1.6) through Python and torch:
causal=False against the NumPy reference in every layout, BatchAttention's
plan and plan_csr equal to the one call bit for bit, the torch operator equal
to the Python call, and every new message."""

import numpy as np
import pytest

import rpa
from rpa_testing import make_batch, max_abs_diff, numpy_ref, to_torch, tolerance

HEADS = dict(num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4)
# q_len above, at and below kv_len; a query row without keys; an empty sequence.
SEQS = [(1, 9), (7, 3), (5, 5), (2, 0), (0, 0), (3, 17), (12, 6)]
SCALE = 16 ** -0.5


def _layout_args(b, layout):
  if layout == "combined":
    return b.kv_pages, {}
  return b.split(layout), {"kv_layout": layout}


def _csr(b):
  n = int(b.num_seqs[0])
  page_size = HEADS["page_size"]
  pages = [-(-int(b.kv_lens[i]) // page_size) for i in range(n)]
  kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
  kv_indices = np.concatenate(
      [b.page_indices[i, :p] for i, p in enumerate(pages)] + [np.zeros(0, np.int32)])
  last = np.array([int(b.kv_lens[i]) - (p - 1) * page_size if p else 0
                   for i, p in enumerate(pages)], np.int32)
  return b.cu_q_lens[:n + 1].copy(), kv_indptr, kv_indices.astype(np.int32), last


@pytest.mark.parametrize("layout", ["combined", "NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_non_causal_matches_numpy_reference(rng, layout, dtype):
  b = make_batch(rng, SEQS, q_dtype=dtype, **HEADS)
  want = numpy_ref(*b.args, sm_scale=SCALE, causal=False)
  kv, kw = _layout_args(b, layout)
  args = (b.q, kv) + b.args[2:]
  got = rpa.ragged_paged_attention(*args, sm_scale=SCALE, causal=False, **kw)
  ref = rpa.ref_ragged_paged_attention(*args, sm_scale=SCALE, causal=False, **kw)
  assert max_abs_diff(got, want) <= tolerance(dtype, q_dtype=dtype)
  assert max_abs_diff(ref, want) <= tolerance(dtype, q_dtype=dtype)


def test_causal_default_is_true(rng):
  b = make_batch(rng, [(3, 9), (1, 4)], **HEADS)
  default = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE)
  assert np.array_equal(default, rpa.ragged_paged_attention(*b.args, sm_scale=SCALE,
                                                            causal=True))
  assert not np.array_equal(default, rpa.ragged_paged_attention(*b.args, sm_scale=SCALE,
                                                                causal=False))


@pytest.mark.parametrize("form", ["jax", "csr"])
def test_batch_attention_non_causal_equals_one_call(rng, form):
  b = make_batch(rng, SEQS, **HEADS)
  want = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, causal=False, num_threads=2)
  w = rpa.BatchAttention(num_threads=2)
  shape = dict(HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype, sm_scale=SCALE,
               causal=False)
  if form == "jax":
    w.plan(*b.args[2:], num_tokens=b.q.shape[0], **shape)
    assert np.array_equal(w.run(b.q, b.kv_pages), want)
  else:
    w.plan_csr(*_csr(b), **shape)
    live = int(b.cu_q_lens[b.num_seqs[0]])
    assert np.array_equal(w.run(b.q[:live], b.kv_pages), want[:live])


def test_torch_op_non_causal(rng):
  torch = pytest.importorskip("torch")
  import rpa.torch  # noqa: F401

  b = make_batch(rng, SEQS, **HEADS)
  want = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, causal=False)
  got = torch.ops.rpa.ragged_paged_attention(*(to_torch(a) for a in b.args), sm_scale=SCALE,
                                             causal=False)
  assert np.array_equal(got.numpy(), want)


def test_messages(rng):
  b = make_batch(rng, [(7, 3)], **HEADS)
  out = np.full_like(b.q, 7.0)
  with pytest.raises(rpa.Error, match=r"^sliding_window=4 must be None when causal=False\. "):
    rpa.ragged_paged_attention(*b.args, causal=False, sliding_window=4, out=out)
  with pytest.raises(rpa.Error, match=r"^q_len=7 must be less or equal to kv_len=3 at sequence 0"):
    rpa.ragged_paged_attention(*b.args, out=out)
  assert np.all(out == 7.0)
  with pytest.raises(TypeError, match=r"^causal must be True, False or None\. Got 1 "):
    rpa.ragged_paged_attention(*b.args, causal=1)
  w = rpa.BatchAttention()
  with pytest.raises(rpa.Error, match=r"^sliding_window=4 must be None when causal=False\. "):
    w.plan(*b.args[2:], **HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype,
           causal=False, sliding_window=4)


# ---- FlashInfer's conventions in BatchAttention.


def _plan(w, b, **options):
  w.plan(*b.args[2:], **HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype,
         num_tokens=b.q.shape[0], **options)


def test_sm_scale_defaults_to_flashinfers(rng):
  b = make_batch(rng, [(3, 9), (1, 4)], **HEADS)
  w = rpa.BatchAttention()
  _plan(w, b)
  assert np.array_equal(w.run(b.q, b.kv_pages),
                        rpa.ragged_paged_attention(*b.args, sm_scale=16 ** -0.5))
  _plan(w, b, sm_scale=1.0)
  assert np.array_equal(w.run(b.q, b.kv_pages), rpa.ragged_paged_attention(*b.args))


def test_logits_soft_cap_is_soft_cap(rng):
  b = make_batch(rng, [(3, 9), (1, 4)], **HEADS)
  w = rpa.BatchAttention()
  _plan(w, b, logits_soft_cap=2.0)
  assert np.array_equal(w.run(b.q, b.kv_pages),
                        rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, soft_cap=2.0))
  _plan(w, b, logits_soft_cap=0.0)  # FlashInfer's "no cap".
  assert np.array_equal(w.run(b.q, b.kv_pages),
                        rpa.ragged_paged_attention(*b.args, sm_scale=SCALE))
  with pytest.raises(rpa.Error, match=r"^soft_cap=2\.0 and logits_soft_cap=3\.0 are the same "
                     r"option\. ") as e:
    _plan(w, b, soft_cap=2.0, logits_soft_cap=3.0)
  assert e.value.kind == "option"


def test_run_writes_lse_into_the_callers_buffer(rng):
  b = make_batch(rng, [(3, 9), (1, 4)], **HEADS)
  _, want = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, return_lse=True)
  w = rpa.BatchAttention()
  _plan(w, b)
  lse = np.full(b.q.shape[:2], 5.0, np.float32)
  out = w.run(b.q, b.kv_pages, lse=lse)
  assert isinstance(out, np.ndarray) and np.array_equal(lse, want)
  lse2 = np.zeros_like(lse)
  out2, got = w.run(b.q, b.kv_pages, lse=lse2, return_lse=True)
  assert got is lse2 and np.array_equal(lse2, want) and np.array_equal(out, out2)
  bad = np.full((b.q.shape[0], 3), 5.0, np.float32)
  out3 = np.full_like(b.q, 7.0)
  with pytest.raises(rpa.Error, match=r"^lse\.shape=\(\d+, 3\) must be "):
    w.run(b.q, b.kv_pages, lse=bad, out=out3)
  assert np.all(bad == 5.0) and np.all(out3 == 7.0)


# ---- ALiBi.


def _slopes(n):
  return np.exp2(-8.0 * np.arange(1, n + 1) / n).astype(np.float32)


@pytest.mark.parametrize("layout", ["combined", "NHD", "HND"])
@pytest.mark.parametrize("options", [dict(), dict(sliding_window=5), dict(soft_cap=2.0),
                                     dict(causal=False)])
def test_alibi_matches_numpy_reference(rng, layout, options):
  seqs = SEQS if options.get("causal") is False else [(1, 9), (5, 5), (0, 0), (3, 17), (1, 1)]
  b = make_batch(rng, seqs, **HEADS)
  slopes = _slopes(HEADS["num_q_heads"])
  want = numpy_ref(*b.args, sm_scale=SCALE, alibi_slopes=slopes, **options)
  kv, kw = _layout_args(b, layout)
  got = rpa.ragged_paged_attention(b.q, kv, *b.args[2:], sm_scale=SCALE, alibi_slopes=slopes,
                                   **options, **kw)
  assert max_abs_diff(got, want) <= tolerance(np.float32)
  # The bias matters: without it the result differs.
  assert max_abs_diff(rpa.ragged_paged_attention(b.q, kv, *b.args[2:], sm_scale=SCALE,
                                                 **options, **kw), want) > 1e-3


def test_alibi_plan_and_torch_op(rng):
  torch = pytest.importorskip("torch")
  import rpa.torch  # noqa: F401

  b = make_batch(rng, [(1, 9), (5, 5), (3, 17)], **HEADS)
  slopes = _slopes(HEADS["num_q_heads"])
  want = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, alibi_slopes=slopes)
  w = rpa.BatchAttention()
  _plan(w, b, alibi_slopes=slopes.copy())
  assert np.array_equal(w.run(b.q, b.kv_pages), want)
  got = torch.ops.rpa.ragged_paged_attention(*(to_torch(a) for a in b.args), sm_scale=SCALE,
                                             alibi_slopes=torch.from_numpy(slopes))
  assert np.array_equal(got.numpy(), want)


def test_alibi_messages(rng):
  b = make_batch(rng, [(1, 9)], **HEADS)
  out = np.full_like(b.q, 7.0)
  with pytest.raises(rpa.Error, match=r"^alibi_slopes\.shape=\(3,\) must be \(num_q_heads=4,\)"):
    rpa.ragged_paged_attention(*b.args, alibi_slopes=np.zeros(3, np.float32), out=out)
  with pytest.raises(rpa.Error, match=r"^alibi_slopes\.dtype=dtype\('float64'\) must be float32"):
    rpa.ragged_paged_attention(*b.args, alibi_slopes=np.zeros(4), out=out)
  with pytest.raises(rpa.Error, match=r"^alibi_slopes\[2\]=nan must be finite\."):
    rpa.ragged_paged_attention(*b.args, alibi_slopes=np.array([0, 0, np.nan, 0], np.float32),
                               out=out)
  assert np.all(out == 7.0)


# ---- Custom masks.


def _random_mask(rng, b):
  """A flat bool mask over the batch's live sequences: dense, sparse, empty
  and prefix rows."""
  rows = []
  for i in range(int(b.num_seqs[0])):
    q_len, kv_len = int(b.cu_q_lens[i + 1] - b.cu_q_lens[i]), int(b.kv_lens[i])
    for _ in range(q_len):
      kind = rng.integers(4)
      row = (rng.random(kv_len) < 0.75 if kind == 0 else rng.random(kv_len) < 0.15 if kind == 1
             else np.zeros(kv_len, bool) if kind == 2 else np.arange(kv_len) < kv_len // 2)
      rows.append(row)
  return np.concatenate(rows + [np.zeros(0, bool)])


def _pack(b, flat):
  """FlashInfer's segment_packbits(flat, indptr, bitorder="little")."""
  out, at = [], 0
  for i in range(int(b.num_seqs[0])):
    n = int(b.cu_q_lens[i + 1] - b.cu_q_lens[i]) * int(b.kv_lens[i])
    out.append(np.packbits(flat[at:at + n], bitorder="little"))
    at += n
  return np.concatenate(out + [np.zeros(0, np.uint8)]).astype(np.uint8)


@pytest.mark.parametrize("layout", ["combined", "NHD", "HND"])
def test_custom_mask_matches_numpy_reference(rng, layout):
  b = make_batch(rng, SEQS, **HEADS)
  mask = _random_mask(rng, b)
  want = numpy_ref(*b.args, sm_scale=SCALE, custom_mask=mask)
  kv, kw = _layout_args(b, layout)
  args = (b.q, kv) + b.args[2:]
  got, lse = rpa.ragged_paged_attention(*args, sm_scale=SCALE, custom_mask=mask,
                                        return_lse=True, **kw)
  assert max_abs_diff(got, want) <= tolerance(np.float32)
  assert np.array_equal(rpa.ragged_paged_attention(*args, sm_scale=SCALE,
                                                   packed_custom_mask=_pack(b, mask), **kw), got)
  ref = rpa.ref_ragged_paged_attention(*args, sm_scale=SCALE, custom_mask=mask, **kw)
  assert max_abs_diff(ref, want) <= tolerance(np.float32)
  # A row without a kept key: 0, LSE -inf.
  assert np.isneginf(lse).any()
  assert np.all(got[np.isneginf(lse[:, 0])] == 0)


def test_causal_mask_is_the_causal_call(rng):
  b = make_batch(rng, [(1, 9), (5, 5), (0, 0), (3, 17), (4, 11)], **HEADS)
  rows = []
  for i in range(int(b.num_seqs[0])):
    q_len, kv_len = int(b.cu_q_lens[i + 1] - b.cu_q_lens[i]), int(b.kv_lens[i])
    p = kv_len - q_len + np.arange(q_len)[:, None]
    rows.append((np.arange(kv_len)[None] <= p).reshape(-1))
  mask = np.concatenate(rows)
  want = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE)
  got = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, custom_mask=mask)
  assert max_abs_diff(got, want) <= 1e-6


@pytest.mark.parametrize("form", ["jax", "csr"])
def test_batch_attention_custom_mask_equals_one_call(rng, form):
  b = make_batch(rng, SEQS, **HEADS)
  mask = _random_mask(rng, b)
  want = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, custom_mask=mask, num_threads=2)
  w = rpa.BatchAttention(num_threads=2)
  shape = dict(HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype)
  packed = _pack(b, mask)
  if form == "jax":
    w.plan(*b.args[2:], num_tokens=b.q.shape[0], packed_custom_mask=packed, **shape)
    packed[:] = 0  # The plan keeps its own copy.
    assert np.array_equal(w.run(b.q, b.kv_pages), want)
  else:
    w.plan_csr(*_csr(b), custom_mask=mask, causal=False, **shape)
    mask[:] = False
    live = int(b.cu_q_lens[b.num_seqs[0]])
    assert np.array_equal(w.run(b.q[:live], b.kv_pages), want[:live])


def test_torch_bool_mask(rng):
  torch = pytest.importorskip("torch")
  b = make_batch(rng, SEQS, **HEADS)
  mask = _random_mask(rng, b)
  want = rpa.ragged_paged_attention(*b.args, sm_scale=SCALE, custom_mask=mask)
  got = rpa.ragged_paged_attention(*(to_torch(a) for a in b.args), sm_scale=SCALE,
                                   custom_mask=torch.from_numpy(mask))
  assert np.array_equal(got.numpy(), want)


def test_custom_mask_messages(rng):
  b = make_batch(rng, [(2, 5), (4, 3)], **HEADS)
  mask = np.ones(22, bool)
  out = np.full_like(b.q, 7.0)

  def call(**options):
    rpa.ragged_paged_attention(*b.args, out=out, **options)

  with pytest.raises(rpa.Error, match=r"^custom_mask\.dtype=uint8 must be bool\. ") as e:
    call(custom_mask=mask.astype(np.uint8))
  assert e.value.kind == "dtype"
  with pytest.raises(rpa.Error, match=r"^custom_mask and packed_custom_mask are the same mask"):
    call(custom_mask=mask, packed_custom_mask=_pack(b, mask))
  with pytest.raises(rpa.Error, match=r"^causal=True and custom_mask are two masks"):
    call(custom_mask=mask, causal=True)
  with pytest.raises(rpa.Error, match=r"^sliding_window=3 must be None with custom_mask\."):
    call(custom_mask=mask, sliding_window=3)
  with pytest.raises(rpa.Error, match=r"^custom_mask\.shape=\(21,\) must be \(22,\): the sum"):
    call(custom_mask=mask[:21])
  with pytest.raises(rpa.Error, match=r"^packed_custom_mask\.shape=\(5,\) must be \(4,\)"):
    call(packed_custom_mask=np.zeros(5, np.uint8))
  with pytest.raises(rpa.Error, match=r"^packed_custom_mask\.dtype=dtype\('int8'\) must be uint8"):
    call(packed_custom_mask=np.zeros(4, np.int8))
  assert np.all(out == 7.0)
  w = rpa.BatchAttention()
  with pytest.raises(rpa.Error, match=r"^custom_mask\.shape=\(21,\) must be \(22,\)"):
    w.plan(*b.args[2:], **HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype,
           custom_mask=mask[:21])
  assert not w.info["planned"]


# ---- Cascade (shared-prefix) attention.


def _cascade_case(rng, own, prefix_pages=3, layout="NHD"):
  """Requests sharing a prefix of prefix_pages pages; own[i] = (q_len, own
  tokens). Returns (batch, flat CSR tables, level tables): the flat tables
  list the prefix pages in every request."""
  page_size = HEADS["page_size"]
  seqs = [(q, prefix_pages * page_size + n) for q, n in own]
  b = make_batch(rng, seqs, pad_tokens=0, **HEADS)
  # Every request's first prefix_pages pages: make them request 0's.
  for i in range(1, len(own)):
    b.page_indices[i, :prefix_pages] = b.page_indices[0, :prefix_pages]
  flat = _csr(b)
  rows = int(b.cu_q_lens[len(own)])
  shared = (np.array([0, rows], np.int32), np.array([0, prefix_pages], np.int32),
            b.page_indices[0, :prefix_pages].copy(), np.array([page_size], np.int32))
  unique_pages = [-(-n // page_size) for _, n in own]
  unique = (b.cu_q_lens[:len(own) + 1].copy(),
            np.concatenate([[0], np.cumsum(unique_pages)]).astype(np.int32),
            np.concatenate([b.page_indices[i, prefix_pages:prefix_pages + p]
                            for i, p in enumerate(unique_pages)]).astype(np.int32),
            np.array([n - (p - 1) * page_size for (_, n), p in zip(own, unique_pages)],
                     np.int32))
  return b, flat, [shared, unique]


@pytest.mark.parametrize("layout", ["combined", "NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_cascade_equals_the_flat_call(rng, layout, causal):
  b, flat, levels = _cascade_case(rng, [(1, 5), (3, 9), (1, 1), (2, 4)])
  shape = dict(HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype)
  kv = b.kv_pages if layout == "combined" else b.split(layout)
  w_flat = rpa.BatchAttention(kv_layout=layout)
  w_flat.plan_csr(*flat, **shape, causal=causal, soft_cap=3.0)
  want, want_lse = w_flat.run(b.q, kv, return_lse=True)
  w = rpa.CascadeAttention(2, kv_layout=layout)
  w.plan(*(list(t) for t in zip(*levels)), **shape, causal=causal, soft_cap=3.0)
  got, lse = w.run(b.q, kv, return_lse=True)
  assert max_abs_diff(got, want) <= 1e-5
  assert max_abs_diff(lse, want_lse) <= 1e-5
  # Three levels: an empty middle level (no keys, LSE -inf) changes nothing.
  own = levels[1]
  first = (own[0], np.arange(len(own[0]), dtype=np.int32) * 0, np.zeros(0, np.int32),
           np.zeros(len(own[0]) - 1, np.int32))
  w3 = rpa.CascadeAttention(3, kv_layout=layout)
  w3.plan(*(list(t) for t in zip(levels[0], first, own)), **shape, causal=causal, soft_cap=3.0)
  assert max_abs_diff(w3.run(b.q, kv), want) <= 1e-5


def test_cascade_messages(rng):
  b, _, levels = _cascade_case(rng, [(1, 5), (1, 3)])
  shape = dict(HEADS, num_pages=b.kv_pages.shape[0], q_dtype=b.q.dtype)
  with pytest.raises(rpa.Error, match=r"^num_levels=0 must be an int >= 1\. "):
    rpa.CascadeAttention(0)
  w = rpa.CascadeAttention(2)
  tables = [list(t) for t in zip(*levels)]
  with pytest.raises(rpa.Error, match=r"^kv_indptr_arr holds 1 page tables, but this "
                     r"CascadeAttention has num_levels=2\. "):
    w.plan(tables[0], tables[1][:1], tables[2], tables[3], **shape)
  bad = [t.copy() for t in tables[2]]
  bad[0][0] = 10**6
  with pytest.raises(rpa.Error, match=r"^level 0: kv_indices\[0\]=1000000 must be in range") as e:
    w.plan(tables[0], tables[1], bad, tables[3], **shape)
  assert e.value.kind == "page_index"


def test_fused_write_takes_the_new_options(rng):
  b = make_batch(rng, [(2, 6), (1, 4)], **HEADS)
  new = rng.standard_normal((b.q.shape[0], 2, 16)).astype(np.float32)
  slopes = _slopes(HEADS["num_q_heads"])
  cache = b.kv_pages.copy()
  got = rpa.ragged_paged_attention_with_kv_write(b.q, new, new, cache, *b.args[2:],
                                                 sm_scale=SCALE, alibi_slopes=slopes)
  want = rpa.ragged_paged_attention(b.q, cache, *b.args[2:], sm_scale=SCALE, alibi_slopes=slopes)
  assert np.array_equal(got, want)
  short = make_batch(rng, [(4, 3)], **HEADS)
  rows = rng.standard_normal((short.q.shape[0], 2, 16)).astype(np.float32)
  cache = short.kv_pages.copy()
  with pytest.raises(rpa.Error, match=r"^q_len=4 must be less or equal to kv_len=3 at sequence 0"):
    rpa.ragged_paged_attention_with_kv_write(short.q, rows, rows, cache, *short.args[2:],
                                             causal=False)
  np.testing.assert_array_equal(cache, short.kv_pages)
