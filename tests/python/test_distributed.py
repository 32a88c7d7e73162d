"""rpa.distributed: context parallelism (each rank attends over its pages,
the (out, lse) partials are exchanged and merged) and tensor parallelism
(a head slice per rank).

In-process tests check the split and the per-rank decomposition against the
single-process call on many random batches (every rank simulated in one
process, merged as the exchange merges); the multi-process tests run 1, 2
and 4 real ranks (torch.multiprocessing spawn, gloo over 127.0.0.1), every
process joined with a deadline and every collective under a timeout."""

from __future__ import annotations

import time

import numpy as np
import pytest

import rpa
from rpa_testing import make_batch, max_abs_diff, tolerance

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
  pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import rpa.distributed as rd  # noqa: E402

import distributed_workers  # noqa: E402


# ---------------------------------------------------------------------------
# In-process: the split and the decomposition, every rank simulated.


def _simulate(b, shards, *, sliding_window=None, soft_cap=None, sinks=None, sm_scale=0.25,
              q=None, kv=None):
  """The merged output and lse of every shard's partial, as the exchange
  merges them (all-gather's merge_states in rank order, sinks once)."""
  q = torch.from_numpy(b.q) if q is None else q
  kv = torch.from_numpy(b.kv_pages) if kv is None else kv
  parts = []
  for s in shards:
    rd._check_shard(s, b.q.shape[0], s.page_size)
    calls = rd._local_calls(s, sliding_window)
    plans = rd._rank_plans(s, calls, q, kv, sm_scale=sm_scale, sliding_window=sliding_window,
                           soft_cap=soft_cap, mask_value=None, kv_layout=None, kv_dtype=None,
                           num_threads=1)
    out, lse = rd._partial(q, kv, plans)
    parts.append(torch.cat([out.reshape(-1), lse.reshape(-1), torch.zeros(1)]))
  out, lse = rd._merge_gathered(parts, *q.shape)
  if sinks is not None:
    out = rd._join_sinks(out, lse, torch.from_numpy(sinks))
  return out.numpy(), lse.numpy()


@pytest.mark.parametrize("layout", ["interleaved", "contiguous"])
def test_split_pages_holds_every_page_once(rng, layout):
  seqs = [(1, 1), (3, 17), (1, 40), (0, 0), (5, 5)]
  b = make_batch(rng, seqs, page_size=4)
  for world in (1, 2, 3, 4, 8):
    shards = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=4,
                            world_size=world, layout=layout)
    assert [s.rank for s in shards] == list(range(world))
    for i, (_, kv_len) in enumerate(seqs):
      held = []
      for s in shards:
        count = -(-int(s.kv_lens[i]) // 4)
        slots = s.page_slots[i, :count].tolist()
        assert slots == sorted(slots)
        assert s.page_indices[i, :count].tolist() == b.page_indices[i, slots].tolist()
        held += slots
      assert sorted(held) == list(range(-(-kv_len // 4)))
      assert sum(int(s.kv_lens[i]) for s in shards) == kv_len
    # One page of sequence 0: every other rank holds none of it.
    assert sorted(int(s.kv_lens[0]) for s in shards) == [0] * (world - 1) + [1]
    if layout == "interleaved":
      assert shards[-1 % world].page_slots[2, 0] == (world - 1) % world


def test_split_pages_interleaves_in_chunks(rng):
  b = make_batch(rng, [(1, 40)], page_size=4)
  s0, s1 = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=4,
                          world_size=2, pages_per_chunk=2)
  assert s0.page_slots[0].tolist() == [0, 1, 4, 5, 8, 9]
  assert s1.page_slots[0].tolist() == [2, 3, 6, 7]
  assert (int(s0.kv_lens[0]), int(s1.kv_lens[0])) == (24, 16)


def _random_batch(rng, page_size):
  seqs = []
  for _ in range(int(rng.integers(0, 5))):
    kv_len = int(rng.integers(0, 40))
    q_len = int(rng.integers(0, kv_len + 1)) if rng.random() < 0.6 else min(1, kv_len)
    seqs.append((q_len, kv_len))
  return make_batch(rng, seqs, page_size=page_size)


def test_every_rank_simulated_equals_the_single_call(rng):
  """200 random mixed batches: page sizes 1-5, 1-4 ranks, both layouts,
  windows from 1 (cutting anywhere in a page), soft caps, sinks; the merge
  of the ranks' partials against one call over all keys, output and lse."""
  for trial in range(200):
    page_size = int(rng.integers(1, 6))
    b = _random_batch(rng, page_size)
    world = int(rng.integers(1, 5))
    window = None if rng.random() < 0.3 else int(rng.integers(1, 20))
    soft_cap = None if rng.random() < 0.7 else 5.0
    sinks = None if rng.random() < 0.6 else rng.standard_normal(4).astype(np.float32)
    want, want_lse = rpa.ragged_paged_attention(
        *b.args, sm_scale=0.25, sliding_window=window, soft_cap=soft_cap, sinks=sinks,
        return_lse=True, num_threads=1)
    shards = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                            page_size=page_size, world_size=world,
                            layout=("interleaved", "contiguous")[trial % 2],
                            pages_per_chunk=int(rng.integers(1, 3)))
    got, got_lse = _simulate(b, shards, sliding_window=window, soft_cap=soft_cap, sinks=sinks)
    what = (trial, page_size, world, window, soft_cap, sinks is not None, b.kv_lens)
    assert max_abs_diff(got, want) <= tolerance("float32"), what
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse)), what
    finite = np.isfinite(want_lse)
    assert np.max(np.abs(got_lse[finite] - want_lse[finite]), initial=0.0) <= 1e-5, what


def test_decode_rows_are_one_call_without_a_window(rng):
  """A decode batch is one call per rank, also with a window whose edge falls
  on a page boundary; a window edge inside a page of a rank that does not
  hold the whole window costs that rank one more call (per distinct local
  window); a rank holding no keys makes none."""
  b = make_batch(rng, [(1, 33), (1, 9), (1, 2)], page_size=4)
  shards = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=4,
                          world_size=4)
  assert [len(rd._local_calls(s, None)) for s in shards] == [1, 1, 1, 1]
  calls = rd._local_calls(shards[0], None)
  window, rows, kv_lens, _, _, num_seqs = calls[0]
  assert window is None and rows.tolist() == [0, 1, 2] and num_seqs.tolist() == [3]
  # Window 9: the edges (positions 24, 0, < 0) are page boundaries.
  assert [len(rd._local_calls(s, 9)) for s in shards] == [1, 1, 1, 1]
  # Window 8: sequence 0's edge (25) is inside page 6, on rank 2, sequence
  # 1's (1) inside page 0, on rank 0: each needs a call with its own window.
  assert [len(rd._local_calls(s, 8)) for s in shards] == [2, 1, 2, 1]
  assert sorted(c[0] for c in rd._local_calls(shards[0], 8)) == [3, 8]
  one_page = make_batch(rng, [(1, 3)], page_size=4)
  empty = rd.split_pages(one_page.kv_lens, one_page.page_indices, one_page.cu_q_lens,
                         one_page.num_seqs, page_size=4, world_size=2)[1]
  assert rd._local_calls(empty, None) == []


def _count_plans(monkeypatch):
  """A list that grows by one per rpa.BatchAttention.plan call."""
  planned = []
  plan = rpa.BatchAttention.plan

  def counted(self, *args, **kwargs):
    planned.append(1)
    return plan(self, *args, **kwargs)

  monkeypatch.setattr(rpa.BatchAttention, "plan", counted)
  return planned


def test_a_step_plans_once_per_rank(rng, monkeypatch):
  """Three ranks (simulated) and three layers of one step: every rank plans
  its calls in the first layer only, later layers run those plans, and each
  layer's merge equals the single call over its own cache. A new step (new
  shards) plans again; so does a layer whose options differ."""
  planned = _count_plans(monkeypatch)
  b = make_batch(rng, [(1, 33), (4, 9), (1, 2), (6, 20)], page_size=4)
  shards = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=4,
                          world_size=3)
  calls = sum(len(rd._local_calls(s, 5)) for s in shards)
  assert calls >= 3
  for layer in range(3):
    kv = rng.standard_normal(b.kv_pages.shape).astype(np.float32)
    want, want_lse = rpa.ragged_paged_attention(b.q, kv, *b.args[2:], sm_scale=0.25,
                                                sliding_window=5, return_lse=True,
                                                num_threads=1)
    got, got_lse = _simulate(b, shards, sliding_window=5, kv=torch.from_numpy(kv))
    assert len(planned) == calls, layer
    assert max_abs_diff(got, want) <= tolerance("float32"), layer
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse)), layer
  _simulate(b, shards, sliding_window=5, soft_cap=3.0)
  assert len(planned) == 2 * calls
  _simulate(b, rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=4,
                              world_size=3), sliding_window=5)
  assert len(planned) == 3 * calls
  # The public call, on a world of one: planned by its first layer.
  shard = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=4,
                         world_size=1)[0]
  for layer in range(3):
    got = rd.context_parallel_attention(b.q, b.kv_pages, shard, sm_scale=0.25,
                                        sliding_window=5)
    assert len(planned) == 3 * calls + len(rd._local_calls(shard, 5)), layer
  want = rpa.ragged_paged_attention(*b.args, sm_scale=0.25, sliding_window=5)
  assert max_abs_diff(got, want) <= tolerance("float32")


def test_world_of_one_needs_no_process_group(rng):
  assert not dist.is_initialized()
  b = make_batch(rng, [(1, 20), (4, 9)], page_size=4)
  sinks = rng.standard_normal(4).astype(np.float32)
  shard = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=4,
                         world_size=1)[0]
  want, want_lse = rpa.ragged_paged_attention(*b.args, sm_scale=0.25, sliding_window=3,
                                              sinks=sinks, return_lse=True)
  got, got_lse = rd.context_parallel_attention(b.q, b.kv_pages, shard, sm_scale=0.25,
                                               sliding_window=3, sinks=sinks, return_lse=True)
  assert isinstance(got, np.ndarray) and got.dtype == b.q.dtype
  assert max_abs_diff(got, want) <= tolerance("float32")
  assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
  q16 = torch.from_numpy(b.q).to(torch.bfloat16)
  kv16 = torch.from_numpy(b.kv_pages).to(torch.bfloat16)
  got16 = rd.context_parallel_attention(q16, kv16, shard, sm_scale=0.25)
  want16 = rpa.ragged_paged_attention(q16, kv16, *b.args[2:], sm_scale=0.25)
  assert got16.dtype == torch.bfloat16
  assert max_abs_diff(got16, want16) <= tolerance("bfloat16")


def test_local_errors(rng):
  b = make_batch(rng, [(1, 20)], page_size=4)
  args = (b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs)
  shard = rd.split_pages(*args, page_size=4, world_size=1)[0]
  with pytest.raises(rpa.Error, match=r"mask_value=-10.0 must be None or <= -1e4") as e:
    rd.context_parallel_attention(b.q, b.kv_pages, shard, mask_value=-10.0)
  assert e.value.kind == "option"
  with pytest.raises(rpa.Error, match="shard=dict must be a ContextShard"):
    rd.context_parallel_attention(b.q, b.kv_pages, {})
  with pytest.raises(rpa.Error, match="exchange='ring' must be one of"):
    rd.context_parallel_attention(b.q, b.kv_pages, shard, exchange="ring")
  with pytest.raises(rpa.Error, match="shard.page_size=4 must be the cache's page_size=2"):
    rd.context_parallel_attention(b.q, b.kv_pages.reshape(-1, 2, 4, 16), shard)
  with pytest.raises(rpa.Error, match=r"shard.world_size=2 needs a torch.distributed process"):
    rd.context_parallel_attention(b.q, b.kv_pages,
                                  rd.split_pages(*args, page_size=4, world_size=2)[1])
  bad = rd.split_pages(*args, page_size=4, world_size=1)[0]
  bad.page_slots[0, :2] = [1, 0]
  with pytest.raises(rpa.Error, match="sequence 0's shard is inconsistent") as e:
    rd.context_parallel_attention(b.q, b.kv_pages, bad)
  assert e.value.kind == "metadata"
  with pytest.raises(rpa.Error, match=r"sinks.shape=\(3,\)"):
    rd.context_parallel_attention(b.q, b.kv_pages, shard, sinks=np.zeros(3, np.float32))
  with pytest.raises(rpa.Error, match="must be int32"):
    rd.split_pages(b.kv_lens.astype(np.int64), *args[1:], page_size=4, world_size=2)
  with pytest.raises(rpa.Error, match="pages_per_seq=1 must be greater or equal to"):
    rd.split_pages(b.kv_lens, b.page_indices[:, :1], b.cu_q_lens, b.num_seqs, page_size=4,
                   world_size=2)
  with pytest.raises(rpa.Error, match="layout='ring' must be"):
    rd.split_pages(*args, page_size=4, world_size=2, layout="ring")
  # The library's own checks run in each rank's calls.
  with pytest.raises(rpa.Error) as e:
    rd.context_parallel_attention(b.q, b.kv_pages[:1], shard)
  assert e.value.kind == "page_index"


def test_tensor_parallel_heads():
  assert rd.tensor_parallel_heads(32, 8, 1, 4) == (slice(8, 16), slice(2, 4))
  # More ranks than KV heads: each KV head on world / num_kv_heads ranks.
  assert [rd.tensor_parallel_heads(8, 2, r, 4) for r in range(4)] == [
      (slice(0, 2), slice(0, 1)), (slice(2, 4), slice(0, 1)),
      (slice(4, 6), slice(1, 2)), (slice(6, 8), slice(1, 2))]
  with pytest.raises(rpa.Error, match="world_size=3 must divide num_q_heads=8"):
    rd.tensor_parallel_heads(8, 2, 0, 3)


@pytest.mark.parametrize("kv_layout", [None, "NHD", "HND"])
def test_tensor_parallel_slice_equals_the_whole(rng, kv_layout):
  """Each rank's heads through the plain call are the matching heads of the
  whole call, for 1, 2, 4 and 8 ranks over 4 KV heads (8: replicated)."""
  b = make_batch(rng, [(1, 19), (5, 12), (3, 30)], num_q_heads=8, num_kv_heads=4, page_size=4)
  sinks = rng.standard_normal(8).astype(np.float32)
  kv = b.kv_pages if kv_layout is None else b.split(kv_layout)
  options = dict(sm_scale=0.25, sliding_window=5, soft_cap=6.0, kv_layout=kv_layout)
  whole = rpa.ragged_paged_attention(b.q, kv, *b.args[2:], sinks=sinks, **options)
  for world in (1, 2, 4, 8):
    for r in range(world):
      q_r, kv_r, sinks_r = rd.tensor_parallel_slice(b.q, kv, rank=r, world_size=world,
                                                    sinks=sinks, kv_layout=kv_layout)
      part = rpa.ragged_paged_attention(q_r, kv_r, *b.args[2:], sinks=sinks_r, **options)
      heads, _ = rd.tensor_parallel_heads(8, 4, r, world)
      assert max_abs_diff(part, whole[:, heads]) <= tolerance("float32"), (world, r)


def test_exchange_bytes_formula():
  # decode-long: 1 token, 32 q heads, head_dim 128, 2 ranks.
  assert rd.exchange_bytes(1, 32, 128, 2)["payload"] == 4 * (32 * 129 + 1)
  assert rd.exchange_bytes(1, 32, 128, 2)["sent"] == 4 * (32 * 129 + 1)
  assert rd.exchange_bytes(1, 32, 128, 1)["sent"] == 0
  assert rd.exchange_bytes(1, 32, 128, 4, "all_reduce")["sent"] < rd.exchange_bytes(
      1, 32, 128, 4)["sent"]


# ---------------------------------------------------------------------------
# Real ranks: processes over gloo on loopback.


def _run(world, scenario, tmp_path, deadline_s=90.0):
  t = time.monotonic()
  finished, results = distributed_workers.launch(world, scenario, tmp_path,
                                                 deadline_s=deadline_s)
  assert finished, f"{scenario} on {world} ranks did not finish in {deadline_s} s: {results}"
  for r, result in enumerate(results):
    assert result is not None, f"rank {r} wrote no result"
    assert "crash" not in result, f"rank {r}: {result['crash']}"
  return results, time.monotonic() - t


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_equal_the_single_process_call(tmp_path, world):
  """Decode, chunked prefill and mixed batches, with windows, sinks, soft
  caps and empty shards, float32 / bfloat16 / float16, both layouts, both
  exchanges: every rank's merged output within the dtype's tolerance of the
  single-process call; and each rank's head slice equals the whole's."""
  results, _ = _run(world, "correctness", tmp_path)
  for result in results:
    checks = result["checks"]
    assert len(checks) == len(distributed_workers._cases())
    for c in checks:
      assert c["same_kind"], c
      assert c["diff"] <= c["tol"], c
      assert c["lse_inf_same"], c
      assert c["lse_diff"] <= 1e-3, c
    if world > 1:
      assert any(c["empty_shard"] for c in checks)
    assert result["tp"]["diff"] <= tolerance("float32"), result["tp"]
    # Each rank plans once per step: the first of three layers plans its
    # calls, the others only run them.
    step = result["step"]
    assert step["plans_after"] == [step["calls"]] * 3, step
    assert max(step["diffs"]) <= tolerance("float32"), step
  assert sum(r["step"]["calls"] for r in results) >= world, "every rank has keys to plan"


def test_ranks_that_disagree_or_fail_all_raise(tmp_path):
  results, seconds = _run(2, "errors", tmp_path)
  r0, r1 = (r["seen"] for r in results)
  for seen in (r0, r1):
    for key, kind, text in (
        ("q_shape", "shape", "q.shape[0] (max_num_batched_tokens) must be the same on every "
         "rank of the context-parallel group; got rank 0: 10, rank 1: 9."),
        ("metadata", "metadata", "the batch's metadata"),
        ("options", "option", "the options (sm_scale, sliding_window"),
        ("exchange", "option", "exchange must be the same on every rank"),
        ("partition", "metadata", "do not hold every page of the batch exactly once")):
      assert seen[key] is not None, key
      assert seen[key]["type"] == "Error" and seen[key]["kind"] == kind, (key, seen[key])
      assert text in seen[key]["message"], (key, seen[key])
    assert seen["after_errors_diff"] <= tolerance("float32")
  assert r1["wrong_rank"]["kind"] == "metadata", r1["wrong_rank"]
  assert "shard.rank=0 of shard.world_size=2 must be this process's rank 1" in \
      r1["wrong_rank"]["message"]
  assert "failed on rank 1 of 2 while checking its inputs" in r0["wrong_rank"]["message"]
  assert "shard.rank=0" in r0["wrong_rank"]["message"]
  for key in ("local_all_gather_True", "local_all_reduce_True", "local_all_gather_False",
              "local_all_reduce_False"):
    # Rank 1's own error: the library's page_index check.
    assert r1[key]["kind"] == "page_index" and "page_indices[" in r1[key]["message"], r1[key]
    # Rank 0: an error that names rank 1 and quotes it, not a hang.
    assert r0[key]["type"] == "Error" and r0[key]["kind"] == "page_index", r0[key]
    assert "failed on rank 1 of 2" in r0[key]["message"], r0[key]
    assert "page_indices[" in r0[key]["message"], r0[key]
  # A rank that raised outside the call: the other's call ends with the
  # group's 2 s timeout.
  assert r1["raised"]["message"] == "app error"
  assert r0["timeout"] is not None and r0["timeout"]["type"] == "RuntimeError", r0["timeout"]
  assert 1.5 <= r0["timeout"]["seconds"] < 20, r0["timeout"]
