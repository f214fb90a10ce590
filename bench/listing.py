#!/usr/bin/env python3
"""Mounting a large prefix of loose objects: listed, or from its shared listing (issue 44).

SeaweedFS holds `--keys` small objects spread over `--dirs` subdirectories of
`s3://packs/many/`; the fault proxy of tests/e2e/servers.py sits before it, adding `--latency`
ms to every request. Measured, each `--repeat` times, with the requests counted at the proxy:
- the LIST requests alone: the prefix listed page by page (boto3's ListObjectsV2 paginator,
  what `aws s3 ls --recursive` does), the baseline of a mount that must list;
- `loosefs mount` of the prefix with no shared listing (its LISTs: the first level, then the
  subdirectories in runs at once);
- `loosefs index` of the prefix (writes `.loosefs-index` beside the objects);
- `loosefs mount` of the prefix with its shared listing (a LIST of the first level and a GET).
Each mount returns once the mount answers; it is unmounted before the next.

Run as root from the repository:
  python bench/listing.py --keys 100000 --dirs 100 --latency 20
"""
import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import servers  # noqa: E402

BIN = ROOT / "target" / "release" / "loosefs"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--dirs", type=int, default=100)
    ap.add_argument("--latency", type=float, default=20, help="ms per request")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-listing-bench-"))
    weed = servers.Seaweed(work / "weed")
    weed.start()
    try:
        c = weed.client()
        keys = [f"many/d{k % a.dirs:04d}/f{k:07d}.bin" for k in range(a.keys)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda k: c.put_object(Bucket=weed.bucket, Key=k, Body=k.encode()), keys))
        print(f"uploaded {len(keys)} objects in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        env = dict(os.environ, AWS_ACCESS_KEY_ID=servers.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=servers.SECRET_KEY,
                   AWS_EC2_METADATA_DISABLED="true")
        proxy = servers.FaultProxy(weed.port, latency=a.latency / 1000).start()
        ep = ["--endpoint-url", f"http://127.0.0.1:{proxy.port}", "--allow-http"]
        url = f"s3://{weed.bucket}/many/"
        rows = {}

        def timed(name, fn):
            r0, t0 = proxy.requests, time.monotonic()
            fn()
            rows.setdefault(name, []).append((time.monotonic() - t0, proxy.requests - r0))

        lc = weed.client(endpoint=f"http://127.0.0.1:{proxy.port}")

        def list_alone():
            n = 0
            for page in lc.get_paginator("list_objects_v2").paginate(Bucket=weed.bucket, Prefix="many/"):
                n += len(page.get("Contents", []))
            assert n >= len(keys), n

        def mount(i):
            mnt = work / f"mnt{i}"
            mnt.mkdir()
            r = subprocess.run([BIN, "mount", url, mnt, *ep, "--cache-dir", work / f"cache{i}"], env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(r.stderr)
            return mnt

        def umount(mnt):
            subprocess.run([BIN, "umount", mnt], check=True)

        i = 0
        for _ in range(a.repeat):
            timed("LIST requests alone (sequential pages)", list_alone)
            i += 1
            mnt = [None]
            timed("mount, listed (no shared listing)", lambda: mnt.__setitem__(0, mount(i)))
            assert sum(1 for _ in (mnt[0] / "d0000").iterdir()) == len([k for k in keys if "/d0000/" in k])
            umount(mnt[0])
        for _ in range(a.repeat):
            timed("loosefs index (writes the shared listing)",
                  lambda: subprocess.run([BIN, "index", url, *ep], env=env, check=True, capture_output=True))
        for _ in range(a.repeat):
            i += 1
            timed("mount with the shared listing", lambda: mnt.__setitem__(0, mount(i)))
            assert sum(1 for _ in (mnt[0] / "d0000").iterdir()) == len([k for k in keys if "/d0000/" in k])
            umount(mnt[0])
        print(f"{a.keys} keys in {a.dirs} subdirectories, {a.latency:g} ms per request, medians of {a.repeat}")
        print("| step | seconds | requests |")
        print("|---|---|---|")
        for name, rs in rows.items():
            print(f"| {name} | {statistics.median(r[0] for r in rs):.2f} | {statistics.median(r[1] for r in rs):.0f} |")
        proxy.stop()
    finally:
        weed.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
