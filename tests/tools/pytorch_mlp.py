#!/usr/bin/env python3
"""PyTorch reference for the strata MLP benchmark (docs/PERFORMANCE.md, "Training").

Trains the model `strata train --model mlp --data fashion-mnist` trains, the same way, so the two
throughputs can be put side by side on the same cores:
  * MLP 784-256-128-10 with ReLU, Glorot-uniform kernels and zero biases (Keras' defaults, which
    strata's initialisers follow), mean softmax cross-entropy;
  * Adam, lr 1e-3, betas 0.9/0.999, epsilon 1e-7 (Keras' default; PyTorch adds it to sqrt(v_hat),
    Keras to sqrt(v), a difference far below what test accuracy can show);
  * batch 128 per process, a fresh shuffle every epoch, the last partial batch dropped;
  * pixels / 255 as float32, read from the Debian package dataset-fashion-mnist's IDX files;
  * one thread per process unless --threads says otherwise.

Variants:
  single  one process over the whole training set (the peer of strata's async job, whose
          workers each see their own half);
  ddp     DistributedDataParallel over gloo, N processes (default 2), each over its 1/N of every
          epoch's shuffle, gradients averaged by all-reduce (the peer of strata's sync job).

examples/s is counted as strata counts it: each process's examples over its own training time
(data loading and the final evaluation excluded), summed over processes. Test accuracy is on
the 10,000 test images after the last epoch.

Tuning (torch_tuning.py), to compare with PyTorch at its best rather than at its defaults:
  --threads N            intra-op threads per process (default 1);
  --blas-threads N       OpenBLAS threads per process (default 1; Debian's openblas-serial ignores it,
                         its openblas-pthread uses it: pick one with LD_LIBRARY_PATH=
                         /usr/lib/x86_64-linux-gnu/openblas-pthread);
  --foreach              Adam(foreach=True);
  --malloc-thresholds B  glibc's mmap and trim thresholds raised to B bytes (e.g. 33554432), so the
                         step's temporaries stop being unmapped and faulted in again.
OpenBLAS picks its kernels from the CPU unless OPENBLAS_CORETYPE names a set: run the command under
`env -u OPENBLAS_CORETYPE` to let it choose (and check the accuracy). Each result reports the
OpenBLAS kernel set in use, the CPU time over the training loop (user+sys, all threads, summed over
processes), busy cores (that CPU time over the training time) and minor page faults per step.

This is a benchmark helper, not a test and not a dependency of strata: it needs PyTorch
(Debian: apt-get install python3-torch) and says so if it is missing.

  /usr/bin/python3 tests/tools/pytorch_mlp.py --variant both --epochs 20
  env -u OPENBLAS_CORETYPE /usr/bin/python3 tests/tools/pytorch_mlp.py --variant single \
      --threads 2 --foreach --malloc-thresholds 33554432 --json
"""
import argparse
import gzip
import json
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_tuning  # noqa: E402  (this directory's helper)

PROG = "pytorch_mlp.py"
np = torch = dist = mp = F = None  # imported by load_torch(), after the thread settings


def load_torch():
    global np, torch, dist, mp, F
    try:
        import numpy as np
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        import torch.nn.functional as F
    except ImportError as e:  # dependencies strata's own tests never need
        sys.exit(f"{PROG}: {sys.executable} cannot import {e.name or e} (this benchmark needs PyTorch "
                 "and NumPy); on Debian: apt-get install python3-torch, then run it with /usr/bin/python3")


DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzip or plain) as a numpy array of its declared shape (uint8 data)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{PROG}: {path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(data_dir, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise SystemExit(f"{PROG}: {stem}(.gz) not found in {data_dir} "
                     "(Debian package dataset-fashion-mnist, or --data DIR)")


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(find(data_dir, prefix + "-images-idx3-ubyte"))
    y = read_idx(find(data_dir, prefix + "-labels-idx1-ubyte"))
    x = torch.from_numpy(x.reshape(len(x), -1).astype(np.float32) / np.float32(255))
    return x, torch.from_numpy(y.astype(np.int64))


def make_mlp(dims):
    """Linear layers with ReLU between them; Keras' initialisers, as strata's variables get."""
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        linear = torch.nn.Linear(a, b)
        torch.nn.init.xavier_uniform_(linear.weight)
        torch.nn.init.zeros_(linear.bias)
        layers += [linear, torch.nn.ReLU()] if i + 2 < len(dims) else [linear]
    return torch.nn.Sequential(*layers)


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        right = sum(int((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum()) for i in range(0, len(x), 1000))
    model.train()
    return right / len(x)


def train(args, rank, world):
    """Trains on this process's part of every epoch; returns (examples, seconds, cpu seconds,
    minor faults, steps, model)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    x, y = load(args.data, "train")
    model = make_mlp([784] + args.hidden + [10])
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-7,
                           foreach=True if args.foreach else None)
    # Like strata, every rank runs the same number of steps per epoch (the smallest part's).
    steps = (len(x) // world) // args.batch
    examples = 0
    gen = torch.Generator().manual_seed(args.seed)
    cpu0, faults0 = torch_tuning.usage()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(len(x), generator=gen)[rank::world]  # same shuffle on every rank
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            examples += len(idx)
    seconds = time.perf_counter() - t0
    cpu1, faults1 = torch_tuning.usage()
    return examples, seconds, cpu1 - cpu0, faults1 - faults0, steps * args.epochs, model


def ddp_child(rank, args, port, results):
    torch_tuning.apply(args, PROG)  # the malloc thresholds are per process
    load_torch()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    examples, seconds, cpu, faults, steps, model = train(args, rank, args.workers)
    dist.barrier()
    acc = None
    if rank == 0:
        xt, yt = load(args.data, "test")
        acc = accuracy(model, xt, yt)
    results.put((rank, examples, seconds, acc, cpu, faults, steps, torch_tuning.blas_info()))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_single(args):
    examples, seconds, cpu, faults, steps, model = train(args, 0, 1)
    xt, yt = load(args.data, "test")
    return {"variant": "single", "processes": 1, "examples": examples, "train_s": seconds,
            "examples_per_sec": examples / seconds, "test_accuracy": accuracy(model, xt, yt),
            "cpu_s": cpu, "busy_cores": cpu / seconds, "examples_per_cpu_s": examples / cpu,
            "minor_faults_per_step": faults / steps, **torch_tuning.blas_info()}


def run_ddp(args):
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(ddp_child, args=(args, free_port(), results), nprocs=args.workers, join=True,
                       start_method="spawn")
    rows = sorted((results.get() for _ in range(args.workers)), key=lambda r: r[0])
    cpu = sum(r[4] for r in rows)
    train_s = max(r[2] for r in rows)
    examples = sum(r[1] for r in rows)
    return {"variant": "ddp-gloo", "processes": args.workers, "examples": examples,
            "train_s": train_s, "examples_per_sec": sum(r[1] / r[2] for r in rows),
            "test_accuracy": rows[0][3], "cpu_s": cpu, "busy_cores": cpu / train_s,
            "examples_per_cpu_s": examples / cpu,
            "minor_faults_per_step": sum(r[5] for r in rows) / sum(r[6] for r in rows), **rows[0][7]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=["single", "ddp", "both"], default="both")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=128, help="examples per process per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    p.add_argument("--workers", type=int, default=2, help="DDP processes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=DATA_DIR)
    p.add_argument("--json", action="store_true", help="one JSON object per variant instead of text")
    torch_tuning.add_arguments(p)
    args = p.parse_args()
    torch_tuning.check(args, PROG)
    torch_tuning.apply(args, PROG)
    load_torch()
    for variant in (["single", "ddp"] if args.variant == "both" else [args.variant]):
        r = run_single(args) if variant == "single" else run_ddp(args)
        r.update(torch=torch.__version__, epochs=args.epochs, batch=args.batch, threads=args.threads,
                 blas_threads=args.blas_threads, foreach=args.foreach, malloc_thresholds=args.malloc_thresholds)
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(f"pytorch {r['variant']} ({r['processes']} process(es) x {args.threads} thread(s), "
                  f"OpenBLAS {r.get('openblas_core', '?')}, {args.epochs} epochs, batch {args.batch}): "
                  f"{r['examples']} examples in {r['train_s']:.1f} s, {r['examples_per_sec']:.0f} examples/s, "
                  f"{r['busy_cores']:.2f} busy cores, {r['minor_faults_per_step']:.1f} page faults/step, "
                  f"test accuracy {r['test_accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    main()
