#!/usr/bin/python3
"""Crafted checkpoints for tests/cli/ckpt_security_test.sh (needs h5py: Debian's /usr/bin/python3).

Each file is made from a good format 2 checkpoint and then signed again the way anyone who can
write a file can: the integrity block's table, size and whole-file CRC-32 (FORMAT.md section 3)
and, where every attribute keeps its type, the metadata checksum (section 4) are recomputed. So
no checksum objects; only the reader's own checks of types, shapes and sizes can.

  ckpt_craft.py attr SRC DST KIND           one attribute of the wrong type or shape (KINDS)
  ckpt_craft.py unstored SRC DST D0,D1,...  adds variables/ghost, f32 of that shape, never
                                            written; its table entry claims the offset HDF5
                                            reports and the declared size (which a reader that
                                            trusted the table accepted)
  ckpt_craft.py v1 SRC DST [D0,D1,...]      the format 1 copy of SRC (no integrity block, no
                                            metadata_checksum), optionally with variables/ghost
"""
import struct
import sys
import zlib

import h5py
import numpy as np

HEADER = struct.Struct("<8sIIQQqII")  # magic, layout, file_crc, file_bytes, block_bytes, step, count, 0
ENTRY = struct.Struct("<QQII")        # offset, bytes, crc, path length


def manifest(f):
    """FORMAT.md section 4, as its recipe writes it."""
    def text(value):
        b = value.encode() if isinstance(value, str) else bytes(value)
        return b"%d:%s" % (len(b), b)
    a = f.attrs
    lines = [b"strata checkpoint manifest 1",
             b"format_version %d" % a["format_version"],
             b"global_step %d" % a["global_step"],
             b"variable_sequence_hash %d" % a["variable_sequence_hash"],
             b"optimizer " + text(a["optimizer"]),
             b"training_position " + text(a["training_position"]),
             b"created_unix %d" % a["created_unix"],
             b"checksum_algorithm " + text(a["checksum_algorithm"])]
    dtypes = {"<f4": b"f32", "<f8": b"f64", "<i8": b"i64"}
    entries = []

    def line(path, d, optimizer_step):
        shape = b",".join(b"%d" % n for n in d.shape)
        s = b"dataset %s %s [%s] checksum %d" % (text(path), dtypes[d.dtype.str], shape, d.attrs["checksum"])
        return s if optimizer_step is None else s + b" optimizer_step %d" % optimizer_step
    names = []
    f["variables"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    for name in names:
        d = f["variables/" + name]
        entries.append(("variables/" + name, line("variables/" + name, d, int(d.attrs.get("optimizer_step", 0)))))
        group = f.get("slots/" + name)
        if isinstance(group, h5py.Group):
            for slot, s in group.items():
                if isinstance(s, h5py.Dataset):
                    path = "slots/%s/%s" % (name, slot)
                    entries.append((path, line(path, s, None)))
    lines += [l for _, l in sorted(entries, key=lambda e: e[0].encode())]
    return b"\n".join(lines) + b"\n"


def datasets(f):
    out = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return [n for n in out if n.startswith(("variables/", "slots/"))]


def sign(path, claims=None, metadata=True):
    """Recomputes the metadata checksum (when `metadata`), the table, the size and the file CRC.
    `claims` maps a dataset path to the byte count its table entry should claim (its offset is
    the one HDF5 reports, as for every other entry)."""
    claims = claims or {}
    with h5py.File(path, "r+") as f:
        if metadata:
            f.attrs.create("metadata_checksum", zlib.crc32(manifest(f)), dtype="<u8")
    with h5py.File(path, "r") as f:
        layout = []
        for name in datasets(f):
            d = f[name]
            layout.append((name, d.id.get_offset() or 0, d.id.get_storage_size()))
    data = bytearray(open(path, "rb").read())
    table = []
    for name, offset, size in layout:
        crc = zlib.crc32(data[offset:offset + size]) if size else 0
        if name in claims:
            size, crc = claims[name], 0
        table.append((name, offset, size, crc))
    _, _, _, _, block_bytes, step, _, _ = HEADER.unpack_from(data, 0)
    table.sort(key=lambda e: e[0].encode())
    block = bytearray(block_bytes)
    HEADER.pack_into(block, 0, b"STRATACK", 1, 0, len(data), block_bytes, step, len(table), 0)
    at = HEADER.size
    for name, offset, size, crc in table:
        raw = name.encode()
        ENTRY.pack_into(block, at, offset, size, crc, len(raw))
        block[at + ENTRY.size:at + ENTRY.size + len(raw)] = raw
        at += ENTRY.size + len(raw)
    assert at <= block_bytes, "table does not fit the user block"
    data[:block_bytes] = block
    struct.pack_into("<I", data, 12, zlib.crc32(data))
    open(path, "wb").write(data)


def copy(src, dst):
    open(dst, "wb").write(open(src, "rb").read())


def shape_of(text):
    return tuple(int(x) for x in text.split(","))


# kind -> (edit(f), whether the metadata checksum can still be recomputed afterwards)
def set_attr(obj, name, value, dtype=None):
    if name in obj.attrs:
        del obj.attrs[name]
    obj.attrs.create(name, value, dtype=dtype)


KINDS = {
    # The reproductions: an array where a scalar is meant.
    "format_version_array": (lambda f: set_attr(f, "format_version", np.arange(4096, dtype="<i8")), False),
    "optimizer_string_array": (lambda f: set_attr(f, "optimizer", ["adam"] * 64, h5py.string_dtype()), False),
    # Other wrong types and shapes.
    "global_step_string": (lambda f: set_attr(f, "global_step", "300", h5py.string_dtype()), False),
    "created_unix_float": (lambda f: set_attr(f, "created_unix", 1.5e9, "<f8"), False),
    "global_step_compound": (lambda f: set_attr(f, "global_step", np.zeros((), dtype=[("lo", "<i8"), ("hi", "<i8")])), False),
    "checksum_array": (lambda f: set_attr(f["variables/ids"], "checksum", np.zeros(3, dtype="<u8")), False),
    "optimizer_empty": (lambda f: set_attr(f, "optimizer", h5py.Empty(h5py.string_dtype())), False),
    "training_position_long": (lambda f: set_attr(f, "training_position", "x" * (17 << 20), h5py.string_dtype()), False),
    "training_position_deep": (lambda f: set_attr(f, "training_position", "[" * 100000 + "]" * 100000,
                                                  h5py.string_dtype()), True),
    # Legitimate but unusual: a fixed-length string is read with its own length.
    "optimizer_fixed": (lambda f: set_attr(f, "optimizer", np.bytes_("sgd"), "S8"), True),
}


def main(argv):
    cmd = argv[1]
    if cmd == "attr":
        src, dst, kind = argv[2:5]
        edit, metadata = KINDS[kind]
        copy(src, dst)
        with h5py.File(dst, "r+") as f:
            edit(f)
        sign(dst, metadata=metadata)
    elif cmd == "unstored":
        src, dst, shape = argv[2], argv[3], shape_of(argv[4])
        copy(src, dst)
        with h5py.File(dst, "r+") as f:
            d = f.create_dataset("variables/ghost", shape=shape, dtype="<f4")
            d.attrs.create("checksum", 0, dtype="<u8")
        declared = int(np.prod(shape, dtype=object)) * 4
        sign(dst, claims={"variables/ghost": declared})
    elif cmd == "v1":
        src, dst = argv[2], argv[3]
        with h5py.File(src, "r") as a, h5py.File(dst, "w") as b:
            for k in a.attrs:
                if k != "metadata_checksum":
                    b.attrs.create(k, a.attrs[k], dtype=a.attrs.get_id(k).dtype)
            b.attrs.create("format_version", 1, dtype="<i4")
            for group in ("variables", "slots"):
                a.copy(a[group], b, name=group)
            if len(argv) > 4:
                d = b.create_dataset("variables/ghost", shape=shape_of(argv[4]), dtype="<f4")
                d.attrs.create("checksum", 0, dtype="<u8")
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
