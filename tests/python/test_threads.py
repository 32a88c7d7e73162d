"""RPA_CPU_BIND: pinning rpa's workers from the environment (docs/python.md,
"Threads"). The variable is read at a process's first call, so each case runs
in a fresh interpreter."""

import json
import os
import subprocess
import sys

# Runs one call with out= prefilled; prints the error (or none), the output and
# the CPUs each of the process's threads may run on afterwards (rpa's workers
# stay alive between calls).
_CALL = """
import glob, json, sys
import numpy as np
import rpa
from rpa_testing import make_batch
b = make_batch(np.random.default_rng(7), [(1, 40), (5, 12), (9, 9)], num_q_heads=8,
               num_kv_heads=2, head_dim=32)
out = np.full_like(b.q, 7.0)
threads = json.loads(sys.argv[1])
try:
  rpa.ragged_paged_attention(*b.args, sm_scale=0.25, num_threads=threads, out=out)
  error = None
except rpa.Error as e:
  error = [e.kind, str(e)]
masks = []
for status in glob.glob("/proc/self/task/*/status"):
  with open(status) as f:
    masks += [line.split()[1] for line in f if line.startswith("Cpus_allowed_list:")]
print(json.dumps({"error": error, "out": out.tobytes().hex(),
                  "untouched": bool(np.all(out == 7.0)), "masks": sorted(masks)}))
"""


def _run(bind, threads=None):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
  env.pop("RPA_CPU_BIND", None)
  env.pop("RPA_NUM_THREADS", None)
  if bind is not None:
    env["RPA_CPU_BIND"] = bind
  result = subprocess.run([sys.executable, "-c", _CALL, json.dumps(threads)],
                          capture_output=True, text=True, env=env, check=True)
  return json.loads(result.stdout)


def test_invalid_list_fails_the_first_call_and_writes_nothing():
  result = _run("0,x")
  assert result["error"] == [
      "option",
      "RPA_CPU_BIND='0,x' is not a CPU list: 'x' is not a CPU number (0 to 65535) or a range "
      "a-b. Write CPU numbers and ranges a-b separated by commas, as taskset -c does, e.g. "
      "0,2-3; worker i runs on the i-th CPU listed"]
  assert result["untouched"]


def test_cpu_outside_the_affinity_mask():
  allowed = sorted(os.sched_getaffinity(0))
  outside = allowed[-1] + 1
  result = _run(f"{allowed[0]},{outside}")
  assert result["error"][0] == "option"
  assert result["error"][1].startswith(
      f"RPA_CPU_BIND='{allowed[0]},{outside}': CPU {outside} is not in this process's affinity "
      "mask (CPUs ")
  assert result["untouched"]


def test_bound_workers_give_the_unbound_results():
  """Pinning moves threads, never changes a result: for a fixed thread count
  the bits are the same, bound or not."""
  allowed = sorted(os.sched_getaffinity(0))
  for threads in range(1, min(len(allowed), 2) + 1):
    bind = ",".join(str(cpu) for cpu in allowed[:threads])
    bound, unbound = _run(bind, threads), _run(None, threads)
    assert bound["error"] is None and unbound["error"] is None
    assert not bound["untouched"]
    assert bound["out"] == unbound["out"]
    if threads > 1:  # Worker 1 runs on the second CPU listed alone (worker 0 is the caller).
      assert str(allowed[1]) in bound["masks"] and str(allowed[1]) not in unbound["masks"]
  # With a binding and no num_threads, the call uses one thread per CPU bound.
  assert _run(str(allowed[0]))["out"] == _run(None, 1)["out"]


def test_empty_variable_means_unbound():
  """No error, the unbound result, and every thread keeps the mask it had."""
  allowed = sorted(os.sched_getaffinity(0))
  threads = min(len(allowed), 2)
  empty, unbound = _run("", threads), _run(None, threads)
  assert empty["error"] is None and not empty["untouched"]
  assert empty["out"] == unbound["out"]
  assert empty["masks"] == unbound["masks"]


# rpa.set_cpu_binding, in a fresh interpreter: the pool is process-wide.
_BIND = """
import json, sys
import numpy as np
import rpa
from rpa_testing import make_batch
allowed = json.loads(sys.argv[1])
b = make_batch(np.random.default_rng(7), [(1, 40), (5, 12), (9, 9)], num_q_heads=8,
               num_kv_heads=2, head_dim=32)
result = {"default_before": rpa.default_num_threads(), "unpinned": rpa.describe_threads()}
try:
  rpa.set_cpu_binding([allowed[0], allowed[-1] + 1])
except rpa.Error as e:
  result["outside"] = [e.kind, str(e)]
try:
  rpa.set_cpu_binding([allowed[0], allowed[0]])
except rpa.Error as e:
  result["twice"] = [e.kind, str(e)]
result["default_after_errors"] = rpa.default_num_threads()
rpa.set_cpu_binding(allowed[:1])
result["default_bound_to_one"] = rpa.default_num_threads()
result["pinned"] = rpa.describe_threads()
out = np.empty_like(b.q)
rpa.ragged_paged_attention(*b.args, sm_scale=0.25, out=out)
result["out"] = out.tobytes().hex()
rpa.ragged_paged_attention(*b.args, sm_scale=0.25, out=out, num_threads=1)
result["one_thread"] = out.tobytes().hex()
print(json.dumps(result))
"""


def test_set_cpu_binding():
  allowed = sorted(os.sched_getaffinity(0))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
  env.pop("RPA_CPU_BIND", None)
  env.pop("RPA_NUM_THREADS", None)
  r = json.loads(subprocess.run([sys.executable, "-c", _BIND, json.dumps(allowed)],
                                capture_output=True, text=True, env=env, check=True).stdout)
  assert r["default_before"] == len(allowed)
  assert r["outside"][0] == "option"
  assert f"CPU {allowed[-1] + 1} is not in this process's affinity mask" in r["outside"][1]
  assert r["twice"][0] == "option" and "twice" in r["twice"][1]
  # Rejected bindings change nothing; a binding of one CPU caps the default at one.
  assert r["default_after_errors"] == len(allowed)
  assert r["default_bound_to_one"] == 1
  assert r["unpinned"].endswith("workers unpinned"), r["unpinned"]
  assert r["pinned"].endswith(f"workers pinned to CPUs {allowed[0]}"), r["pinned"]
  assert r["out"] == r["one_thread"]
