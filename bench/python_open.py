#!/usr/bin/env python3
"""Warm Python reads through a loosefs mount against the directory the pack was made from (issue
25's "Python buffered open+read, warm" and "np.load of decoded views"): files/s of
`open(p, "rb").read()`, and `np.load` of `.npy` views against the same `.npy` files written to
the directory's file system, each by default and after `loosefs.patch_open()` (no `isatty`
IOCTL per open). Best of REPEAT passes after one warming pass, alternated mount / directory.

Run as root from the repository with the test venv: python bench/python_open.py [--data DIR]
"""
import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import loosefs  # noqa: E402

BIN = ROOT / "target" / "release" / "loosefs"


def rate(files, fn, repeat):
    for p in files:
        fn(p)
    best = 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        for p in files:
            fn(p)
        best = max(best, len(files) / (time.perf_counter() - t))
    return best


def main():
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-pyopen-"))
    pack, mnt = work / "data.pack", work / "mnt"
    mnt.mkdir()
    subprocess.run([str(BIN), "pack", a.data, str(pack), "--json"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(BIN), "mount", str(pack), str(mnt), "--decode", "npy"], check=True, stderr=subprocess.DEVNULL)
    try:
        data = pathlib.Path(a.data)
        rel = sorted(p.relative_to(data) for p in data.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))
        npy_dir = work / "npy"  # the same views as files on the directory's file system
        for r in rel:
            (npy_dir / r).parent.mkdir(parents=True, exist_ok=True)
            (npy_dir / r.with_suffix(".npy")).write_bytes((mnt / r.with_suffix(".npy")).read_bytes())
        cases = [("open(p, 'rb').read()", lambda p: open(p, "rb").read(), [mnt / r for r in rel], [data / r for r in rel]),
                 ("np.load(view.npy)", np.load, [mnt / r.with_suffix(".npy") for r in rel],
                  [npy_dir / r.with_suffix(".npy") for r in rel])]
        print("| read | open | mount files/s | directory files/s | mount ÷ directory |")
        print("|---|---|---|---|---|")
        for name, fn, on_mount, on_dir in cases:
            for patched in [False, True]:
                loosefs.patch_open(patched)
                m, d = rate(on_mount, fn, a.repeat), rate(on_dir, fn, a.repeat)
                print(f"| {name} | {'patch_open()' if patched else 'default'} | {m:,.0f} | {d:,.0f} | {m / d:.2f}× |")
        loosefs.patch_open(False)
    finally:
        subprocess.run([str(BIN), "umount", str(mnt)], check=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
