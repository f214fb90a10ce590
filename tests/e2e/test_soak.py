"""Soak: 60 s of concurrent readers on a real mount while every cache is emptied again and again.

Eight reader processes, two of each kind (plain read, mmap, numpy.fromfile, random pread
ranges), read random samples and compare every byte with the source (CRC-32 of the expected
range). Every 15 s the test runs `loosefs drop-cache` and `echo 3 > drop_caches`. Passes when
every comparison matched, every reader did work, and the daemon's RSS stayed bounded.
LOOSEFS_SOAK_SECONDS changes the duration.
"""
import json
import mmap
import multiprocessing as mp
import os
import pathlib
import random
import subprocess
import time
import zlib

import numpy as np
import pytest

from conftest import loosefs_bin, need_mount

SECONDS = float(os.environ.get("LOOSEFS_SOAK_SECONDS", "60"))
KINDS = ["read", "mmap", "fromfile", "pread"]


def reader(kind, mnt, files, expected, deadline, seed, out):
    rnd = random.Random(seed)
    done = bad = 0
    while time.time() < deadline:
        rel = rnd.choice(files)
        want = expected[rel]
        path = os.path.join(mnt, rel)
        try:
            if kind == "read":
                with open(path, "rb") as f:
                    ok = zlib.crc32(f.read()) == want[0]
            elif kind == "mmap":
                with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    ok = zlib.crc32(m[:]) == want[0]
            elif kind == "fromfile":
                ok = zlib.crc32(np.fromfile(path, dtype=np.uint8).tobytes()) == want[0]
            else:
                size = want[1]
                off = rnd.randrange(size)
                n = rnd.randrange(1, 200_000)
                fd = os.open(path, os.O_RDONLY)
                try:
                    got = os.pread(fd, n, off)
                finally:
                    os.close(fd)
                ok = zlib.crc32(got) == zlib.crc32(want[2][off:off + n])
        except OSError as e:
            ok = False
            print(f"{kind} {rel}: {e}")
        done += 1
        bad += 0 if ok else 1
    out.put((kind, done, bad))


def test_soak_concurrent_readers_with_cache_drops(source, pack, tmp_path):
    need_mount()
    b = loosefs_bin()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run([b, "mount", str(pack), str(mnt), "--log", str(tmp_path / "daemon.log")], check=True)
    try:
        files = sorted(str(p.relative_to(source)) for p in pathlib.Path(source).rglob("*") if p.is_file())
        data = {rel: (pathlib.Path(source) / rel).read_bytes() for rel in files}
        # (crc, size, bytes) per file; the pread readers slice the bytes.
        expected = {rel: (zlib.crc32(d), len(d), d) for rel, d in data.items()}
        deadline = time.time() + SECONDS
        q = mp.Queue()
        procs = [mp.Process(target=reader, args=(k, str(mnt), files, expected, deadline, i, q))
                 for i, k in enumerate(KINDS * 2)]
        for p in procs:
            p.start()
        peak_rss = 0
        while time.time() < deadline:
            time.sleep(min(15, max(0.0, deadline - time.time())))
            subprocess.run([b, "drop-cache", str(mnt)], check=True, capture_output=True)
            subprocess.run(["sync"], check=True)
            pathlib.Path("/proc/sys/vm/drop_caches").write_text("3")
            stats = json.loads(subprocess.run([b, "stats", str(mnt), "--json"], check=True,
                                              capture_output=True).stdout)
            peak_rss = max(peak_rss, stats["daemon"]["rss_bytes"])
        results = [q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        total = sum(r[1] for r in results)
        bad = sum(r[2] for r in results)
        print(f"soak {SECONDS:.0f} s: {total} reads, {bad} mismatches, daemon RSS peak {peak_rss / 1e6:.1f} MB;"
              f" per reader {[(k, n) for k, n, _ in results]}")
        assert bad == 0, f"{bad} of {total} reads did not match the source"
        assert all(n > 0 for _, n, _ in results), results
        assert peak_rss < 200e6, f"daemon RSS reached {peak_rss / 1e6:.0f} MB"
    finally:
        subprocess.run([b, "umount", str(mnt)], check=True)
