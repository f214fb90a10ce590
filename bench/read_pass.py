#!/usr/bin/env python3
"""Warm read passes over a loosefs mount and the original directory, in the same run.

Readers: `raw` (open/read/close of every file, in ImageFolder order) and `imagefolder`
(torchvision ImageFolder: PIL decode + convert('RGB') of every sample, no transforms). Each
target gets one warm-up pass, then --repeat passes, alternating targets so drift on a shared
machine hits both; prints median and min-max files/s and the ratio mount/original.

    bench/read_pass.py --orig ../shared/data/imagenet-sample --mount /mnt/sample [--repeat 3]
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from run import files_under as file_list  # noqa: E402


def raw_pass(root):
    paths = file_list(root)
    t = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            f.read()
    return len(paths), time.perf_counter() - t


def imagefolder_pass(root):
    import torchvision

    t = time.perf_counter()
    ds = torchvision.datasets.ImageFolder(root)
    for i in range(len(ds)):
        ds[i]
    return len(ds), time.perf_counter() - t


READERS = {"raw": raw_pass, "imagefolder": imagefolder_pass}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orig", required=True, help="original directory")
    ap.add_argument("--mount", required=True, help="loosefs mountpoint of a pack of --orig")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--readers", default="raw,imagefolder")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = {}
    for reader in a.readers.split(","):
        fn = READERS[reader]
        rates = {"orig": [], "mount": []}
        for target in ("orig", "mount"):
            fn(getattr(a, target))  # warm-up: page cache (and the daemon's) filled
        for _ in range(a.repeat):
            for target in ("orig", "mount"):
                n, s = fn(getattr(a, target))
                rates[target].append(n / s)
        r = {t: {"median": statistics.median(v), "min": min(v), "max": max(v)} for t, v in rates.items()}
        r["ratio_mount_over_orig"] = r["mount"]["median"] / r["orig"]["median"]
        results[reader] = r
    if a.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return
    print(f"warm read pass, files/s, median (min-max) of {a.repeat} passes; same run")
    for reader, r in results.items():
        o, m = r["orig"], r["mount"]
        print(
            f"  {reader:12s} original {o['median']:9.0f} ({o['min']:.0f}-{o['max']:.0f})"
            f"   loosefs {m['median']:9.0f} ({m['min']:.0f}-{m['max']:.0f})"
            f"   ratio {r['ratio_mount_over_orig']:.2f}x"
        )


if __name__ == "__main__":
    main()
