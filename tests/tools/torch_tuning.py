"""Settings shared by the PyTorch benchmark helpers (pytorch_mlp.py, pytorch_ctr.py).

They exist to put PyTorch at its best on the cores strata runs on (docs/PERFORMANCE.md, "Against
PyTorch"): intra-op threads, OpenBLAS threads, glibc's malloc thresholds, and the measurements
that show whether the settings took (the OpenBLAS kernel set in use, CPU time and minor page faults
over the training loop). Nothing here imports torch: apply() must run before torch is imported,
because OpenMP and OpenBLAS read their thread counts once, when they load.

Not a test and not a dependency of strata.
"""
import ctypes
import os
import resource

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc caps M_MMAP_THRESHOLD at HEAP_MAX_SIZE / 2 (32 MiB on 64-bit); mallopt refuses more.
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


def add_arguments(parser):
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads per process (torch.set_num_threads and OMP_NUM_THREADS)")
    parser.add_argument("--blas-threads", type=int, default=1,
                        help="OpenBLAS threads per process (OPENBLAS_NUM_THREADS; only a pthread or OpenMP "
                             "OpenBLAS uses more than one)")
    parser.add_argument("--foreach", action="store_true",
                        help="Adam(foreach=True): one multi-tensor kernel per step instead of one per parameter")
    parser.add_argument("--malloc-thresholds", type=int, default=0, metavar="BYTES",
                        help="raise glibc's mmap and trim thresholds to BYTES (mallopt, as "
                             "MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ do), so tensors freed every "
                             "step are reused instead of unmapped and faulted in again; 0 keeps glibc's "
                             f"defaults; at most {MAX_MMAP_THRESHOLD}")


def check(args, prog):
    for name in ("threads", "blas_threads"):
        if not 1 <= getattr(args, name) <= 256:
            raise SystemExit(f"{prog}: --{name.replace('_', '-')} must be in 1..256, got {getattr(args, name)}")
    if not 0 <= args.malloc_thresholds <= MAX_MMAP_THRESHOLD:
        raise SystemExit(f"{prog}: --malloc-thresholds must be in 0..{MAX_MMAP_THRESHOLD}, got {args.malloc_thresholds}")


def apply(args, prog):
    """Sets this process's thread counts and malloc thresholds. Call before importing torch (the
    environment variables are inherited by the processes torch.multiprocessing spawns, which must
    call apply() again for the malloc part)."""
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["MKL_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
    if args.malloc_thresholds:
        libc = ctypes.CDLL("libc.so.6")
        for param, name in ((_M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD"), (_M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD")):
            if libc.mallopt(param, args.malloc_thresholds) != 1:
                raise SystemExit(f"{prog}: mallopt({name}, {args.malloc_thresholds}) was refused")


def blas_info():
    """The OpenBLAS this process loaded (it must have imported torch): its file, kernel set
    ("core") and thread count, read through OpenBLAS's own query functions. Another BLAS: its file."""
    path = None
    with open("/proc/self/maps") as f:
        for line in f:
            name = line.split()[-1] if len(line.split()) >= 6 else ""
            base = os.path.basename(name)
            if base.startswith(("libblas.so", "libopenblas")):
                path = name
                break
    if path is None:
        return {"blas": "none loaded"}
    info = {"blas": os.path.realpath(path)}
    try:
        lib = ctypes.CDLL(path)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        info["openblas_core"] = lib.openblas_get_corename().decode()
        info["openblas_config"] = lib.openblas_get_config().decode().strip()
        info["openblas_threads"] = lib.openblas_get_num_threads()
    except (OSError, AttributeError):
        pass  # not OpenBLAS
    info["OPENBLAS_CORETYPE"] = os.environ.get("OPENBLAS_CORETYPE", "(unset)")
    return info


def usage():
    """(CPU seconds user+sys, minor page faults) of this process so far, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def auc(labels, scores):
    """Exact ROC AUC (the Mann-Whitney statistic) with tied scores given their average rank, as
    sklearn's roc_auc_score computes it; labels 0/1, NumPy arrays."""
    import numpy as np
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # Runs of equal scores share the mean of their 1-based ranks.
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    mean_rank = (starts + 1 + ends) / 2.0
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
