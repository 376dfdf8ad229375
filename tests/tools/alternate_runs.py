#!/usr/bin/env python3
"""Runs benchmark jobs in alternation and reports medians (docs/PERFORMANCE.md, "Against PyTorch").

  alternate_runs.py --rounds 3 --out runs.jsonl --job 'strata async=CMD' --job 'torch 1x1=CMD' ...
  alternate_runs.py --summarize runs.jsonl [--ratio 'strata async/torch 1x1' ...]

Each round runs every job once, in the order given, each command through `bash -c`: list strata
and PyTorch jobs interleaved, and slow drifts of the machine (other load, clock, heat) fall on
every job alike. Per run it records: the 1-minute load average just before the run, the
command's wall time and CPU time (user+sys of the command and every descendant it waited for, from
getrusage(RUSAGE_CHILDREN): all MPI ranks or DDP processes), and the last line of its standard
output that parses as a JSON object (strata's summary line, the PyTorch helpers' --json line).
A failed command is recorded with its status and ends nothing else.

The summary gives per job the median of examples_per_sec and of every run's figures, and the ratio
of medians for each --ratio pair. Benchmark helper; not a test.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def run(args):
    jobs = []
    for j in args.job:
        name, sep, cmd = j.partition("=")
        if not sep or not name or not cmd:
            raise SystemExit(f"alternate_runs.py: --job '{j}': expected NAME=COMMAND")
        jobs.append((name, cmd))
    with open(args.out, "a") as out:
        for rnd in range(1, args.rounds + 1):
            for name, cmd in jobs:
                load = os.getloadavg()[0]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                p = subprocess.run(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                wall = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                rec = {"job": name, "round": rnd, "load1_before": load, "load1_after": os.getloadavg()[0],
                       "status": p.returncode, "wall_s": wall, "cpu_s": cpu, "busy_cores_whole": cpu / wall,
                       "result": last_json(p.stdout), "cmd": cmd}
                if p.returncode != 0 or rec["result"] is None:
                    rec["stderr_tail"] = p.stderr[-2000:]
                out.write(json.dumps(rec) + "\n")
                out.flush()
                r = rec["result"] or {}
                print(f"round {rnd} {name}: status {p.returncode}, load {load:.2f}, "
                      f"{r.get('examples_per_sec', float('nan')):.0f} examples/s, wall {wall:.1f} s, "
                      f"cpu {cpu:.1f} s, acc {r.get('test_accuracy', '-')}, auc {r.get('auc', '-')}", flush=True)


def examples(result):
    return result.get("examples") or result["examples_per_sec"] * result["train_s"]


def summarize(args):
    rows = [json.loads(line) for line in open(args.summarize) if line.strip()]
    jobs = {}
    for r in rows:
        if r["status"] == 0 and r["result"]:
            jobs.setdefault(r["job"], []).append(r)
    med = {}
    for name, rs in jobs.items():
        eps = [r["result"]["examples_per_sec"] for r in rs]
        # Examples per CPU-second of the whole command (start-up and evaluation included), and the
        # training loop's own figure where the job reports it (the PyTorch helpers do).
        # strata's summary has no example count: examples/s times training seconds is it.
        whole = [examples(r["result"]) / r["cpu_s"] for r in rs]
        med[name] = statistics.median(eps)
        line = {"job": name, "runs": len(rs), "examples_per_sec": [round(e) for e in eps],
                "median": round(med[name]), "load1_before": [round(r["load1_before"], 2) for r in rs],
                "wall_s": [round(r["wall_s"], 1) for r in rs], "cpu_s": [round(r["cpu_s"], 1) for r in rs],
                "busy_cores_whole": round(statistics.median(r["busy_cores_whole"] for r in rs), 2)}
        for key in ("test_accuracy", "auc", "busy_cores", "examples_per_cpu_s", "minor_faults_per_step",
                    "train_s", "openblas_core"):
            vals = [r["result"][key] for r in rs if key in r["result"]]
            if vals:
                line[key] = vals if key == "openblas_core" else [round(v, 4) for v in vals]
        line["examples_per_cpu_s_whole"] = [round(w) for w in whole]
        print(json.dumps(line))
    for pair in args.ratio or []:
        a, _, b = pair.partition("/")
        if a in med and b in med:
            print(f"{a} / {b}: {med[a] / med[b]:.2f}x ({med[a]:.0f} / {med[b]:.0f})")
        else:
            print(f"{pair}: a job has no successful run", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", action="append", default=[], help="NAME=COMMAND (repeat; run in this order)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="JSON lines file to append the runs to")
    p.add_argument("--summarize", metavar="FILE", help="print medians of FILE's runs instead of running")
    p.add_argument("--ratio", action="append", help="A/B: the ratio of job A's median examples/s to B's")
    args = p.parse_args()
    if args.summarize:
        summarize(args)
    elif args.job and args.out and args.rounds >= 1:
        run(args)
    else:
        p.error("give --job ... --out FILE (and --rounds >= 1), or --summarize FILE")


if __name__ == "__main__":
    main()
