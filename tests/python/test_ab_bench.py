"""bench/ab_bench.py's summary of `rpa bench --json` rounds (no build, no run)."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "bench", "ab_bench.py")


def _ab_bench():
  spec = importlib.util.spec_from_file_location("ab_bench", _PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _round(decode_ms, hot_ms, frac):
  return {"workloads": [
      {"name": "decode", "threads": 1, "ms": decode_ms, "frac_of_limit": frac, "hot_ms": hot_ms},
      {"name": "decode", "threads": 2, "ms": decode_ms / 2, "frac_of_limit": None},
  ]}


def test_summary_keeps_each_round_per_workload_and_thread_count():
  ms, frac = _ab_bench().summarize([_round(4.0, 2.0, 0.5), _round(3.0, 2.5, 0.6)])
  assert ms[("decode", 1)] == [4.0, 3.0]
  assert ms[("decode", 2)] == [2.0, 1.5]
  assert frac[("decode", 1)] == [0.5, 0.6]
  assert ("decode", 2) not in frac  # No fraction reported: none summarized.


def test_hot_runs_are_rows_of_their_own():
  ms, frac = _ab_bench().summarize([_round(4.0, 2.0, 0.5)])
  assert ms[("decode hot", 1)] == [2.0]
  assert ("decode hot", 2) not in ms  # No hot_ms in that row.
  assert ("decode hot", 1) not in frac
