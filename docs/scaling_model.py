#!/usr/bin/env python3
"""The scaling model of docs/SCALING.md, as code: PS ranks needed, step time, throughput and
update staleness for W workers. Prints the document's tables (no arguments), or one workload's
table from your own numbers:

  python3 docs/scaling_model.py
  python3 docs/scaling_model.py --params 25.6e6 --step-ms 250 --nic-gbps 100 --optimizer adam

Every symbol is defined in docs/SCALING.md section 1; the equations are numbered as there.
"""
import argparse
import math

# Link utilisation we plan for (headroom for bursts: workers are not evenly spread in time) and
# the PS-core utilisation above which the inbox queue grows quickly (M/D/1: waiting time
# rho / (2 (1 - rho)) service times, i.e. 0.5 service times at rho = 0.5).
LINK_UTIL = 0.7
PS_UTIL = 0.5


def ps_needed(W, dense_bytes, sparse_bytes, elems, t_step, nic_Bps, ps_rate):
    """(2) PS links (nodes) for bandwidth and (3) PS ranks (cores) for optimizer work."""
    per_step = dense_bytes + sparse_bytes
    s_bw = math.ceil(W * per_step / (t_step * LINK_UTIL * nic_Bps))
    s_cpu = math.ceil(W * elems / (t_step * PS_UTIL * ps_rate)) if ps_rate else 0
    return s_bw, s_cpu


def ps_nodes(s_bw, s_cpu, cores_per_node):
    """(2') PS nodes: enough links for (2), enough cores for the PS ranks of (3)."""
    return max(s_bw, math.ceil(s_cpu / cores_per_node), 1)


def step_time(t_compute, t_input, n_ops, alpha, dense_bytes, sparse_bytes, worker_Bps):
    """(1): a worker step = input + pull + compute + push, each transfer at the worker's link."""
    per_dir = dense_bytes + sparse_bytes
    t_pull = n_ops * alpha + per_dir / worker_Bps
    t_push = n_ops * alpha + per_dir / worker_Bps
    return t_input + t_pull + t_compute + t_push, t_pull + t_push


def staleness(W, t_window, t_step):
    """(5): expected updates by other workers between a worker's pull and its push (async)."""
    return (W - 1) * t_window / t_step


def table(name, params, sparse_bytes, t_compute, t_input, n_ops, nic_gbps, ps_rate, batch, workers, cores, alpha=3e-6):
    # alpha: one RDMA operation between nodes (order of magnitude; on one host here 0.05-2 us)
    dense_bytes = 4.0 * params
    nic = nic_gbps / 8 * 1e9
    elems = params + sparse_bytes / 4.0
    print(f"\n### {name}\n")
    print(f"{params / 1e6:.2f} M dense parameters ({dense_bytes / 1e6:.1f} MB) + {sparse_bytes / 1e6:.2f} MB of "
          f"embedding rows per worker step; compute {t_compute * 1e3:g} ms at batch {batch}; "
          f"{nic_gbps:g} Gb/s links; PS optimizer rate {ps_rate / 1e6:.0f} M elements/s per PS rank; "
          f"{cores} PS ranks per PS node\n")
    print("| workers | PS links for bandwidth (2) | PS ranks for the optimizer (3) | PS nodes (2') | step (1) "
          "| comm share | examples/s (4) | mean update staleness, async (5) |")
    print("|---|---|---|---|---|---|---|---|")
    t_step, t_comm = step_time(t_compute, t_input, n_ops, alpha, dense_bytes, sparse_bytes, nic)
    for W in workers:
        s_bw, s_cpu = ps_needed(W, dense_bytes, sparse_bytes, elems, t_step, nic, ps_rate)
        nodes = ps_nodes(s_bw, s_cpu, cores)
        x = W * batch / t_step
        st = staleness(W, t_step - t_input, t_step)
        print(f"| {W} | {s_bw} | {s_cpu} | {nodes} | {t_step * 1e3:.2f} ms | {100 * t_comm / t_step:.1f}% "
              f"| {x:,.0f} | {st:,.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, help="dense f32 parameters pulled and pushed per step")
    ap.add_argument("--sparse-mb", type=float, default=0.0, help="embedding rows moved per step, MB")
    ap.add_argument("--step-ms", type=float, help="compute (forward + backward) per worker step, ms")
    ap.add_argument("--input-ms", type=float, default=0.0, help="input pipeline time per step, ms")
    ap.add_argument("--ops", type=int, default=10, help="variable shards per step (RDMA operations)")
    ap.add_argument("--alpha-us", type=float, default=3.0, help="fixed cost of one remote operation, us")
    ap.add_argument("--nic-gbps", type=float, default=100.0, help="link speed of every rank, Gb/s")
    ap.add_argument("--optimizer", default="adam", help="sgd (MPI accumulate: no PS work) or a stateful one")
    ap.add_argument("--ps-cores", type=int, default=32, help="PS ranks (one per core) a PS node runs")
    ap.add_argument("--ps-rate", type=float, default=3.1e8,
                    help="elements a PS core updates per second with a stateful optimizer (strata train --profile)")
    ap.add_argument("--batch", type=int, default=128, help="examples per worker step")
    ap.add_argument("--workers", default="8,64,512,4096")
    a = ap.parse_args()
    workers = [int(w) for w in a.workers.split(",")]
    if a.params is not None:
        if a.step_ms is None:
            ap.error("--params needs --step-ms")
        rate = 0.0 if a.optimizer == "sgd" else a.ps_rate
        table("your workload", a.params, a.sparse_mb * 1e6, a.step_ms / 1e3, a.input_ms / 1e3, a.ops, a.nic_gbps,
              rate, a.batch, workers, a.ps_cores, a.alpha_us * 1e-6)
        return
    # The document's workloads (docs/SCALING.md section 3).
    rate, cores = a.ps_rate, a.ps_cores
    table("A. The quickstart MLP (784-256-128-10), one GPU per worker, Adam", 235146, 0, 1e-3, 0, 6, 100, rate, 128,
          workers, cores)
    table("B. A ResNet-50-sized dense model (25.6 M parameters), Adam", 25.6e6, 0, 0.25, 0, 161, 200, rate, 256,
          workers, cores)
    table("C. Wide & deep: 2 M dense parameters + 4096 embedding rows of 64 floats per step, Adagrad", 2e6, 4096 * 256,
          10e-3, 0, 12, 100, rate, 512, workers, cores)


if __name__ == "__main__":
    main()
