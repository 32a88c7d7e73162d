"""Shared-prefix (cascade) decode against the same step over flat page
tables (docs/contract.md §1.6, docs/kernel_log.md).

  PYTHONPATH=build/python /usr/bin/python3 bench/cascade_bench.py [--steps 30] [--threads N]

The step: 32 decode requests sharing a 2048-token prefix, 128 own tokens
each; 32 q / 8 KV heads, head_dim 128, bfloat16, page_size 16, NHD caches.
cascade is rpa.CascadeAttention(2): level 0 one entry of all 32 rows over
the prefix pages, level 1 each request's own pages, merged by LSE; flat is
one rpa.BatchAttention over the equivalent flat tables (the prefix pages
listed in every request). Both planned once, timed per run in one process;
reported: median and minimum ms and speedup_vs_flat (flat / cascade). The
outputs are compared once.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import rpa
from step_timing import timed

REQUESTS, PREFIX, OWN, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 2048, 128, 32, 8, 128, 16


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--threads", type=int, default=None)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  prefix_pages, own_pages = PREFIX // PAGE_SIZE, OWN // PAGE_SIZE
  num_pages = prefix_pages + REQUESTS * own_pages
  k = torch.randn(num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM).to(torch.bfloat16)
  v = torch.randn(num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM).to(torch.bfloat16)
  q = torch.randn(REQUESTS, Q_HEADS, HEAD_DIM).to(torch.bfloat16)
  pages = rng.permutation(num_pages).astype(np.int32)
  prefix = pages[:prefix_pages]
  own = pages[prefix_pages:].reshape(REQUESTS, own_pages)
  rows = np.arange(REQUESTS + 1, dtype=np.int32)
  full = np.full(REQUESTS, PAGE_SIZE, np.int32)
  flat = (rows, rows * (prefix_pages + own_pages),
          np.concatenate([np.concatenate([prefix, own[i]]) for i in range(REQUESTS)]), full)
  shared = (np.array([0, REQUESTS], np.int32), np.array([0, prefix_pages], np.int32), prefix,
            np.array([PAGE_SIZE], np.int32))
  unique = (rows, rows * own_pages, own.reshape(-1), full)
  shape = dict(num_q_heads=Q_HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
               page_size=PAGE_SIZE, num_pages=num_pages, q_dtype="bfloat16")

  w_flat = rpa.BatchAttention(kv_layout="NHD", num_threads=args.threads)
  w_flat.plan_csr(*flat, **shape)
  w = rpa.CascadeAttention(2, kv_layout="NHD", num_threads=args.threads)
  w.plan(*(list(t) for t in zip(shared, unique)), **shape)
  error = float((w.run(q, (k, v)).float() - w_flat.run(q, (k, v)).float()).abs().max())
  assert error <= 2e-2, error

  flat_ms = timed(lambda: w_flat.run(q, (k, v)), args.steps)
  cascade_ms = timed(lambda: w.run(q, (k, v)), args.steps)
  print(f"cascade {REQUESTS} decode requests x ({PREFIX} shared + {OWN} own) keys, "
        f"{Q_HEADS}/{KV_HEADS} heads, d {HEAD_DIM}, bf16, threads "
        f"{w_flat.info['num_threads']} (max abs difference {error:.1e})")
  print(f"  flat     median {flat_ms[0]:.2f} ms  min {flat_ms[1]:.2f} ms")
  print(f"  cascade  median {cascade_ms[0]:.2f} ms  min {cascade_ms[1]:.2f} ms")
  print(f"  speedup_vs_flat: median {flat_ms[0] / cascade_ms[0]:.2f}  "
        f"min {flat_ms[1] / cascade_ms[1]:.2f}")


if __name__ == "__main__":
  main()
