#!/usr/bin/env python3
"""PyTorch reference for strata's CTR models (docs/PERFORMANCE.md, "Against PyTorch": CTR).

Trains what `strata train --model-spec examples/specs/criteo_dlrm.json` (--model dlrm) or
`criteo_wide_deep.json` (--model wide_deep) trains, on the same Criteo-layout TSV files
(`strata data synth-ctr`: label, I1..I13, C1..C26, an empty field is missing), so that examples/s
and test AUC can be put side by side on the same cores:
  * I1..I13, each twice: as a numeric value ((x - 4) / 8, missing = 0; DLRM's bottom MLP) and as
    a bucket of the boundaries [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256,
    512, 1024, 4096] (TF's bucketized_column: bucket = number of boundaries <= x; missing = -1,
    bucket 0), embedded;
  * C1..C26 hashed into 100,000 buckets each and embedded; a missing value gives no id (its bag is
    empty, so it adds zeros), as strata does. The hash differs: strata uses FarmHash Fingerprint64
    (TF's to_hash_bucket_fast), this script CRC-32 of the text; both spread the values over the
    same bucket counts, and with synth-ctr's vocabularies (<= 10,000 values a field) collisions
    are rare in either;
  * one embedding table per column (8-dimensional; wide-and-deep's linear part: 1-dimensional,
    zeros), kept here as the row ranges of one nn.EmbeddingBag (mode "sum", sparse gradients),
    which is the same set of parameters; initial rows uniform(-0.05, 0.05) as strata's;
  * dlrm: bottom MLP 13-32-8 (ReLU after both, as strata's and the reference DLRM's), DLRM's dot
    interaction over the bottom output and the 39 embeddings (the 780 pairwise products i < j,
    with the bottom output concatenated in front: 788 values), top MLP 788-128-64 (ReLU), one logit;
    wide_deep: a linear part (sum of the 39 columns' 1-wide rows plus a bias) added to a DNN over
    the 39 embeddings concatenated (312-256-128, ReLU, one logit);
  * Dense layers Glorot-uniform kernels and zero biases; mean sigmoid cross-entropy;
  * Adam lr 0.001, betas 0.9/0.999, epsilon 1e-7: the dense layers with torch.optim.Adam, the
    embedding tables with SparseAdam (only the rows a batch read are updated, moments included:
    what strata's PS does for sparse rows, TF's lazy Adam);
  * batch 256, 3 epochs, a fresh shuffle every epoch, the last partial batch dropped.

examples/s is counted as strata counts it: the examples trained over the training time (reading
and hashing the files and the evaluation excluded). The test AUC is exact (ties averaged) over the
whole evaluation file, computed with NumPy. Thread and malloc settings: see torch_tuning.py.

This is a benchmark helper, not a test and not a dependency of strata (it needs Debian's
python3-torch):

  env -u OPENBLAS_CORETYPE /usr/bin/python3 tests/tools/pytorch_ctr.py --train train.tsv \\
      --eval eval.tsv --model dlrm --threads 2 --foreach --malloc-thresholds 33554432 --json
"""
import argparse
import json
import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_tuning  # noqa: E402  (this directory's helper)

PROG = "pytorch_ctr.py"
INT_FIELDS, CAT_FIELDS = 13, 26
BOUNDARIES = [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256, 512, 1024, 4096]
np = torch = F = None  # imported by load_torch(), after the thread settings


def load_torch():
    global np, torch, F
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        sys.exit(f"{PROG}: {sys.executable} cannot import {e.name or e} (this benchmark needs PyTorch "
                 "and NumPy); on Debian: apt-get install python3-torch, then run it with /usr/bin/python3")


def read_tsv(path, buckets):
    """(labels float32 [N], numeric float32 [N, 13] normalised, ids int64 [N, 39] with each column's
    table offset added and -1 for a missing categorical). Every malformed line is an error naming
    the file and line."""
    labels, ints, cats = [], [], []
    cache = [dict() for _ in range(CAT_FIELDS)]
    try:
        f = open(path, "r", encoding="ascii", newline="\n")
    except OSError as e:
        raise SystemExit(f"{PROG}: {path}: {e.strerror}")
    with f:
        for n, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 1 + INT_FIELDS + CAT_FIELDS:
                raise SystemExit(f"{PROG}: {path}:{n}: {len(fields)} fields, expected {1 + INT_FIELDS + CAT_FIELDS}")
            try:
                label = int(fields[0])
                row = [int(v) if v else -1 for v in fields[1:1 + INT_FIELDS]]
            except ValueError:
                raise SystemExit(f"{PROG}: {path}:{n}: a label or integer field is not an integer")
            if label not in (0, 1):
                raise SystemExit(f"{PROG}: {path}:{n}: label {label} is not 0 or 1")
            labels.append(label)
            ints.append(row)
            ids = []
            for c, v in enumerate(fields[1 + INT_FIELDS:]):
                if not v:
                    ids.append(-1)
                    continue
                h = cache[c].get(v)
                if h is None:
                    h = cache[c][v] = zlib.crc32(v.encode()) % buckets
                ids.append(h)
            cats.append(ids)
    if not labels:
        raise SystemExit(f"{PROG}: {path}: no rows")
    ints = np.asarray(ints, dtype=np.int64)
    numeric = ((np.where(ints < 0, 0, ints) - 4) / 8).astype(np.float32)
    # TF's bucketized_column: bucket i holds boundaries[i-1] <= x < boundaries[i]; -1 (missing) is bucket 0.
    bucket = np.searchsorted(np.asarray(BOUNDARIES), ints, side="right")
    nb = len(BOUNDARIES) + 1
    cats = np.asarray(cats, dtype=np.int64)
    int_ids = bucket + np.arange(INT_FIELDS) * nb
    cat_ids = np.where(cats < 0, -1, cats + INT_FIELDS * nb + np.arange(CAT_FIELDS) * buckets)
    ids = np.concatenate([int_ids, cat_ids], axis=1)
    return (torch.from_numpy(np.asarray(labels, dtype=np.float32)), torch.from_numpy(numeric),
            torch.from_numpy(ids))


def glorot_linear(a, b):
    layer = torch.nn.Linear(a, b)
    torch.nn.init.xavier_uniform_(layer.weight)
    torch.nn.init.zeros_(layer.bias)
    return layer


def mlp(dims, relu_last):
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(glorot_linear(a, b))
        if relu_last or i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_model(kind, rows, dim):
    """The model as a torch.nn.Module taking (numeric [B, 13], flat ids [B*39] with -1 replaced by
    the padding row, offsets [B*39]) and returning logits [B]; plus its sparse and dense parameters."""
    fields = INT_FIELDS + CAT_FIELDS
    pad = rows  # one row past the tables: padding, excluded from every sum

    def table(width, zeros):
        t = torch.nn.EmbeddingBag(rows + 1, width, mode="sum", sparse=True, padding_idx=pad)
        with torch.no_grad():
            if zeros:
                t.weight.zero_()
            else:
                t.weight.uniform_(-0.05, 0.05)
            t.weight[pad].zero_()
        return t

    class Dlrm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = table(dim, False)
            self.bottom = mlp([INT_FIELDS, 32, dim], relu_last=True)
            self.top = torch.nn.Sequential(mlp([dim + (fields + 1) * fields // 2, 128, 64], relu_last=True),
                                           glorot_linear(64, 1))
            self.register_buffer("li", torch.triu_indices(fields + 1, fields + 1, 1)[0], persistent=False)
            self.register_buffer("lj", torch.triu_indices(fields + 1, fields + 1, 1)[1], persistent=False)

        def forward(self, numeric, ids, offsets):
            b = self.bottom(numeric)
            e = self.emb(ids, offsets).view(-1, fields, dim)
            z = torch.cat([b.unsqueeze(1), e], 1)
            dots = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
            return self.top(torch.cat([b, dots], 1)).squeeze(1)

    class WideDeep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = table(dim, False)
            self.wide = table(1, True)
            self.bias = torch.nn.Parameter(torch.zeros(1))
            self.dnn = torch.nn.Sequential(mlp([fields * dim, 256, 128], relu_last=True), glorot_linear(128, 1))

        def forward(self, numeric, ids, offsets):
            e = self.emb(ids, offsets).view(-1, fields * dim)
            w = self.wide(ids, offsets).view(-1, fields).sum(1)
            return self.dnn(e).squeeze(1) + w + self.bias

    model = Dlrm() if kind == "dlrm" else WideDeep()
    sparse = [p for n, p in model.named_parameters() if n.split(".")[0] in ("emb", "wide")]
    dense = [p for n, p in model.named_parameters() if n.split(".")[0] not in ("emb", "wide")]
    return model, sparse, dense, pad


def evaluate(model, data, pad, chunk=8192):
    labels, numeric, ids = data
    fields = ids.shape[1]
    out = []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(labels), chunk):
            i = ids[s:s + chunk]
            flat = torch.where(i < 0, torch.full_like(i, pad), i).reshape(-1)
            offsets = torch.arange(0, flat.numel(), dtype=torch.int64)
            out.append(model(numeric[s:s + chunk], flat, offsets))
    model.train()
    logits = torch.cat(out).double()
    y = labels.double()
    log_loss = float(F.binary_cross_entropy_with_logits(logits, y))
    return torch_tuning.auc(y.numpy(), logits.numpy()), log_loss, fields


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True, help="training TSV (Criteo layout, no header)")
    p.add_argument("--eval", required=True, help="evaluation TSV")
    p.add_argument("--model", choices=["dlrm", "wide_deep"], default="dlrm")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hash-buckets", type=int, default=100000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    torch_tuning.add_arguments(p)
    args = p.parse_args()
    torch_tuning.check(args, PROG)
    for name in ("epochs", "batch", "hash_buckets", "dim"):
        if getattr(args, name) < 1:
            raise SystemExit(f"{PROG}: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    torch_tuning.apply(args, PROG)
    load_torch()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    t_read = time.perf_counter()
    train = read_tsv(args.train, args.hash_buckets)
    test = read_tsv(args.eval, args.hash_buckets)
    t_read = time.perf_counter() - t_read
    rows = INT_FIELDS * (len(BOUNDARIES) + 1) + CAT_FIELDS * args.hash_buckets
    model, sparse, dense, pad = make_model(args.model, rows, args.dim)
    opts = [torch.optim.Adam(dense, lr=args.lr, betas=(0.9, 0.999), eps=1e-7, foreach=True if args.foreach else None),
            torch.optim.SparseAdam(sparse, lr=args.lr, betas=(0.9, 0.999), eps=1e-7)]

    labels, numeric, ids = train
    n = len(labels)
    steps = n // args.batch
    fields = ids.shape[1]
    offsets = torch.arange(0, args.batch * fields, dtype=torch.int64)  # one id (or the padding) per bag
    padded = torch.where(ids < 0, torch.full_like(ids, pad), ids)
    gen = torch.Generator().manual_seed(args.seed)
    examples = 0
    cpu0, faults0 = torch_tuning.usage()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(n, generator=gen)
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            logits = model(numeric[idx], padded[idx].reshape(-1), offsets)
            loss = F.binary_cross_entropy_with_logits(logits, labels[idx])
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()
            for o in opts:
                o.step()
            examples += len(idx)
    seconds = time.perf_counter() - t0
    cpu1, faults1 = torch_tuning.usage()
    auc, log_loss, _ = evaluate(model, test, pad)
    r = {"model": args.model, "examples": examples, "train_s": seconds, "examples_per_sec": examples / seconds,
         "auc": auc, "log_loss": log_loss, "final_loss": float(loss), "cpu_s": cpu1 - cpu0,
         "busy_cores": (cpu1 - cpu0) / seconds, "examples_per_cpu_s": examples / (cpu1 - cpu0),
         "minor_faults_per_step": (faults1 - faults0) / (steps * args.epochs), "read_s": t_read,
         "train_rows": n, "eval_rows": len(test[0]), **torch_tuning.blas_info(), "torch": torch.__version__,
         "epochs": args.epochs, "batch": args.batch, "threads": args.threads, "blas_threads": args.blas_threads,
         "foreach": args.foreach, "malloc_thresholds": args.malloc_thresholds}
    if args.json:
        print(json.dumps(r), flush=True)
    else:
        print(f"pytorch {args.model} (1 process x {args.threads} thread(s), OpenBLAS {r.get('openblas_core', '?')}, "
              f"{args.epochs} epochs, batch {args.batch}): {examples} examples in {seconds:.1f} s, "
              f"{r['examples_per_sec']:.0f} examples/s, {r['busy_cores']:.2f} busy cores, "
              f"test AUC {auc:.4f}, log loss {log_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
