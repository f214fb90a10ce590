#!/usr/bin/env python3
"""Why large files read slower from a FUSE mount's page cache than from ext4 with no request sent:
the folio sizes of the cached pages, and the warm read rate they give.

For the first 100 JPEGs of the sample: the `.npy` views of a `--decode npy` mount, the same
`.npy` bytes stored raw in a pack (read by READ, then pushed by FUSE_NOTIFY_STORE), and the
same files on the scratch directory's file system; each file read once, mapped, every page
touched, its page frames looked up in /proc/self/pagemap and their COMPOUND_HEAD/TAIL bits in
/proc/kpageflags (root). Then warm `os.open` + one `os.read` + `close` of all 1000 files, best
of 5 passes, three alternated rounds, views / raw `.npy` / ext4 `.npy` / JPEGs / ext4 JPEGs.

Run as root from the repository: python3 bench/folios.py [--data DIR] [-- MOUNT OPTIONS]
"""
import argparse
import mmap
import os
import pathlib
import shutil
import struct
import subprocess
import tempfile

from python_open import rate  # best of `repeat` passes after a warming one

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "loosefs"


def folio_kinds(path):
    """Per page of `path` (cached, mapped): '0' order-0, 'H'/'T' head/tail of a large folio."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        n = (size + 4095) // 4096
        for i in range(n):
            m[i * 4096]
        start = next(int(line.split("-")[0], 16) for line in open("/proc/self/maps")
                     if line.split()[-1] == os.path.realpath(path))
        kinds = []
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            for i in range(n):
                pm.seek((start // 4096 + i) * 8)
                e = struct.unpack("<Q", pm.read(8))[0]
                if not e >> 63 & 1:
                    kinds.append("-")
                    continue
                kf.seek((e & ((1 << 55) - 1)) * 8)
                f = struct.unpack("<Q", kf.read(8))[0]
                kinds.append("H" if f >> 15 & 1 else "T" if f >> 16 & 1 else "0")
        m.close()
        return "".join(kinds)
    finally:
        os.close(fd)


def census(files):
    s = ""
    for p in files:
        with open(p, "rb") as f:
            f.read()
        s += folio_kinds(p)
    return f"{len(s)} pages: {s.count('0')} order-0, {s.count('H') + s.count('T')} in {s.count('H')} large folios"


def read_whole(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        return len(os.read(fd, 1 << 22))
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("options", nargs="*", help="extra `loosefs mount` options")
    a = ap.parse_args()
    data = pathlib.Path(a.data)
    work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-folios-"))

    def run(*args):
        subprocess.run([str(BIN), *map(str, args)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    rel = sorted(p.relative_to(data) for p in data.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))
    mnts = {k: work / k for k in ["views", "read", "pushed"]}
    for m in mnts.values():
        m.mkdir()
    run("pack", data, work / "jpeg.pack")
    run("mount", work / "jpeg.pack", mnts["views"], "--decode", "npy", "--push-ahead", "0", *a.options)
    npy = work / "npy"
    try:
        for r in rel:
            (npy / r).parent.mkdir(parents=True, exist_ok=True)
            (npy / r.with_suffix(".npy")).write_bytes((mnts["views"] / r.with_suffix(".npy")).read_bytes())
        run("pack", npy, work / "npy.pack")
        run("mount", work / "npy.pack", mnts["read"], "--push-ahead", "0", *a.options)
        run("mount", work / "npy.pack", mnts["pushed"], *a.options)
        few = [r.with_suffix(".npy") for r in rel[:100]]
        print("| cached bytes of 100 .npy files | folios |\n|---|---|")
        for name, files in [("views (`--decode npy`)", [mnts["views"] / r for r in few]),
                            ("raw `.npy` in a pack, read (READ)", [mnts["read"] / r for r in few]),
                            ("raw `.npy` in a pack, pushed (NOTIFY_STORE)", [mnts["pushed"] / r for r in few]),
                            ("the same files on ext4", [npy / r for r in few])]:
            print(f"| {name} | {census(files)} |")
        cases = {"views": [mnts["views"] / r.with_suffix(".npy") for r in rel],
                 "raw .npy in a pack": [mnts["read"] / r.with_suffix(".npy") for r in rel],
                 ".npy on ext4": [npy / r.with_suffix(".npy") for r in rel],
                 "JPEGs in the pack": [mnts["views"] / r for r in rel],
                 "JPEGs on ext4": [data / r for r in rel]}
        got = {k: [] for k in cases}
        for _ in range(3):
            for k, v in cases.items():
                got[k].append(rate(v, read_whole, 5))
        print("\n| warm os.read of the whole file | files/s, 3 rounds |\n|---|---|")
        for k, v in got.items():
            print(f"| {k} | {' / '.join(f'{x:,.0f}' for x in v)} |")
    finally:
        for m in mnts.values():
            subprocess.run([str(BIN), "umount", str(m)], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
