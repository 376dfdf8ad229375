"""Random single-byte changes over whole checkpoint files, checked with `strata ckpt verify`.

    ckpt_flip.py STRATA_BIN WORKDIR FLIPS SEED FIXTURE_DIR...

Each FIXTURE_DIR holds two committed checkpoints (checkpoint.json, ckpt-100.h5, ckpt-200.h5).
For each of FLIPS changes (spread evenly over the fixtures) the driver makes a directory with
ckpt-100.h5 (a hard link to the intact file), a copy of ckpt-200.h5 with one byte XORed with a
random non-zero value, and the fixture's checkpoint.json. The bytes are drawn a third each from
the whole file, from the bytes outside every dataset's data (integrity block, HDF5 superblock,
object headers, attributes, B-trees, heaps; found with h5py, independently of strata), and from
the first 4 KiB (the header region). `strata ckpt verify` then runs over batches of these
directories (many per process, to keep the test fast) and, for every directory, must

  * report ckpt-200.h5 as FAILED (the change is detected), and ckpt-100.h5 as OK;
  * say that --restore latest would use ckpt-100.h5 (the restore decision: the same function
    `strata train --restore latest` calls, so the changed file is never restored silently);

and every batch must exit with status 1. A control batch of unchanged copies must exit 0.
Prints one summary line; exits 1 listing the first problems otherwise.
"""
import os
import random
import re
import shutil
import subprocess
import sys

import h5py

BATCH = 125


def non_data_offsets(path):
    """Offsets of bytes that are not any dataset's raw data."""
    size = os.path.getsize(path)
    data = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.id.get_storage_size() > 0:
                data.append((obj.id.get_offset(), obj.id.get_offset() + obj.id.get_storage_size()))
        f.visititems(visit)
    data.sort()
    out, pos = [], 0
    for b, e in data:
        out.extend(range(pos, b))
        pos = max(pos, e)
    out.extend(range(pos, size))
    return out, len(data)


def run_verify(strata, dirs):
    p = subprocess.run([strata, "ckpt", "verify"] + dirs, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def main():
    strata, work, flips, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fixtures = sys.argv[5:]
    rng = random.Random(seed)
    problems = []
    cases = []  # (dir, fixture, offset, kind)
    for k, fixture in enumerate(fixtures):
        latest = os.path.join(fixture, "ckpt-200.h5")
        original = open(latest, "rb").read()
        outside, datasets = non_data_offsets(latest)
        if datasets == 0 or not outside:
            problems.append("%s: no datasets found by h5py" % latest)
            continue
        count = flips // len(fixtures) + (1 if k < flips % len(fixtures) else 0)
        for i in range(count):
            kind = ("anywhere", "metadata", "header")[i % 3]
            if kind == "anywhere":
                offset = rng.randrange(len(original))
            elif kind == "metadata":
                offset = rng.choice(outside)
            else:
                offset = rng.randrange(min(4096, len(original)))
            changed = bytearray(original)
            changed[offset] ^= rng.randrange(1, 256)
            d = os.path.join(work, "f%d-%04d" % (k, i))
            os.mkdir(d)
            os.link(os.path.join(fixture, "ckpt-100.h5"), os.path.join(d, "ckpt-100.h5"))
            shutil.copy(os.path.join(fixture, "checkpoint.json"), d)
            with open(os.path.join(d, "ckpt-200.h5"), "wb") as out:
                out.write(changed)
            cases.append((d, fixture, offset, kind))

    # Control: unchanged copies verify (so FAILED below is not verify failing everything).
    controls = []
    for k, fixture in enumerate(fixtures):
        d = os.path.join(work, "control%d" % k)
        shutil.copytree(fixture, d)
        controls.append(d)
    rc, out, err = run_verify(strata, controls)
    if rc != 0:
        problems.append("control batch of intact copies: exit %d: %s %s" % (rc, out[-500:], err[-500:]))

    detected = fallback = 0
    kinds = {}
    for start in range(0, len(cases), BATCH):
        batch = cases[start:start + BATCH]
        rc, out, err = run_verify(strata, [c[0] for c in batch])
        if rc != 1:
            problems.append("batch %d: exit status %d (want 1)" % (start // BATCH, rc))
        for d, fixture, offset, kind in batch:
            failed = re.search(r"^%s: FAILED: " % re.escape(os.path.join(d, "ckpt-200.h5")), out, re.M)
            intact = re.search(r"^%s: OK \(step 100, " % re.escape(os.path.join(d, "ckpt-100.h5")), out, re.M)
            restore = ("--restore latest would use %s (step 100)" % os.path.join(d, "ckpt-100.h5")) in out
            kinds[kind] = kinds.get(kind, 0) + 1
            detected += bool(failed)
            fallback += bool(restore)
            if not (failed and intact and restore):
                problems.append("%s byte %d (%s) of %s: detected=%s previous OK=%s restore falls back=%s" %
                                (d, offset, kind, fixture, bool(failed), bool(intact), restore))
    print("%d single-byte changes (%s) over %d file(s): %d detected by ckpt verify, %d restore decisions fall back"
          % (len(cases), ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items())), len(fixtures), detected,
             fallback))
    if problems or len(cases) != flips:
        for p in problems[:20]:
            print("PROBLEM: " + p)
        if len(cases) != flips:
            print("PROBLEM: %d cases made, %d asked for" % (len(cases), flips))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
