"""`python -m rpa`: the build, a small mixed batch checked against the
reference, and what a bad block size looks like.

    PYTHONPATH=build/python /usr/bin/python3 -m rpa [--version]

Exits 1 when the fast path disagrees with the reference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _example(np, rpa) -> bool:
  """A decode, a chunked prefill and a full prefill in one call, GQA 4:1."""
  rng = np.random.default_rng(0)
  num_q_heads, num_kv_heads, head_dim, page_size = 8, 2, 64, 16
  q_lens = [1, 5, 12]  # decode, chunked prefill, full prefill.
  kv_lens = [37, 20, 12]
  max_num_seqs, pages_per_seq, total_num_pages = 4, 4, 16
  max_num_batched_tokens = 24  # 18 rows in use; the rest is padding.

  q = rng.standard_normal((max_num_batched_tokens, num_q_heads, head_dim), dtype=np.float32)
  kv_pages = rng.standard_normal(
      (total_num_pages, page_size, 2 * num_kv_heads, head_dim), dtype=np.float32)
  page_indices = rng.permutation(total_num_pages)[:max_num_seqs * pages_per_seq]
  page_indices = page_indices.reshape(max_num_seqs, pages_per_seq).astype(np.int32)
  kv_lens_arr = np.zeros(max_num_seqs, np.int32)
  kv_lens_arr[:3] = kv_lens
  cu_q_lens = np.zeros(max_num_seqs + 1, np.int32)
  cu_q_lens[1:4] = np.cumsum(q_lens)
  cu_q_lens[4:] = cu_q_lens[3]
  num_seqs = np.array([3], np.int32)
  args = (q, kv_pages, kv_lens_arr, page_indices, cu_q_lens, num_seqs)

  print(f"example: q_lens={q_lens} kv_lens={kv_lens} q{list(q.shape)} "
        f"kv_pages{list(kv_pages.shape)} page_size={page_size}")
  start = time.perf_counter()
  out = rpa.ragged_paged_attention(*args, sm_scale=head_dim**-0.5)
  elapsed = time.perf_counter() - start
  ref = rpa.ref_ragged_paged_attention(*args, sm_scale=head_dim**-0.5)
  err = float(np.max(np.abs(out - ref)))
  ok = err <= 1e-5
  print(f"  ragged_paged_attention: {elapsed * 1e3:.2f} ms, max |out - ref| = {err:.2e} "
        f"(tolerance 1e-5 for f32): {'ok' if ok else 'MISMATCH'}")
  print(f"  padding rows {int(cu_q_lens[3])}..{max_num_batched_tokens - 1} are zero: "
        f"{bool(np.all(out[cu_q_lens[3]:] == 0))}")

  try:
    rpa.ragged_paged_attention(*args, num_kv_pages_per_block=64)
  except ValueError as e:
    print(f"  num_kv_pages_per_block=64 with pages_per_seq={pages_per_seq} raises "
          f"{type(e).__name__} (kind={e.kind!r}):\n    {e}")
  return ok


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m rpa", description=__doc__.splitlines()[0])
  parser.add_argument("--version", action="store_true", help="print the version and exit")
  args = parser.parse_args(argv)

  import rpa

  if args.version:
    print(rpa.__version__)
    return 0
  print(f"rpa {rpa.__version__} ({os.path.dirname(rpa.__file__)})")
  for key, value in rpa.build_info.items():
    if key == "kernels":  # Several lines: the dispatch table rows this CPU gets.
      print("  kernels for bf16 q and K/V, " + value.rstrip().replace("\n", "\n    "))
    else:
      print(f"  {key}: {value}")
  print(f"  python: {sys.version.split()[0]} ({sys.executable})")
  try:
    import numpy as np
  except ImportError:
    print("numpy is not installed: no example.")
    return 0
  print(f"  numpy: {np.__version__}")
  try:
    import torch  # noqa: F401  (only reported)

    print(f"  torch: {torch.__version__}")
  except ImportError:
    print("  torch: not installed (torch tensors are accepted when it is)")
  return 0 if _example(np, rpa) else 1


if __name__ == "__main__":
  sys.exit(main())
