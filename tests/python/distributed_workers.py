"""The processes of tests/python/test_distributed.py: one per rank, started by
torch.multiprocessing (spawn), joined over gloo on 127.0.0.1 only. Each rank
writes what it saw to <outdir>/rank<r>.json and leaves with os._exit, so a
broken process group can never hold a process at exit. The parent joins them
with a deadline and kills what is left."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
import traceback

import numpy as np

LOOPBACK = "127.0.0.1"


def free_port():
  with socket.socket() as s:
    s.bind((LOOPBACK, 0))
    return s.getsockname()[1]


def launch(world_size, scenario, outdir, *, deadline_s=90.0):
  """Runs `scenario` on world_size processes; returns their results (one dict
  per rank, or None for a rank that wrote nothing), killing every process
  still running after deadline_s."""
  import torch.multiprocessing as mp

  port = free_port()
  context = mp.start_processes(_worker, args=(world_size, port, scenario, str(outdir)),
                               nprocs=world_size, join=False, start_method="spawn")
  deadline = time.monotonic() + deadline_s
  finished = False
  try:
    while time.monotonic() < deadline:
      if context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
        finished = True
        break
  finally:
    if not finished:
      for p in context.processes:
        if p.is_alive():
          p.kill()
      for p in context.processes:
        p.join(5)
  results = []
  for r in range(world_size):
    path = os.path.join(str(outdir), f"rank{r}.json")
    results.append(json.load(open(path)) if os.path.exists(path) else None)
  return finished, results


def _worker(rank, world_size, port, scenario, outdir):
  result = {"rank": rank}
  try:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{LOOPBACK}:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    result.update(SCENARIOS[scenario](rank, world_size, outdir))
  except BaseException as e:  # noqa: BLE001 - reported to the parent.
    result["crash"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
  with open(os.path.join(outdir, f"rank{rank}.json.tmp"), "w") as f:
    json.dump(result, f)
  os.replace(os.path.join(outdir, f"rank{rank}.json.tmp"),
             os.path.join(outdir, f"rank{rank}.json"))
  os._exit(0)


# ---------------------------------------------------------------------------
# The batches: small, deterministic (every rank builds the same one).

CASES = [
    # name, (q_len, kv_len) per sequence, page_size
    ("decode", [(1, 1), (1, 3), (1, 9), (1, 17), (1, 40), (1, 4)], 4),
    ("chunked_prefill", [(5, 23), (7, 30), (3, 3)], 4),
    ("mixed", [(1, 37), (6, 21), (0, 0), (11, 11), (1, 2), (0, 9), (4, 13)], 4),
    ("decode_page3", [(1, 2), (1, 31), (1, 12)], 3),
]


def _cases():
  """(name, seqs, page_size, window, sinks, soft_cap, dtype, layout, exchange,
  kv_layout) for each check a rank makes: every case with and without a
  window (cutting inside pages), sinks and a soft cap, over both layouts,
  both exchanges and three dtypes."""
  dtypes = ("float32", "bfloat16", "float16")
  out = []
  k = 0
  for name, seqs, ps in CASES:
    for window in (None, 3, 6):
      for sinks in (False, True):
        dtype = dtypes[k % 3]
        out.append((name, seqs, ps, window, sinks, 4.0 if k % 4 == 3 else None, dtype,
                    ("interleaved", "contiguous")[k % 2],
                    ("all_gather", "all_reduce")[(k // 2) % 2],
                    "NHD" if k % 5 == 4 else None))
        k += 1
  return out


def _batch(seqs, page_size, dtype, seed, kv_layout=None):
  import torch

  from rpa_testing import make_batch, to_torch

  rng = np.random.default_rng(seed)
  b = make_batch(rng, seqs, num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=page_size)
  sinks = rng.standard_normal(4).astype(np.float32)
  if dtype == "bfloat16":
    q, kv = to_torch(b.q, torch.bfloat16), to_torch(b.kv_pages, torch.bfloat16)
  elif dtype == "float16":
    q, kv = b.q.astype(np.float16), b.kv_pages.astype(np.float16)
  else:
    q, kv = b.q, b.kv_pages
  if kv_layout == "NHD":
    kv = (kv[:, :, 0::2], kv[:, :, 1::2])
  return b, q, kv, sinks


def correctness(rank, world_size, outdir):
  """Every case: the merged output (and lse) against the single-process call
  over all keys; and tensor parallelism's head slices."""
  import rpa
  import rpa.distributed as rd
  from rpa_testing import max_abs_diff, tolerance, to_numpy

  checks = []
  for c, (name, seqs, ps, window, use_sinks, soft_cap, dtype, layout, exchange,
          kv_layout) in enumerate(_cases()):
    b, q, kv, sinks = _batch(seqs, ps, dtype, seed=c, kv_layout=kv_layout)
    sinks = sinks if use_sinks else None
    options = dict(sm_scale=0.25, sliding_window=window, soft_cap=soft_cap, sinks=sinks,
                   kv_layout=kv_layout, num_threads=1)
    want, want_lse = rpa.ragged_paged_attention(q, kv, b.kv_lens, b.page_indices, b.cu_q_lens,
                                                b.num_seqs, return_lse=True, **options)
    shard = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs, page_size=ps,
                           world_size=world_size, layout=layout)[rank]
    got, got_lse = rd.context_parallel_attention(q, kv, shard, exchange=exchange,
                                                 return_lse=True, **options)
    want_lse, got_lse = to_numpy(want_lse), to_numpy(got_lse)
    finite = np.isfinite(want_lse)
    checks.append({
        "case": f"{name} w={window} sinks={use_sinks} cap={soft_cap} {dtype} {layout} "
                f"{exchange} kv_layout={kv_layout}",
        "empty_shard": bool(np.any(shard.kv_lens[:int(b.num_seqs[0])] == 0)),
        "same_kind": type(got).__name__ == type(q).__name__ and str(got.dtype) == str(q.dtype),
        "diff": max_abs_diff(got, want),
        "tol": tolerance(dtype, q_dtype=dtype),
        "lse_diff": float(np.max(np.abs(got_lse[finite] - want_lse[finite]), initial=0.0)),
        "lse_inf_same": bool(np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse))),
    })
  # Tensor parallelism: this rank's heads with the plain call equal the
  # matching heads of the whole (8 q heads on 4 KV heads; world 4 gives one KV
  # head per rank, and KV heads replicated when ranks outnumber them is
  # checked in-process).
  rng = np.random.default_rng(99)
  from rpa_testing import make_batch

  b = make_batch(rng, [(1, 19), (5, 12), (3, 30)], num_q_heads=8, num_kv_heads=4, head_dim=16,
                 page_size=4)
  sinks = rng.standard_normal(8).astype(np.float32)
  whole = rpa.ragged_paged_attention(*b.args, sm_scale=0.25, sliding_window=5, sinks=sinks,
                                     num_threads=1)
  q_r, kv_r, sinks_r = rd.tensor_parallel_slice(b.q, b.kv_pages, rank=rank,
                                                world_size=world_size, sinks=sinks)
  part = rpa.ragged_paged_attention(q_r, kv_r, *b.args[2:], sm_scale=0.25, sliding_window=5,
                                    sinks=sinks_r, num_threads=1)
  heads, _ = rd.tensor_parallel_heads(8, 4, rank, world_size)
  tp = {"diff": max_abs_diff(part, whole[:, heads]), "heads": [heads.start, heads.stop]}
  return {"checks": checks, "tp": tp, "step": _step(rank, world_size)}


def _step(rank, world_size):
  """One step of three layers (three caches, one shard): the rank's plans
  (rpa.BatchAttention.plan, counted) are built by the first layer only,
  and every layer's merged output is the single-process call's."""
  import rpa
  import rpa.distributed as rd
  from rpa_testing import max_abs_diff

  b, q, kv, _ = _batch(CASES[2][1], CASES[2][2], "float32", seed=5)
  shard = rd.split_pages(b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                         page_size=CASES[2][2], world_size=world_size)[rank]
  planned = []
  plan = rpa.BatchAttention.plan

  def counted(self, *args, **kwargs):
    planned.append(1)
    return plan(self, *args, **kwargs)

  rpa.BatchAttention.plan = counted
  try:
    plans_after, diffs = [], []
    for layer in range(3):
      kv_layer = kv * (1.0 + layer)
      want = rpa.ragged_paged_attention(q, kv_layer, *b.args[2:], sm_scale=0.25,
                                        sliding_window=6, num_threads=1)
      got = rd.context_parallel_attention(q, kv_layer, shard, sm_scale=0.25, sliding_window=6,
                                          num_threads=1)
      plans_after.append(len(planned))
      diffs.append(max_abs_diff(got, want))
  finally:
    rpa.BatchAttention.plan = plan
  return {"plans_after": plans_after, "calls": len(rd._local_calls(shard, 6)), "diffs": diffs}


def _expect_error(fn):
  """(type name, kind, message) of what fn raises; None if it returns."""
  t = time.monotonic()
  try:
    fn()
  except Exception as e:  # noqa: BLE001
    return {"type": type(e).__name__, "kind": getattr(e, "kind", None), "message": str(e),
            "seconds": time.monotonic() - t}
  return None


def errors(rank, world_size, outdir):
  """Inputs that disagree across ranks, and ranks that fail, on 2 ranks."""
  import torch.distributed as dist

  import rpa
  import rpa.distributed as rd

  seqs, ps = [(1, 9), (5, 14), (1, 30)], 4
  b, q, kv, sinks = _batch(seqs, ps, "float32", seed=7)
  args = (b.kv_lens, b.page_indices, b.cu_q_lens, b.num_seqs)
  shards = rd.split_pages(*args, page_size=ps, world_size=world_size)
  mine = shards[rank]
  seen = {}

  def cp(q=q, kv=kv, shard=mine, **kw):
    kw.setdefault("sm_scale", 0.25)
    kw.setdefault("num_threads", 1)
    return rd.context_parallel_attention(q, kv, shard, **kw)

  # q with another number of rows on rank 1.
  seen["q_shape"] = _expect_error(lambda: cp(q=q if rank == 0 else q[:-1]))
  # Metadata built from other kv_lens on rank 1.
  other = b.kv_lens.copy()
  other[0] -= 1
  bad_meta = rd.split_pages(other, *args[1:], page_size=ps, world_size=world_size)[rank]
  seen["metadata"] = _expect_error(lambda: cp(shard=mine if rank == 0 else bad_meta))
  # Another sliding window on rank 1.
  seen["options"] = _expect_error(lambda: cp(sliding_window=None if rank == 0 else 4))
  # Another exchange on rank 1.
  seen["exchange"] = _expect_error(
      lambda: cp(exchange="all_gather" if rank == 0 else "all_reduce"))
  # Shards that do not partition the pages (rank 1 split another way).
  contiguous = rd.split_pages(*args, page_size=ps, world_size=world_size,
                              layout="contiguous")[rank]
  seen["partition"] = _expect_error(lambda: cp(shard=mine if rank == 0 else contiguous))
  # Rank 1 passes rank 0's shard.
  seen["wrong_rank"] = _expect_error(lambda: cp(shard=shards[0]))
  # Rank 1's own input is invalid (its cache is too small for its page
  # indices): it raises the library's error, rank 0 one that names rank 1.
  small = kv[:1]
  for exchange, check in (("all_gather", True), ("all_reduce", True), ("all_gather", False),
                          ("all_reduce", False)):
    seen[f"local_{exchange}_{check}"] = _expect_error(
        lambda: cp(kv=kv if rank == 0 else small, exchange=exchange, check=check))
  # The group still works.
  want = rpa.ragged_paged_attention(q, kv, *args, sm_scale=0.25, num_threads=1)
  got = cp()
  seen["after_errors_diff"] = float(np.max(np.abs(got - want)))
  # A rank that raises outside the call (the application's error) and never
  # joins: the others end with the group's timeout, not a hang. On a group of
  # its own with a 2 s timeout.
  short = dist.new_group(timeout=__import__("datetime").timedelta(seconds=2))
  if rank == 1:
    seen["raised"] = _expect_error(lambda: (_ for _ in ()).throw(RuntimeError("app error")))
    # Stay alive (so the others see a silent peer, not a closed socket) until
    # rank 0 has finished or 20 s have passed.
    t = time.monotonic()
    while not os.path.exists(os.path.join(outdir, "rank0.json")) and time.monotonic() - t < 20:
      time.sleep(0.05)
  else:
    seen["timeout"] = _expect_error(lambda: cp(group=short))
  return {"seen": seen}


SCENARIOS = {"correctness": correctness, "errors": errors}
