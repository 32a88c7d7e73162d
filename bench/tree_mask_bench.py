"""Speculative verification under a tree mask against the same step causal
(docs/contract.md §1.6, docs/kernel_log.md).

  PYTHONPATH=build/python /usr/bin/python3 bench/tree_mask_bench.py
  PYTHONPATH=build/python /usr/bin/python3 bench/tree_mask_bench.py --steps 50 --threads 4

The step: 16 sequences, each verifying a 16-token draft tree (q_len 16) on
top of its history, 1024 keys in all (the tree's 16 included); 32 q / 8 KV
heads, head_dim 128, bfloat16, page_size 16, NHD caches. The tree: each
draft token's parent is a random earlier one (token 0's is the last
history token), so a row keeps the history, its ancestors and itself.
Both calls are rpa.BatchAttention plans, timed per run; the report is the
median and the minimum over the steps (the minimum is the better estimate
on a shared machine) and tree / causal. The tree-masked output is checked
against the reference once.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import rpa
from step_timing import timed

SEQS, TREE, KEYS, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 16, 16, 1024, 32, 8, 128, 16


def tree_mask(rng):
  """[SEQS * TREE * KEYS] bool: each sequence's TREE x KEYS block."""
  blocks = []
  history = KEYS - TREE
  for _ in range(SEQS):
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, TREE)]
    block = np.zeros((TREE, KEYS), bool)
    block[:, :history] = True
    for i in range(TREE):
      node = i
      while node >= 0:
        block[i, history + node] = True
        node = parent[node]
    blocks.append(block.reshape(-1))
  return np.concatenate(blocks)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--threads", type=int, default=None)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  pages_per_seq = KEYS // PAGE_SIZE
  num_pages = SEQS * pages_per_seq
  k = torch.randn(num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM).to(torch.bfloat16)
  v = torch.randn(num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM).to(torch.bfloat16)
  q = torch.randn(SEQS * TREE, Q_HEADS, HEAD_DIM).to(torch.bfloat16)
  page_indices = rng.permutation(num_pages).astype(np.int32).reshape(SEQS, pages_per_seq)
  kv_lens = np.full(SEQS, KEYS, np.int32)
  cu_q_lens = np.arange(SEQS + 1, dtype=np.int32) * TREE
  num_seqs = np.array([SEQS], np.int32)
  table = (kv_lens, page_indices, cu_q_lens, num_seqs)
  shape = dict(num_q_heads=Q_HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
               page_size=PAGE_SIZE, num_pages=num_pages, q_dtype="bfloat16")
  mask = tree_mask(rng)

  causal = rpa.BatchAttention(kv_layout="NHD", num_threads=args.threads)
  causal.plan(*table, **shape)
  tree = rpa.BatchAttention(kv_layout="NHD", num_threads=args.threads)
  tree.plan(*table, custom_mask=mask, **shape)

  got = tree.run(q, (k, v)).float()
  want = rpa.ref_ragged_paged_attention(q, (k, v), *table, sm_scale=HEAD_DIM ** -0.5,
                                        custom_mask=torch.from_numpy(mask),
                                        kv_layout="NHD").float()
  error = float((got - want).abs().max())
  assert error <= 2e-2, error

  causal_ms = timed(lambda: causal.run(q, (k, v)), args.steps)
  tree_ms = timed(lambda: tree.run(q, (k, v)), args.steps)
  print(f"tree-verify {SEQS} seqs x {TREE}-token tree over {KEYS} keys, "
        f"{Q_HEADS}/{KV_HEADS} heads, d {HEAD_DIM}, bf16, threads "
        f"{tree.info['num_threads']} (max abs error vs reference {error:.1e})")
  print(f"  causal  median {causal_ms[0]:.2f} ms  min {causal_ms[1]:.2f} ms")
  print(f"  tree    median {tree_ms[0]:.2f} ms  min {tree_ms[1]:.2f} ms")
  print(f"  tree / causal: median {tree_ms[0] / causal_ms[0]:.2f}  "
        f"min {tree_ms[1] / causal_ms[1]:.2f}")


if __name__ == "__main__":
  main()
