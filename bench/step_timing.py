"""The step timing the Python benchmarks share: one warm call, then `steps`
timed calls; (median, min) in ms."""

import statistics
import time


def timed(fn, steps):
  fn()  # Warm: plans, pools and caches.
  samples = []
  for _ in range(steps):
    t = time.perf_counter()
    fn()
    samples.append(time.perf_counter() - t)
  return statistics.median(samples) * 1e3, min(samples) * 1e3
