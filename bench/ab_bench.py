#!/usr/bin/python3
"""`rpa bench --json` of a baseline commit and of this tree, alternated.

The machines rpa is measured on are shared and noisy: absolute times move
10-50% between hours, so a change is judged against a baseline binary run
in the same minutes, the two alternated, several rounds (docs/kernel_log.md
does this by hand in every session). This script does the bookkeeping:

  /usr/bin/python3 bench/ab_bench.py e53ae61 --rounds 3 -- --quick --only decode verify

builds the baseline's `rpa` in a git worktree (kept under --work, reused on
the next run; `git worktree remove --force` it when done), builds this tree's `rpa` (build/, Release), then runs
`rpa bench --json ARGS` for base, new, base, new, ... and prints, per
workload and thread count, each side's minimum and median ms, the ratio of
the medians (new / base: below 1 is faster) and the median fraction of the
machine's limit. --json FILE also writes every round's JSON. Benchmark
alone: a compile beside it spoils both sides.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kwargs):
  return subprocess.run(cmd, check=True, **kwargs)


def build_rpa(source, build_dir):
  """Configures (once) and builds the `rpa` command of a source tree."""
  if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
    run(["cmake", "-S", source, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
         "-DPython3_EXECUTABLE=/usr/bin/python3"], stdout=subprocess.DEVNULL)
  run(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 1), "--target", "rpa_cli"],
      stdout=subprocess.DEVNULL)
  return os.path.join(build_dir, "rpa")


def baseline_rpa(rev, work):
  """The baseline's `rpa`, built in a worktree of rev under work."""
  sha = run(["git", "-C", REPO, "rev-parse", "--short=12", rev + "^{commit}"],
            capture_output=True, text=True).stdout.strip()
  tree = os.path.join(work, "rpa-ab-" + sha)
  if not os.path.isdir(tree):
    run(["git", "-C", REPO, "worktree", "add", "--detach", "-f", tree, sha],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return sha, tree, build_rpa(tree, os.path.join(tree, "build"))


def bench(binary, args):
  out = run([binary, "bench", "--json", *args], capture_output=True, text=True).stdout
  return json.loads(out)


def summarize(rounds):
  """{(workload, threads): [ms, ...]} and the fractions, from the rounds' JSON;
  with --hot, each workload's hot run is a row of its own ("decode hot")."""
  ms, frac = {}, {}
  for result in rounds:
    for w in result["workloads"]:
      key = (w["name"], w["threads"])
      ms.setdefault(key, []).append(w["ms"])
      if w.get("frac_of_limit") is not None:
        frac.setdefault(key, []).append(w["frac_of_limit"])
      if w.get("hot_ms") is not None:
        ms.setdefault((w["name"] + " hot", w["threads"]), []).append(w["hot_ms"])
  return ms, frac


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   usage="%(prog)s BASE [options] [-- rpa bench args]")
  parser.add_argument("base", help="the baseline commit (any git revision)")
  parser.add_argument("--rounds", type=int, default=3, help="runs of each side, alternated")
  parser.add_argument("--work", default=tempfile.gettempdir(),
                      help="where the baseline's worktree and build live")
  parser.add_argument("--build", default=os.path.join(REPO, "build"),
                      help="this tree's build folder")
  parser.add_argument("--json", help="write every round's JSON here")
  argv = sys.argv[1:]
  split = argv.index("--") if "--" in argv else len(argv)
  a = parser.parse_args(argv[:split])
  a.bench_args = argv[split + 1:]  # After --: arguments for `rpa bench`.

  sha, tree, base = baseline_rpa(a.base, a.work)
  new = build_rpa(REPO, a.build)
  results = {"base": [], "new": []}
  for i in range(a.rounds):
    for side, binary in (("base", base), ("new", new)):
      print(f"round {i + 1}/{a.rounds}: {side}", file=sys.stderr, flush=True)
      results[side].append(bench(binary, a.bench_args))

  cpu = results["new"][0].get("machine", {}).get("cpu", {})
  read = [r.get("machine", {}).get("read_gbs_1_thread", float("nan"))
          for side in results.values() for r in side]
  print(f"base {sha} against this tree, {a.rounds} rounds alternated; machine: "
        f"{cpu.get('model_name', '?')} ({cpu.get('vendor', '?')} family {cpu.get('family', '?')}"
        f" model {cpu.get('model', '?')}, {cpu.get('features', '?')}); read probe "
        f"{min(read):.1f}-{max(read):.1f} GB/s on 1 thread")
  base_ms, base_frac = summarize(results["base"])
  new_ms, new_frac = summarize(results["new"])
  print(f"{'workload':<16}{'thr':>4}{'base min/med ms':>20}{'new min/med ms':>20}"
        f"{'new/base':>10}{'frac base/new':>16}")
  for key in new_ms:
    if key not in base_ms:
      print(f"{key[0]:<16}{key[1]:>4}{'(not in base)':>20}"
            f"{min(new_ms[key]):>10.3f}/{statistics.median(new_ms[key]):<9.3f}")
      continue
    b, n = base_ms[key], new_ms[key]
    ratio = statistics.median(n) / statistics.median(b)
    fractions = ""
    if key in base_frac and key in new_frac:
      fb, fn = statistics.median(base_frac[key]), statistics.median(new_frac[key])
      fractions = f"{fb:>8.3f}/{fn:<7.3f}"
    print(f"{key[0]:<16}{key[1]:>4}{min(b):>10.3f}/{statistics.median(b):<9.3f}"
          f"{min(n):>10.3f}/{statistics.median(n):<9.3f}{ratio:>10.3f}{fractions}")
  if a.json:
    with open(a.json, "w") as f:
      json.dump({"base": sha, **results}, f, indent=1)
  print(f"(the baseline's worktree stays for the next run: `git worktree remove --force {tree}`)")


if __name__ == "__main__":
  main()
