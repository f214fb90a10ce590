#!/usr/bin/env python3
"""Crafted and damaged foreign datasets through the CLI: `info`, `mount` + reading every file,
and `pack`, each under an address-space limit (`ulimit -v`, default 4 GiB).

The variants follow the in-process sweep of `src/formats/hostile.rs`: the real writers' output in
`../shared/data/formats` cut short, with bytes flipped, with 8-byte length fields set to 2^64-1
and 2^62, and with JSON numbers made huge. Each command must either refuse (exit 2, naming the
file it refused) or succeed; a mount must answer every read with the bytes or an error (EIO),
never hang; nothing may panic or be killed by a signal. `info` runs twice: with the format
detected from the content (a refusal must not call a foreign file a damaged loosefs pack) and
with `--format`, which `mount` and `pack` are given. Peak RSS is measured: of the CLI
commands by `getrusage(RUSAGE_CHILDREN)`, of each daemon by its own `stats` (`VmHWM`).

    tests/e2e/hostile.py [--stride N] [--limit-gib 4] [--json OUT]

`--stride N` tries every N-th variant of each file (the test suite's subset); 1 tries all.
"""
import argparse
import json
import re
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
# ../shared/data's formats, else those of the corpus scripts/make-test-data.py made
# ($LOOSEFS_TEST_DATA: a user's clone).
FORMATS = ROOT.parent / "shared" / "data" / "formats"
if (os.environ.get("LOOSEFS_TEST_CLONE_ALONE") == "1" or not FORMATS.is_dir()) \
        and os.environ.get("LOOSEFS_TEST_DATA"):
    FORMATS = pathlib.Path(os.environ["LOOSEFS_TEST_DATA"]) / "formats"
BIN = os.environ.get("LOOSEFS_BIN", str(ROOT / "target" / "release" / "loosefs"))
# The exit code of a source refused as damaged (docs/CONFIGURATION.md, "Exit codes").
DAMAGED = 65

# (fixture inside ../shared/data/formats, --format it is read as)
FIXTURES = [
    ("ffcv/raw.beton", "ffcv"),
    ("ffcv/jpg.beton", "ffcv"),
    ("gulpio", "gulpio"),
    ("hf-parquet", "parquet"),
    ("litdata", "litdata"),
    ("mds", "mds"),
    ("tfrecord", "tfrecord"),
    ("webdataset", "tar"),
    ("zip/images.zip", "zip"),
]

READ_ALL = """
import os, sys
ok = bad = 0
for d, _, fs in os.walk(sys.argv[1]):
    for f in fs:
        try:
            with open(os.path.join(d, f), "rb") as h:
                while h.read(1 << 20):
                    pass
            ok += 1
        except OSError:
            bad += 1
print(ok, bad)
"""


def variants(b):
    """(description, damaged bytes) of `b`, in the order of hostile.rs's `variants`."""
    n = len(b)
    for k in (0, 1, 7, 12, 64, n // 3, n // 2, max(n - 100, 0), max(n - 1, 0)):
        if k < n:
            yield f"truncated at {k}", b[:k]
    at = [n * i // 24 for i in range(24)]
    at += [i for i in range(0, 256, 13) if i < n]
    at += [max(n - 1 - i, 0) for i in range(0, 256, 17)]
    for p in (p for p in at if p < n):
        v = bytearray(b)
        v[p] ^= 0x5A
        yield f"byte {p} flipped", bytes(v)
        for what, word in (("2^64-1", (1 << 64) - 1), ("2^62", 1 << 62)):
            v = bytearray(b)
            end = min(p + 8, n)
            v[p:end] = word.to_bytes(8, "little")[: end - p]
            yield f"{what} at byte {p}", bytes(v)
    try:
        s = b.decode()
    except UnicodeDecodeError:
        return
    starts = [i for i, c in enumerate(s) if c.isascii() and c.isdigit() and (i == 0 or not s[i - 1].isdigit())][:24]
    for i in starts:
        j = i
        while j < len(s) and s[j].isascii() and s[j].isdigit():
            j += 1
        for huge in ("18446744073709551615", "4611686018427387904", "99999999999999999999999"):
            yield f"number at {i} set to {huge}", (s[:i] + huge + s[j:]).encode()


class Sweep:
    """Runs the commands and collects what went wrong (`failures`) and what was measured."""

    def __init__(self, limit_bytes, work):
        self.limit, self.work = limit_bytes, pathlib.Path(work)
        self.failures, self.counts = [], {"variants": 0, "refused": 0, "info_ok": 0, "mounted": 0,
                                          "files_read": 0, "files_eio": 0, "packed": 0, "pack_refused": 0}
        self.daemon_peak = 0

    def _limit(self):
        resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))

    def run(self, *args, timeout=300):
        try:
            return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                                  preexec_fn=self._limit)
        except subprocess.TimeoutExpired:
            return None

    def check(self, what, cmd, r, names):
        """An answer is exit 0, or exit 65 (the source is damaged: docs/CONFIGURATION.md, exit
        codes) with one of `names` (the damaged file) in its message."""
        if r is None:
            self.failures.append(f"{what}: {cmd} timed out")
        elif r.returncode not in (0, DAMAGED) or "panicked" in r.stderr:
            self.failures.append(f"{what}: {cmd} exit {r.returncode}: {r.stderr.strip()[-300:]}")
        elif r.returncode == DAMAGED and not any(n in r.stderr for n in names):
            self.failures.append(f"{what}: {cmd} refused without naming the file: {r.stderr.strip()[:300]}")
        return r is not None and r.returncode == 0

    def variant(self, what, src, fmt, names, cut=False):
        """`cut`: a zip without its end record, which may be a pack cut short (so a refusal
        may say why it is not a pack)."""
        self.counts["variants"] += 1
        tmp = pathlib.Path(tempfile.mkdtemp(dir=self.work))
        try:
            idx, mnt, out = tmp / "index", tmp / "mnt", tmp / "out.pack"
            common = ["--format", fmt, "--index-dir", idx]
            # As a user meets it first: the format detected from the content.
            r = self.run("info", src, "--index-dir", tmp / "detected")
            self.check(what, "info (detected)", r, names)
            if r is not None and re.search(r"error: \S+: not a loosefs pack", r.stderr) and not cut:
                self.failures.append(f"{what}: refused as a loosefs pack: {r.stderr.strip()[:300]}")
            if not self.check(what, "info", self.run("info", src, *common), names):
                self.counts["refused"] += 1
            else:
                self.counts["info_ok"] += 1
                mnt.mkdir()
                if self.check(what, "mount", self.run("mount", src, mnt, *common), names):
                    self.counts["mounted"] += 1
                    self.read_all(what, mnt)
            if self.check(what, "pack", self.run("pack", src, out, *common, "--force"), names):
                self.counts["packed"] += 1
                r = self.run("verify", out)
                if r is None or r.returncode != 0:
                    self.failures.append(f"{what}: a pack written exit 0 fails verify: {r and r.stdout + r.stderr}")
            else:
                self.counts["pack_refused"] += 1
                if out.exists():
                    self.failures.append(f"{what}: a refused pack left {out}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def read_all(self, what, mnt):
        try:
            try:
                r = subprocess.run([sys.executable, "-c", READ_ALL, str(mnt)], capture_output=True, text=True, timeout=300)
                ok, bad = map(int, r.stdout.split())
                self.counts["files_read"] += ok
                self.counts["files_eio"] += bad
            except (subprocess.TimeoutExpired, ValueError) as e:
                self.failures.append(f"{what}: reading the mount: {e}")
            s = self.run("stats", mnt, "--json", timeout=60)
            if s is not None and s.returncode == 0:
                self.daemon_peak = max(self.daemon_peak, json.loads(s.stdout)["daemon"]["rss_peak_bytes"])
            else:
                self.failures.append(f"{what}: stats of the mount failed: {s and s.stderr}")
        finally:
            r = self.run("umount", mnt, timeout=60)
            if r is None or r.returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
                self.failures.append(f"{what}: umount failed: {r and r.stderr}")

    def fixture(self, rel, fmt, stride):
        tmp = pathlib.Path(tempfile.mkdtemp(dir=self.work))
        try:
            src = tmp / pathlib.Path(rel).name
            orig = FORMATS / rel
            if orig.is_dir():
                shutil.copytree(orig, src)
                files = sorted(p for p in src.iterdir() if p.is_file())
            else:
                shutil.copyfile(orig, src)
                files = [src]
            for p in [src, *files]:
                p.chmod(0o755 if p.is_dir() else 0o644)
            for f in files:
                good = f.read_bytes()
                for k, (what, bad) in enumerate(variants(good)):
                    if k % stride:
                        continue
                    f.write_bytes(bad)
                    cut = fmt == "zip" and b"PK\x05\x06" not in bad[-(64 << 10):]
                    self.variant(f"{rel}: {f.name} {what}", src, fmt, [f.name, src.name], cut)
                f.write_bytes(good)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def peak(self):
        """The largest peak RSS of any CLI command or daemon, bytes."""
        return max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10, self.daemon_peak)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--limit-gib", type=float, default=4)
    ap.add_argument("--work", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()
    t = time.perf_counter()
    s = Sweep(int(a.limit_gib * (1 << 30)), a.work)
    for rel, fmt in FIXTURES:
        s.fixture(rel, fmt, a.stride)
        print(f"{rel}: {s.counts}", file=sys.stderr)
    r = {"counts": s.counts, "peak_rss_bytes": s.peak(), "seconds": time.perf_counter() - t, "failures": s.failures}
    print(json.dumps(r, indent=1))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1))
    sys.exit(1 if s.failures else 0)


if __name__ == "__main__":
    main()
