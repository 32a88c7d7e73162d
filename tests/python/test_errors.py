"""Every docs/contract.md §3 message reaches Python verbatim as a ValueError (rpa.Error),
from the call and from the validate functions, and nothing is written first.

The expected texts are the library's (src/validate/validate.cc): JAX's sentence, then
the fix."""

import numpy as np
import pytest

import rpa

MASK = repr(rpa.DEFAULT_MASK_VALUE)


def base(num_q_heads=4, num_kv_heads=2, head_dim=8, page_size=4, total_num_pages=10,
         max_num_seqs=8, pages_per_seq=32, tokens=16):
  """A valid batch: two sequences (q_len 2, kv_len 3) and (2, 5)."""
  rng = np.random.default_rng(0)
  kv_lens = np.zeros(max_num_seqs, np.int32)
  kv_lens[:2] = [3, 5]
  cu_q_lens = np.full(max_num_seqs + 1, 4, np.int32)
  cu_q_lens[:3] = [0, 2, 4]
  page_indices = np.zeros((max_num_seqs, pages_per_seq), np.int32)
  page_indices[1, :2] = [3, 4]
  return dict(
      q=rng.standard_normal((tokens, num_q_heads, head_dim)).astype(np.float32),
      kv_pages=rng.standard_normal((total_num_pages, page_size, 2 * num_kv_heads,
                                    head_dim)).astype(np.float32),
      kv_lens=kv_lens, page_indices=page_indices, cu_q_lens=cu_q_lens,
      num_seqs=np.array([2], np.int32))


ARGS = ("q", "kv_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")


def _with(**changes):
  """The base batch with arrays replaced (`name=array`) or edited
  (`name=callable`), plus options (anything else)."""
  b = base(**changes.pop("shape", {}))
  options = {}
  for key, value in changes.items():
    if key in ARGS:
      b[key] = value(b[key]) if callable(value) else value
    else:
      options[key] = value
  return [b[k] for k in ARGS], options


def _set(index, value):
  def edit(a):
    a = a.copy()
    a[index] = value
    return a
  return edit


# (id, changes, message): static checks, raised by every function.
STATIC = [
    ("num_seqs_shape", dict(num_seqs=np.array([2, 2], np.int32)),
     "num_seqs.shape=(2,) must be (1,). Pass num_seqs as a one-element int32 array holding "
     "the number of live sequences."),
    ("head_dim", dict(q=np.zeros((16, 4, 128), np.float32), shape=dict(head_dim=64)),
     "Q head_dim 128 must be the same as that of K/V 64. Q, K and V must share one head_dim: "
     "q.shape[2] == kv_pages.shape[3]."),
    ("kv_lens_shape", dict(kv_lens=np.zeros(7, np.int32)),
     "Expected kv_lens.shape=(7,) to be (8,) where `max_num_seqs` is `page_indices.shape[0]`. "
     "Give kv_lens one entry per row of page_indices."),
    ("cu_q_lens_shape", dict(cu_q_lens=np.zeros(8, np.int32)),
     "Expected cu_q_lens.shape=(8,) to be (9,)  where `max_num_seqs` is "
     "`page_indices.shape[0]`. Give cu_q_lens one entry more than page_indices has rows: "
     "cu_q_lens[i] is where sequence i's queries start."),
    ("int64_metadata", dict(kv_lens=lambda a: a.astype(np.int64)),
     "The dtype of `kv_lens`, `page_indices`, and `cu_q_lens` must be int32. Got "
     "kv_lens.dtype=dtype('int64'), page_indices.dtype=dtype('int32'), "
     "cu_q_lens.dtype=dtype('int32'). Cast them to int32 (for NumPy: .astype(np.int32))."),
    ("all_int64", dict(kv_lens=lambda a: a.astype(np.int64),
                       page_indices=lambda a: a.astype(np.int64),
                       cu_q_lens=lambda a: a.astype(np.int64)),
     "The dtype of `kv_lens`, `page_indices`, and `cu_q_lens` must be int32. Got "
     "kv_lens.dtype=dtype('int64'), page_indices.dtype=dtype('int64'), "
     "cu_q_lens.dtype=dtype('int64'). Cast them to int32 (for NumPy: .astype(np.int32))."),
    ("gqa", dict(q=np.zeros((16, 12, 8), np.float32), shape=dict(num_kv_heads=8)),
     "num_q_heads=12 must be divisible by num_kv_heads=8. Each kv head must serve the same "
     "number of q heads (GQA): choose num_q_heads as a multiple of num_kv_heads."),
    ("sliding_window", dict(sliding_window=0),
     "sliding_window=0 must be positive. Pass the number of keys each query sees (its own "
     "position included), or None for no window."),
    ("sliding_window_negative", dict(sliding_window=-3),
     "sliding_window=-3 must be positive. Pass the number of keys each query sees (its own "
     "position included), or None for no window."),
    ("soft_cap", dict(soft_cap=0.0),
     "soft_cap=0.0 must not be 0.0. Pass the cap c of c * tanh(logit / c) (e.g. 50.0), or "
     "None for no soft cap."),
    ("seed_block_size", dict(num_kv_pages_per_block=64),
     "num_kv_pages_per_block=64 must be in range (0, 32]. Pass None to let the library "
     "choose, or at most pages_per_seq = page_indices.shape[1] = 32; pages_per_seq depends "
     "on page_size (ceil(max_model_len / page_size)), so a value tuned for another page size "
     "will not fit."),
    ("block_size_zero", dict(num_kv_pages_per_block=0),
     "num_kv_pages_per_block=0 must be in range (0, 32]. Pass None to let the library "
     "choose, or at most pages_per_seq = page_indices.shape[1] = 32; pages_per_seq depends "
     "on page_size (ceil(max_model_len / page_size)), so a value tuned for another page size "
     "will not fit."),
    ("num_queries_per_block", dict(num_queries_per_block=0),
     "num_queries_per_block=0 must be positive. Pass None to let the library choose, or a "
     "query-tile size >= 1."),
    ("vmem_limit_bytes", dict(vmem_limit_bytes=0),
     "vmem_limit_bytes=0 must be positive. Pass None for no limit, or a per-worker scratch "
     "budget in bytes."),
    ("odd_combined_heads", dict(kv_pages=np.zeros((10, 4, 3, 8), np.float32)),
     "num_combined_kv_heads=3 (kv_pages.shape[2]) must be even. In the combined layout head "
     "2h holds K and head 2h + 1 holds V of kv head h; interleave K and V so "
     "kv_pages.shape[2] = 2 * num_kv_heads."),
    ("q_float64", dict(q=lambda a: a.astype(np.float64)),
     "q.dtype=dtype('float64') is not supported; q must be one of float32, bfloat16, "
     "float16. Cast q to one of these dtypes."),
    ("q_int16", dict(q=lambda a: a.astype(np.int16)),  # Named by the binding.
     "q.dtype=dtype('int16') is not supported; q must be one of float32, bfloat16, "
     "float16. Cast q to one of these dtypes."),
    ("q_object", dict(q=lambda a: a.astype(object)),
     "q.dtype=dtype('O') is not supported; q must be one of float32, bfloat16, "
     "float16. Cast q to one of these dtypes."),
    ("kv_uint8", dict(kv_pages=lambda a: a.astype(np.uint8)),
     "kv_pages.dtype=dtype('uint8') is not supported; kv_pages must be one of float32, "
     "bfloat16, float16, float8_e4m3fn, float8_e5m2, int8. Cast kv_pages to one of these "
     "dtypes."),
    ("num_seqs_int64", dict(num_seqs=np.array([2], np.int64)),
     "num_seqs.dtype=dtype('int64') must be int32. Cast num_seqs to int32."),
    ("q_rank", dict(q=np.zeros((16, 32), np.float32)),
     "q.shape=(16, 32) must have 3 dimensions [max_num_batched_tokens, num_q_heads, "
     "head_dim]. Pass q as a 3-dimensional array [max_num_batched_tokens, num_q_heads, "
     "head_dim]."),
    ("kv_rank", dict(kv_pages=np.zeros((10, 4, 4), np.float32)),
     "kv_pages.shape=(10, 4, 4) must have 4 dimensions [total_num_pages, page_size, 2 * "
     "num_kv_heads, head_dim]. Pass kv_pages as a 4-dimensional array [total_num_pages, "
     "page_size, 2 * num_kv_heads, head_dim]."),
    ("q_rank_5", dict(q=np.zeros((1, 2, 3, 4, 5), np.float32)),  # Named by the binding.
     "q.shape=(1, 2, 3, 4, 5) has 5 dimensions; rpa's arrays have at most 4. Check the "
     "argument order."),
    ("head_dim_zero", dict(q=np.zeros((16, 4, 0), np.float32), shape=dict(head_dim=0)),
     "head_dim=0 must be positive. kv_pages.shape[3] must be >= 1."),
    ("page_size_zero", dict(shape=dict(page_size=0)),
     "page_size=0 must be positive. Pages must hold at least one token; fix kv_pages's "
     "page_size dimension."),
    ("num_q_heads_zero", dict(q=np.zeros((16, 0, 8), np.float32)),
     "num_q_heads=0 must be positive. q must have at least one head: q.shape[1] >= 1."),
    ("sm_scale_nan", dict(sm_scale=float("nan")),
     "sm_scale=nan must be finite. Pass a finite float for sm_scale, or None to leave it out."),
    ("soft_cap_inf", dict(soft_cap=float("inf")),
     "soft_cap=inf must be finite. Pass a finite float for soft_cap, or None to leave it out."),
    ("k_scale_inf", dict(k_scale=float("-inf")),
     "k_scale=-inf must be finite. Pass a finite float for k_scale, or None to leave it out."),
    ("v_scale_nan", dict(v_scale=float("nan")),
     "v_scale=nan must be finite. Pass a finite float for v_scale, or None to leave it out."),
    ("mask_value_nan", dict(mask_value=float("nan")),
     f"mask_value=nan must not be NaN or +inf. Pass a large negative float (JAX's "
     f"DEFAULT_MASK_VALUE is {MASK}) or -inf, or None for the default."),
    ("sinks_shape", dict(sinks=np.zeros(3, np.float32)),
     "sinks.shape=(3,) must be (num_q_heads=4,). Pass one sink logit per q head, or None for "
     "no sinks."),
    ("sinks_dtype", dict(sinks=np.zeros(4, np.float16)),
     "sinks.dtype=dtype('float16') must be float32. Cast sinks to float32."),
    ("sinks_nan", dict(sinks=np.array([0, 1, np.nan, 2], np.float32)),
     "sinks[2]=nan must not be NaN or +inf. Pass a finite logit, or -inf for a head without a "
     "sink."),
]

# Only at call time (not options of the validate functions).
CALL_ONLY = [
    ("num_threads", dict(num_threads=0),
     "num_threads=0 must be positive. Pass None to use RPA_NUM_THREADS or every core, or a "
     "thread count >= 1."),
]

# Dynamic checks: raised by the calls and dynamic_validate_inputs only.
DYNAMIC = [
    ("num_seqs_too_big", dict(num_seqs=np.array([9], np.int32)),
     "num_seqs[0]=9 must be less or equal to max_num_seqs=8. num_seqs counts the live rows of "
     "page_indices, kv_lens and cu_q_lens; pass at most page_indices.shape[0]."),
    ("num_seqs_negative", dict(num_seqs=np.array([-1], np.int32)),
     "num_seqs[0]=-1 must be greater or equal to 0. Pass the number of live sequences, 0 for "
     "an empty batch."),
    ("min_pages_per_seq", dict(shape=dict(page_size=16, pages_per_seq=4),
                               kv_lens=_set(0, 70), cu_q_lens=_set(slice(1, None), 0)),
     "pages_per_seq=4 must be greater or equal to min_pages_per_seq=5 given max_kv_len=70 "
     "and page_size=16. Widen page_indices to ceil(max_kv_len / page_size) columns, or "
     "shorten the sequences."),
    ("total_q_tokens", dict(shape=dict(tokens=512, page_size=16, pages_per_seq=40),
                            kv_lens=_set(0, 600), cu_q_lens=_set(slice(1, None), 600),
                            num_seqs=np.array([1], np.int32)),
     "Total q tokens 600 must be less or equal to max_num_batched_tokens=512. "
     "cu_q_lens[num_seqs] counts the q rows in use; make q taller or the batch smaller."),
    ("q_len_gt_kv_len", dict(num_seqs=np.array([3], np.int32),
                             cu_q_lens=np.array([0, 2, 4, 9, 9, 9, 9, 9, 9], np.int32),
                             kv_lens=_set(2, 3)),
     "q_len=5 must be less or equal to kv_len=3 at sequence 2. A sequence's new tokens are "
     "part of its history: kv_lens[i] counts them too."),
    ("cu_q_lens_negative", dict(cu_q_lens=_set(0, -1)),
     "cu_q_lens[0]=-1 must be greater or equal to 0. cu_q_lens[i] is the q row where "
     "sequence i starts; rows start at 0."),
    ("cu_q_lens_decreasing", dict(cu_q_lens=_set(2, 1)),
     "cu_q_lens[2]=1 must be greater or equal to cu_q_lens[1]=2. cu_q_lens is the running "
     "sum of the q lengths: it never decreases."),
    ("kv_lens_negative", dict(kv_lens=_set(1, -2)),
     "kv_lens[1]=-2 must be greater or equal to 0. kv_lens holds each sequence's number of "
     "tokens in the cache."),
    ("page_index", dict(page_indices=_set((1, 1), 10)),
     "page_indices[1, 1]=10 must be in range [0, total_num_pages=10) because sequence 1 reads "
     "it (kv_lens[1]=5, page_size=4). Point every page a sequence's kv_len covers at a page "
     "of the cache; columns beyond ceil(kv_len / page_size) are never read and may hold "
     "anything."),
    ("page_index_negative", dict(page_indices=_set((0, 0), -1)),
     "page_indices[0, 0]=-1 must be in range [0, total_num_pages=10) because sequence 0 reads "
     "it (kv_lens[0]=3, page_size=4). Point every page a sequence's kv_len covers at a page "
     "of the cache; columns beyond ceil(kv_len / page_size) are never read and may hold "
     "anything."),
]

_VALIDATE_OPTIONS = {"sm_scale", "sliding_window", "soft_cap", "mask_value", "k_scale",
                     "v_scale", "num_kv_pages_per_block", "num_queries_per_block",
                     "vmem_limit_bytes", "kv_layout", "sinks"}


def _raises(fn, message, *args, **kwargs):
  with pytest.raises(ValueError) as info:
    fn(*args, **kwargs)
  assert isinstance(info.value, rpa.Error)
  assert str(info.value) == message
  return info.value


def _calls_untouched(args, options, message):
  """The calls (fast, reference, fused KV write) raise `message`, leaving out
  and every input (the cache included) untouched."""
  def snapshot():
    return [[np.array(x, copy=True) for x in a] if isinstance(a, tuple) else
            [np.array(a, copy=True)] for a in args]
  inputs = snapshot()
  # The fused KV write validates the same inputs first, before its new rows
  # (any plausible new_k / new_v: the ragged checks fail before theirs).
  shape = np.shape(args[0])
  new = np.ones((shape[0] if shape else 1, 1, shape[-1] if shape else 1), np.float32)

  def fused(q, *rest, **kw):
    return rpa.ragged_paged_attention_with_kv_write(q, new, new, *rest, **kw)

  for fn in (rpa.ragged_paged_attention, rpa.ref_ragged_paged_attention, fused):
    out = np.full(np.shape(args[0]), 7.0, args[0].dtype if args[0].dtype != object else
                  np.float32)
    before = out.copy()
    _raises(fn, message, *args, out=out, return_lse=True, **options)
    np.testing.assert_array_equal(out, before)
    for now, copy in zip(snapshot(), inputs):
      for x, y in zip(now, copy):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("changes,message", [c[1:] for c in STATIC], ids=[c[0] for c in STATIC])
def test_static_errors(changes, message):
  args, options = _with(**changes)
  _calls_untouched(args, options, message)
  e = _raises(rpa.static_validate_inputs, message, *args, **options)
  assert e.kind in ("shape", "dtype", "layout", "option", "block_size")
  _raises(rpa.dynamic_validate_inputs, message, *args, **options)


@pytest.mark.parametrize("changes,message", [c[1:] for c in CALL_ONLY],
                         ids=[c[0] for c in CALL_ONLY])
def test_call_errors(changes, message):
  args, options = _with(**changes)
  _calls_untouched(args, options, message)


@pytest.mark.parametrize("changes,message", [c[1:] for c in DYNAMIC],
                         ids=[c[0] for c in DYNAMIC])
def test_dynamic_errors(changes, message):
  args, options = _with(**changes)
  _calls_untouched(args, options, message)
  rpa.static_validate_inputs(*args, **options)  # Only the values are wrong.
  e = _raises(rpa.dynamic_validate_inputs, message, *args, **options)
  assert e.kind in ("metadata", "page_index")


def test_valid_base_passes():
  """The base batch every error case edits is valid: the validators accept it
  and the call computes its attention (the reference's, padding rows 0)."""
  args, _ = _with()
  assert rpa.static_validate_inputs(*args) is None
  options = dict(sm_scale=0.5, sliding_window=2, soft_cap=1.0, num_kv_pages_per_block=32,
                 num_queries_per_block=1)
  assert rpa.dynamic_validate_inputs(*args, **options) is None
  for kwargs in ({}, options):
    out = rpa.ragged_paged_attention(*args, **kwargs)
    ref = rpa.ref_ragged_paged_attention(*args, **kwargs)
    assert out.shape == args[0].shape
    assert np.abs(ref[:4]).max() > 0 and not np.any(out[4:])
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)


def test_error_kind_and_type():
  args, _ = _with()
  with pytest.raises(rpa.Error) as info:
    rpa.ragged_paged_attention(*args, num_kv_pages_per_block=64)
  assert info.value.kind == "block_size"
  assert type(info.value).__mro__[1] is ValueError


def test_torch_int64_metadata_gets_jaxs_message():
  torch = pytest.importorskip("torch")
  args, _ = _with()
  t = [torch.from_numpy(a) for a in args]
  t[2] = t[2].long()
  t[4] = t[4].long()
  _raises(rpa.ragged_paged_attention,
          "The dtype of `kv_lens`, `page_indices`, and `cu_q_lens` must be int32. Got "
          "kv_lens.dtype=dtype('int64'), page_indices.dtype=dtype('int32'), "
          "cu_q_lens.dtype=dtype('int64'). Cast them to int32 (for NumPy: .astype(np.int32)).",
          *t)
  t = [torch.from_numpy(a) for a in args]
  t[0] = t[0].to(torch.int16)
  _raises(rpa.ragged_paged_attention,
          "q.dtype=torch.int16 is not supported; q must be one of float32, bfloat16, float16. "
          "Cast q to one of these dtypes.", *t)


# ---- Separate K/V caches.

def _split_args(k_shape=(10, 4, 2, 8), v_shape=(10, 4, 2, 8), v_dtype=np.float32):
  args, _ = _with()
  k = np.zeros(k_shape, np.float32)
  v = np.zeros(v_shape, v_dtype)
  return [args[0], (k, v)] + args[2:]


@pytest.mark.parametrize("args,options,message", [
    (_split_args(v_shape=(10, 4, 2, 4)), {},
     "k_pages and v_pages must have the same shape. Got (10, 4, 2, 8) and (10, 4, 2, 4). Pass K "
     "and V caches of one shape, with the same pages, page size, heads and head_dim."),
    (_split_args(v_dtype=np.float16), {},
     "k_pages.dtype=dtype('float32') must be the same as v_pages.dtype=dtype('float16'). "
     "Store K and V in one dtype."),
    (_split_args(k_shape=(10, 4, 8), v_shape=(10, 4, 8)), dict(kv_layout="HND"),
     "k_pages.shape=(10, 4, 8) must have 4 dimensions [total_num_pages, num_kv_heads, "
     "page_size, head_dim]. Pass k_pages as a 4-dimensional array [total_num_pages, "
     "num_kv_heads, page_size, head_dim]."),
    (_split_args(), dict(kv_layout="NDH"),
     "kv_layout='NDH' must be 'NHD' or 'HND'. 'NHD' is [num_pages, page_size, num_kv_heads, "
     "head_dim] (vLLM, FlashInfer), 'HND' is [num_pages, num_kv_heads, page_size, head_dim]."),
    (_with()[0], dict(kv_layout="HND"),
     "kv_layout='HND' applies to separate K and V caches only. Pass kv_pages=(k_pages, "
     "v_pages), or omit kv_layout for JAX's combined kv_pages."),
], ids=["shape", "dtype", "rank", "layout_name", "layout_combined"])
def test_split_cache_errors(args, options, message):
  _calls_untouched(args, options, message)
  _raises(rpa.static_validate_inputs, message, *args, **options)


# ---- paged_attention: JAX's texts.

def _paged(batch=4, num_q_heads=4, num_kv_heads=2, head_dim=8, k_head_dim=None,
           v_head_dim=None, pages_per_sequence=8, lengths_len=None, page_rows=None,
           lengths_dtype=np.int32):
  q = np.ones((batch, num_q_heads, head_dim), np.float32)
  k = np.ones((num_kv_heads, 10, 4, k_head_dim or head_dim), np.float32)
  v = np.ones((num_kv_heads, 10, 4, v_head_dim or k_head_dim or head_dim), np.float32)
  lengths = np.full(lengths_len or batch, 3, lengths_dtype)
  page_indices = np.zeros((page_rows or batch, pages_per_sequence), np.int32)
  return q, k, v, lengths, page_indices


PAGED = [
    ("kv_shape", _paged(v_head_dim=16), {},
     "k_pages and v_pages must have the same shape. Got (2, 10, 4, 8) and (2, 10, 4, 16). "
     "Pass K and V caches of one shape [num_kv_heads, total_num_pages, page_size, head_dim]."),
    ("gqa", _paged(num_q_heads=3), {},
     "Number of Q heads must be divisible by number of KV heads. Got 3 and 2. Each kv head "
     "must serve the same number of q heads (GQA)."),
    ("head_dim", _paged(head_dim=16, k_head_dim=8), {},
     "head_dim of Q must be the same as that of K/V. Got 16 and 8. Q, K and V must share one "
     "head_dim: q.shape[2] == k_pages.shape[3]."),
    ("compute_block", _paged(), dict(pages_per_compute_block=3),
     "pages_per_sequence=8 must be divisible by pages_per_compute_block=3. Pass a divisor of "
     "pages_per_sequence = page_indices.shape[1]."),
    ("compute_block_zero", _paged(), dict(pages_per_compute_block=0),
     "pages_per_compute_block=0 must be positive. Pass a divisor of pages_per_sequence = "
     "page_indices.shape[1]."),
    ("lengths_batch", _paged(lengths_len=3), {},
     "`lengths` and `q` must have the same batch size. Give lengths one entry per row of q "
     "(4); got lengths.shape=(3,)."),
    ("page_indices_batch", _paged(page_rows=3), {},
     "`page_indices` and `q` must have the same batch size. Give page_indices one row per row "
     "of q (4); got page_indices.shape=(3, 8)."),
    ("lengths_dtype", _paged(lengths_dtype=np.int64), {},
     "The dtype of `lengths` must be int32. Got int64. Cast lengths to int32."),
    ("megacore_kv_head", _paged(num_q_heads=3, num_kv_heads=3), dict(megacore_mode="kv_head"),
     "number of KV heads must be even when megacore_mode is 'kv_head'. Pass "
     "megacore_mode=None (on CPU it changes nothing)."),
    ("megacore_batch", _paged(batch=3), dict(megacore_mode="batch"),
     "batch size must be even when megacore_mode is 'batch'. Pass megacore_mode=None (on CPU "
     "it changes nothing)."),
    ("megacore_value", _paged(), dict(megacore_mode="both"),
     "megacore_mode must be one of ['kv_head', 'batch', None]. Got megacore_mode='both'; pass "
     "None on CPU."),
    ("soft_cap", _paged(), dict(attn_logits_soft_cap=0.0),
     "attn_logits_soft_cap=0.0 must not be 0.0. Pass the cap c of c * tanh(logit / c), or "
     "None for no soft cap."),
    ("mask_value", _paged(), dict(mask_value=float("inf")),
     f"mask_value=inf must not be NaN or +inf. Pass a large negative float (JAX's "
     f"DEFAULT_MASK_VALUE is {MASK}) or -inf, or None for the default."),
    ("page_index", _paged(), dict(),
     None),  # Filled below: an out-of-range page a sequence reads.
]


@pytest.mark.parametrize("args,options,message", [c[1:] for c in PAGED],
                         ids=[c[0] for c in PAGED])
def test_paged_attention_errors(args, options, message):
  options = dict(dict(pages_per_compute_block=2), **options)
  if message is None:
    args[4][2, 0] = 10
    message = ("page_indices[2, 0]=10 must be in range [0, total_num_pages=10) because "
               "sequence 2 reads it (lengths[2]=3, page_size=4). Point every page a "
               "sequence's kv_len covers at a page of the cache; columns beyond "
               "ceil(kv_len / page_size) are never read and may hold anything.")
  out = np.full(args[0].shape, 7.0, np.float32)
  _raises(rpa.paged_attention, message, *args, out=out, **options)
  assert np.all(out == 7.0)


# ---- Errors of the Python layer itself.

def test_python_level_errors():
  args, _ = _with()
  with pytest.raises(TypeError, match=r"sliding_window must be an int or None\. Got 2\.5"):
    rpa.ragged_paged_attention(*args, sliding_window=2.5)
  with pytest.raises(TypeError, match="sm_scale must be a float or None"):
    rpa.ragged_paged_attention(*args, sm_scale="big")
  with pytest.raises(TypeError, match="pages_per_compute_block"):
    rpa.paged_attention(*_paged())  # Required, as in JAX.
  out = np.zeros_like(args[0])
  out.flags.writeable = False
  _raises(rpa.ragged_paged_attention, "out is read-only. Pass a writable array, or omit out.",
          *args, out=out)
  _raises(rpa.ragged_paged_attention,
          "out.shape=(16, 4, 7) must be the same as q.shape=(16, 4, 8). Allocate out like q.",
          *args, out=np.zeros((16, 4, 7), np.float32))
  _raises(rpa.ragged_paged_attention,
          "out.dtype=dtype('float16') must be the same as q.dtype=dtype('float32'). Allocate "
          "out like q.", *args, out=np.zeros((16, 4, 8), np.float16))
  # NumPy scalars are accepted for options, printed as Python's.
  _raises(rpa.ragged_paged_attention,
          "sliding_window=0 must be positive. Pass the number of keys each query sees (its own "
          "position included), or None for no window.", *args, sliding_window=np.int32(0))
