"""How arrays reach the library: in place when the layout allows (through
strides), copied when not, never misread; numpy and torch alike; the GIL is
released while the library runs."""

import sys
import threading
import time

import numpy as np
import pytest

import rpa
from rpa import _rpa
from rpa_testing import make_batch, max_abs_diff, to_numpy, to_torch, tolerance

MIXED = [(1, 9), (5, 13), (7, 7), (3, 30)]


# ---- The view the library gets.

@pytest.mark.parametrize("make,copied,strides", [
    (lambda: np.zeros((4, 6, 8), np.float32), False, [48, 8, 1]),
    (lambda: np.zeros((4, 6, 8), np.float32)[:, ::2], False, [48, 16, 1]),
    (lambda: np.zeros((4, 6, 8), np.float32)[1:3, :, :5], False, [48, 8, 1]),
    (lambda: np.zeros((4, 6, 8), np.float32).transpose(1, 0, 2), False, [8, 48, 1]),
    (lambda: np.zeros((8, 6, 4), np.float32).transpose(2, 1, 0), True, [48, 8, 1]),
    (lambda: np.zeros((4, 6, 8), np.float32)[:, :, ::2], True, [24, 4, 1]),
    (lambda: np.zeros((4, 6, 8), np.float32)[::-1], True, [48, 8, 1]),
    (lambda: np.zeros((4, 6, 8), ">f4"), True, [48, 8, 1]),  # Big-endian.
    (lambda: np.zeros((4, 1, 8), np.float32)[:, ::5], False, [8, 8, 1]),  # Extent 1.
    (lambda: np.broadcast_to(np.zeros(8, np.float32), (4, 6, 8)), False, [0, 0, 1]),
    (lambda: np.zeros(5, np.int32)[::2], True, [1]),
    (lambda: np.zeros((0, 3), np.float32)[:, ::2], False, [2, 1]),  # Empty.
])
def test_numpy_views(make, copied, strides):
  a = make()
  info = _rpa.view_info(a)
  assert info["copied"] == copied
  assert info["shape"] == list(a.shape)
  assert info["strides"] == strides
  if not copied and a.size:
    assert info["data"] == a.__array_interface__["data"][0]


def test_unaligned_and_odd_byte_strides_are_copied():
  raw = np.zeros(4 * 7 * 4 + 1, np.uint8)
  # float32 data starting at an odd address.
  unaligned = raw[1:].view(np.float32).reshape(4, 7)
  assert _rpa.view_info(unaligned)["copied"]
  # Byte strides that are not whole elements (10 bytes per row of float32).
  odd = np.lib.stride_tricks.as_strided(raw[:44].view(np.float32)[:1], shape=(4, 2),
                                        strides=(10, 4))
  info = _rpa.view_info(odd)
  assert info["copied"] and info["strides"] == [2, 1]


def test_outputs_never_alias_themselves():
  # A stride-0 output would write one element through two indices: scratch.
  out = np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), shape=(4, 8), strides=(0, 4))
  assert out.flags.writeable
  assert _rpa.view_info(out, writable=True)["copied"]
  assert not _rpa.view_info(out)["copied"]  # Fine to read.
  with pytest.raises(ValueError, match="x is read-only"):
    _rpa.view_info(np.broadcast_to(np.zeros(8, np.float32), (4, 8)), writable=True)


def _strided_like(a, axis_pad):
  """`a` as a view into a larger array: each axis in `axis_pad` padded by
  that many elements, so strides differ from a contiguous array's."""
  fill = np.nan if a.dtype.kind == "f" else -1
  big = np.full(tuple(n + axis_pad.get(i, 0) for i, n in enumerate(a.shape)), fill, a.dtype)
  view = big[tuple(slice(0, n) for n in a.shape)]
  view[...] = a
  return view


def test_strided_inputs_match_contiguous(rng):
  b = make_batch(rng, MIXED, num_q_heads=4, num_kv_heads=2, head_dim=16)
  expected = rpa.ragged_paged_attention(*b.args, sliding_window=5)
  q = _strided_like(b.q, {1: 3, 2: 5})
  kv = _strided_like(b.kv_pages, {0: 1, 1: 2, 2: 1, 3: 7})
  page_indices = _strided_like(b.page_indices, {1: 4})
  kv_lens = np.stack([b.kv_lens, b.kv_lens], axis=1)[:, 0]  # Stride 2: copied.
  cu_q_lens = b.cu_q_lens[None, :].repeat(3, 0)[1]
  for a in (q, kv, page_indices, cu_q_lens):
    assert not _rpa.view_info(a)["copied"]
  assert _rpa.view_info(kv_lens)["copied"]
  out = rpa.ragged_paged_attention(q, kv, kv_lens, page_indices, cu_q_lens, b.num_seqs,
                                   sliding_window=5)
  np.testing.assert_array_equal(out, expected)
  # head_dim not contiguous (a transposed q): copied, same numbers.
  qt = np.ascontiguousarray(b.q.transpose(2, 1, 0)).transpose(2, 1, 0)
  assert _rpa.view_info(qt)["copied"]
  np.testing.assert_array_equal(
      rpa.ragged_paged_attention(qt, *b.args[1:], sliding_window=5), expected)


def test_hnd_and_nhd_views_without_copies(rng):
  b = make_batch(rng, MIXED, num_q_heads=6, num_kv_heads=3, head_dim=8, page_size=5)
  expected = rpa.ragged_paged_attention(*b.args)
  k, v = b.split("NHD")  # Every other head of the combined cache: a strided view.
  assert not _rpa.view_info(k)["copied"]
  np.testing.assert_array_equal(
      rpa.ragged_paged_attention(b.q, (k, v), *b.args[2:], kv_layout="NHD"), expected)
  # An HND view of an NHD buffer, and an NHD view of an HND buffer.
  hnd_view = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  assert not _rpa.view_info(hnd_view[0])["copied"]
  np.testing.assert_array_equal(
      rpa.ragged_paged_attention(b.q, hnd_view, *b.args[2:], kv_layout="HND"), expected)
  kh, vh = b.split("HND")
  nhd_view = kh.transpose(0, 2, 1, 3), vh.transpose(0, 2, 1, 3)
  np.testing.assert_array_equal(
      rpa.ragged_paged_attention(b.q, nhd_view, *b.args[2:], kv_layout="NHD"), expected)


# ---- torch.

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("q_dtype,kv_dtype", [
    ("float32", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16"),
    ("float32", "bfloat16"), ("bfloat16", "float32")])
def test_torch_dtypes_match_reference(rng, q_dtype, kv_dtype):
  b = make_batch(rng, MIXED, num_q_heads=8, num_kv_heads=2, head_dim=32)
  t = [to_torch(b.q, getattr(torch, q_dtype)), to_torch(b.kv_pages, getattr(torch, kv_dtype))]
  t += [to_torch(a) for a in b.args[2:]]
  out = rpa.ragged_paged_attention(*t, sm_scale=0.2, soft_cap=10.0)
  ref = rpa.ref_ragged_paged_attention(*t, sm_scale=0.2, soft_cap=10.0)
  assert isinstance(out, torch.Tensor) and out.dtype == t[0].dtype
  assert tuple(out.shape) == b.q.shape
  tol = tolerance(kv_dtype, q_dtype=q_dtype)
  # A bf16 output may also land one bf16 step (2^-7 relative) apart.
  ulp = 2.0**-7 if q_dtype == "bfloat16" else 0.0
  o, r = to_numpy(out).astype(np.float64), to_numpy(ref).astype(np.float64)
  excess = np.abs(o - r) - (tol + ulp * np.abs(r))
  assert np.all(excess <= 0), f"max |out - ref| = {max_abs_diff(out, ref)}"


def test_numpy_and_torch_give_the_same_result(rng):
  b = make_batch(rng, MIXED, num_q_heads=4, num_kv_heads=1, head_dim=64)
  for dtype in (np.float32, np.float16):
    args = (b.q.astype(dtype), b.kv_pages.astype(dtype)) + b.args[2:]
    expected = rpa.ragged_paged_attention(*args, sliding_window=9)
    out = rpa.ragged_paged_attention(*(torch.from_numpy(a) for a in args), sliding_window=9)
    np.testing.assert_array_equal(out.numpy(), expected)
    # Mixed: torch q with numpy cache and metadata; the result is q's kind.
    mixed = rpa.ragged_paged_attention(torch.from_numpy(args[0]), *args[1:], sliding_window=9)
    assert isinstance(mixed, torch.Tensor)
    np.testing.assert_array_equal(mixed.numpy(), expected)


def test_torch_tensors_are_read_in_place(rng):
  x = torch.zeros(4, 6, 8)
  for view, copied in [(x, False), (x[:, ::2], False), (x.transpose(0, 1), False),
                       (x[:, :, ::2], True), (x.permute(2, 1, 0), True)]:
    info = _rpa.view_info(view)
    assert info["copied"] == copied
    assert info["strides"] == (list(view.stride()) if not copied else
                               list(view.contiguous().stride()))
    if not copied:
      assert info["data"] == view.data_ptr()
  # requires_grad: read through a detached view, no copy.
  p = torch.nn.Parameter(torch.zeros(3, 4))
  assert _rpa.view_info(p)["data"] == p.data_ptr()


def test_torch_non_contiguous_and_grad(rng):
  b = make_batch(rng, MIXED, num_q_heads=4, num_kv_heads=2, head_dim=16)
  expected = rpa.ragged_paged_attention(*b.args)
  q = torch.from_numpy(np.ascontiguousarray(b.q.transpose(1, 0, 2))).transpose(0, 1)
  q.requires_grad_(True)
  kv = torch.from_numpy(np.ascontiguousarray(b.kv_pages.transpose(0, 2, 1, 3))).transpose(1, 2)
  out = rpa.ragged_paged_attention(q, kv, *(torch.from_numpy(a) for a in b.args[2:]))
  assert not out.requires_grad
  np.testing.assert_array_equal(out.numpy(), expected)
  # A preallocated torch out, strided.
  wide = torch.zeros(b.q.shape[0], b.q.shape[1], 2 * b.q.shape[2])
  res = rpa.ragged_paged_attention(torch.from_numpy(b.q), *b.args[1:], out=wide[:, :, :16])
  assert res.data_ptr() == wide.data_ptr()
  np.testing.assert_array_equal(wide[:, :, :16].numpy(), expected)
  assert not wide[:, :, 16:].any()
  # ... and one that aliases q.
  q2 = torch.from_numpy(b.q.copy())
  rpa.ragged_paged_attention(q2, *b.args[1:], out=q2)
  np.testing.assert_array_equal(q2.numpy(), expected)


def test_torch_out_untouched_on_error(rng):
  b = make_batch(rng, MIXED)
  out = torch.full(b.q.shape, 7.0)
  with pytest.raises(ValueError, match="sliding_window=0 must be positive"):
    rpa.ragged_paged_attention(torch.from_numpy(b.q), *b.args[1:], sliding_window=0, out=out)
  assert bool((out == 7.0).all())


def test_torch_lse(rng):
  b = make_batch(rng, MIXED)
  out, lse = rpa.ragged_paged_attention(torch.from_numpy(b.q), *b.args[1:], return_lse=True)
  assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
  np.testing.assert_allclose(lse.numpy(),
                             rpa.ref_ragged_paged_attention(*b.args, return_lse=True)[1],
                             atol=1e-5)


# ---- The GIL.

def test_gil_is_released_during_the_call(rng):
  """Thread B can run Python while thread A is inside the library.

  With a huge switch interval, B gets the GIL only when A gives it up
  voluntarily. A marks `in_call` around its calls; B records whether it ever
  ran while `in_call` was set. A library call that kept the GIL would let B
  run only after A cleared the flag (or never), whatever the timing."""
  b = make_batch(rng, [(16, 200)] * 4, num_q_heads=8, num_kv_heads=2, head_dim=64,
                 page_size=16)
  state = {"in_call": False, "seen": False, "stop": False}
  go = threading.Event()

  def observer():
    go.wait()
    while not state["stop"]:
      if state["in_call"]:
        state["seen"] = True
        return
      time.sleep(0.0001)  # Gives the GIL back.

  interval = sys.getswitchinterval()
  thread = threading.Thread(target=observer)
  thread.start()
  try:
    sys.setswitchinterval(1000.0)
    go.set()
    for _ in range(200):
      state["in_call"] = True
      rpa.ragged_paged_attention(*b.args, num_threads=1)
      state["in_call"] = False
      if state["seen"]:
        break
  finally:
    state["stop"] = True
    sys.setswitchinterval(interval)
    thread.join()
  assert state["seen"]
