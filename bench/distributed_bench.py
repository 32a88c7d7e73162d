"""Context-parallel decode-long on 1 and 2 (or more) ranks: time per step,
bytes exchanged per step, and the exchange's time (docs/distributed.md).

  PYTHONPATH=build/python /usr/bin/python3 bench/distributed_bench.py            # 1 and 2 ranks
  PYTHONPATH=build/python /usr/bin/python3 bench/distributed_bench.py --ranks 1 2 4 --steps 50

decode-long is `rpa bench`'s workload: one sequence, q_len 1, 32768 keys,
32 q / 8 KV heads, head_dim 128, bfloat16, page_size 16. Each rank is a
process (torch.multiprocessing spawn) joined over gloo on 127.0.0.1, holding
its interleaved half (third, ...) of the pages; every rank times, after a
barrier, each of:

  single     rpa.ragged_paged_attention over all keys (the 1-process call)
  partial    its own keys only (the calls context_parallel_attention makes)
  exchange   the collective(s) alone, on a partial-sized payload
  cp         context_parallel_attention, whole (check + partial + exchange
             + merge), with check=True and with check=False

and reports, over the steps, the median and the minimum of the slowest
rank's time (a step ends when its last rank is done). The minimum is the
better estimate on a shared machine: other processes only ever add time. --tokens T also
times the exchange alone for T decode rows (T sequences in a batch), where
all-gather and all-reduce differ in bytes. A "step" here is one layer's
attention; a model step is num_layers of them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import numpy as np

KEYS, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 32768, 32, 8, 128, 16


def _step_times(samples_per_rank):
  """Each step's time is its slowest rank's (the ranks start each step
  together, after a barrier): (median, min) over steps, in ms."""
  slowest = [max(step) for step in zip(*samples_per_rank)]
  return statistics.median(slowest) * 1e3, min(slowest) * 1e3


def _timed(fn, steps, barrier):
  samples = []
  for _ in range(steps):
    barrier()
    t = time.perf_counter()
    fn()
    samples.append(time.perf_counter() - t)
  return samples


def _rank(rank, world, port, args, outdir):
  import torch
  import torch.distributed as dist

  import rpa
  import rpa.distributed as rd

  torch.set_num_threads(1)
  dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                          world_size=world, timeout=datetime.timedelta(seconds=120))
  g = torch.Generator().manual_seed(0)
  pages = KEYS // PAGE_SIZE
  kv = torch.randn(pages, PAGE_SIZE, 2 * KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
  q = torch.randn(1, Q_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
  kv_lens = np.array([KEYS], np.int32)
  page_indices = np.arange(pages, dtype=np.int32)[None]
  cu_q_lens = np.array([0, 1], np.int32)
  num_seqs = np.array([1], np.int32)
  shard = rd.split_pages(kv_lens, page_indices, cu_q_lens, num_seqs, page_size=PAGE_SIZE,
                         world_size=world)[rank]
  options = dict(sm_scale=HEAD_DIM ** -0.5, num_threads=args.threads)
  barrier = dist.barrier
  result = {}

  def single():
    rpa.ragged_paged_attention(q, kv, kv_lens, page_indices, cu_q_lens, num_seqs, **options)

  calls = rd._local_calls(shard, None)

  def partial():
    rd._partial(q, kv, calls, **options)

  variants = {"single": single, "partial": partial}
  want = rpa.ragged_paged_attention(q, kv, kv_lens, page_indices, cu_q_lens, num_seqs, **options)
  for exchange in ("all_gather", "all_reduce"):
    for check in (True, False):
      def cp(exchange=exchange, check=check):
        return rd.context_parallel_attention(q, kv, shard, exchange=exchange, check=check,
                                             **options)
      got = cp()
      result[f"error_{exchange}"] = float((got.float() - want.float()).abs().max())
      variants[f"cp_{exchange}_check{int(check)}"] = cp
    for tokens in sorted(set([1] + args.tokens)):
      out = torch.randn(tokens, Q_HEADS, HEAD_DIM)
      lse = torch.randn(tokens, Q_HEADS)

      def exchange_only(exchange=exchange, out=out, lse=lse, tokens=tokens):
        if exchange == "all_gather":
          payload = torch.cat([out.reshape(-1), lse.reshape(-1), torch.zeros(1)])
          parts = [torch.empty_like(payload) for _ in range(world)]
          dist.all_gather(parts, payload)
          rd._merge_gathered(parts, tokens, Q_HEADS, HEAD_DIM)
        else:
          rd._merge_reduced(dist, None, out, lse, 0)
      variants[f"exchange_{exchange}_t{tokens}"] = exchange_only
  descriptor = torch.zeros(len(rd._FIELDS), dtype=torch.int64)
  parts = [torch.empty_like(descriptor) for _ in range(world)]
  variants["check_only"] = lambda: dist.all_gather(parts, descriptor)
  # Round robin: every step times each variant once, so that a noisy moment
  # (other processes on the machine) lands on all of them alike.
  for fn in variants.values():
    fn()
  samples = {name: [] for name in variants}
  for _ in range(args.steps):
    for name, fn in variants.items():
      samples[name] += _timed(fn, 1, barrier)
  result.update(samples)
  with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
  dist.barrier()
  dist.destroy_process_group()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--threads", type=int, default=1, help="rpa worker threads per rank")
  parser.add_argument("--tokens", type=int, nargs="*", default=[16, 256],
                      help="decode rows for the exchange-only timings")
  parser.add_argument("--json", help="write the report here too")
  args = parser.parse_args()

  import torch.multiprocessing as mp

  import rpa.distributed as rd

  report = {"workload": "decode-long", "keys": KEYS, "q_heads": Q_HEADS, "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "page_size": PAGE_SIZE, "dtype": "bfloat16",
            "threads_per_rank": args.threads, "steps": args.steps, "cpus": os.cpu_count(),
            "runs": []}
  for world in args.ranks:
    with tempfile.TemporaryDirectory() as outdir:
      with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
      mp.start_processes(_rank, args=(world, port, args, outdir), nprocs=world,
                         start_method="spawn")
      ranks = [json.load(open(os.path.join(outdir, f"rank{r}.json"))) for r in range(world)]
    run = {"ranks": world}
    for key in ranks[0]:
      if key.startswith("error_"):
        run[key] = max(r[key] for r in ranks)
      else:
        median, best = _step_times([r[key] for r in ranks])
        run[key + "_ms"] = round(median, 4)
        run[key + "_min_ms"] = round(best, 4)
    for tokens in sorted(set([1] + args.tokens)):
      for exchange in ("all_gather", "all_reduce"):
        b = rd.exchange_bytes(tokens, Q_HEADS, HEAD_DIM, world, exchange)
        run[f"bytes_{exchange}_t{tokens}"] = b
    report["runs"].append(run)
    print(f"ranks={world}: single {run['single_ms']:.3f} ms, partial {run['partial_ms']:.3f} ms, "
          f"cp all_gather {run['cp_all_gather_check1_ms']:.3f} ms "
          f"(unchecked {run['cp_all_gather_check0_ms']:.3f}), cp all_reduce "
          f"{run['cp_all_reduce_check1_ms']:.3f} ms (unchecked "
          f"{run['cp_all_reduce_check0_ms']:.3f}), check {run['check_only_ms']:.3f} ms; "
          f"exchange t1 all_gather {run['exchange_all_gather_t1_ms']:.3f} ms / all_reduce "
          f"{run['exchange_all_reduce_t1_ms']:.3f} ms, payload "
          f"{run['bytes_all_gather_t1']['payload']} B, sent/rank all_gather "
          f"{run['bytes_all_gather_t1']['sent']} B", flush=True)
  text = json.dumps(report, indent=1)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
