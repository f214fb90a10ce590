#!/usr/bin/env python3
"""What one FUSE request costs (issue 25's first measurement): `loosefs-request-cost` (see
bench/request_cost.rs) on a loosefs mount of a pack of DATA, 1 and 4 client threads, with the
daemon's CPU and context switches per call, against the same calls on DATA itself (ext4 or
whatever holds it; warm: its page cache holds the file). Prints a Markdown table.

Run as root from the repository: python bench/request_cost.py [--data DIR] [--iters N]
[--transports classic,uring]
"""
import argparse
import json
import pathlib
import re
import shutil
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "loosefs"
COST = ROOT / "target" / "release" / "loosefs-request-cost"


def run(d, *extra):
    r = subprocess.run([str(COST), "--dir", str(d), *extra], check=True, capture_output=True, text=True)
    return {j["op"]: j for j in map(json.loads, r.stdout.splitlines())}


def measure(pack, mnt, transport, data, iters):
    """Rows of one mount of `pack` with `--transport transport`."""
    out = subprocess.run([str(BIN), "mount", str(pack), str(mnt), "--transport", transport],
                         check=True, capture_output=True, text=True)
    pid = re.search(r"daemon pid (\d+)", out.stderr + out.stdout).group(1)
    rows = {}
    try:
        stats = json.loads((mnt / ".loosefs" / "stats").read_text())
        assert stats["daemon"]["transport"]["kind"] == transport, stats["daemon"]["transport"]
        for t in ["1", "4"]:
            rows[("mount", t)] = run(mnt, "--pid", pid, "--iters", iters, "--threads", t)
            rows[("mount warm", t)] = run(mnt, "--pid", pid, "--iters", iters, "--threads", t, "--warm",
                                          "--ops", "read4k,read128k")
    finally:
        subprocess.run([str(BIN), "umount", str(mnt)], check=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("--iters", default="20000")
    uring = pathlib.Path("/sys/module/fuse/parameters/enable_uring").exists()
    ap.add_argument("--transports", default="classic,uring" if uring else "classic",
                    help="mount --transport values, measured one after the other in this run")
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-request-cost-"))
    try:
        pack, mnt = work / "data.pack", work / "mnt"
        mnt.mkdir()
        subprocess.run([str(BIN), "pack", a.data, str(pack), "--json"], check=True, stdout=subprocess.DEVNULL)
        transports = a.transports.split(",")
        rows = {tr: measure(pack, mnt, tr, a.data, a.iters) for tr in transports}
        for t in ["1", "4"]:
            rows[("dir", t)] = run(a.data, "--iters", a.iters, "--threads", t, "--warm")
        print("| call (request) | threads | transport | mount: µs per call | calls/s | client CPU µs | daemon CPU µs | daemon switches | same call on the directory: µs |")
        print("|---|---|---|---|---|---|---|---|---|")
        names = {"ioctl": "ioctl TCGETS (IOCTL)", "lookup": "stat of a missing name (LOOKUP)",
                 "getattr": "statx FORCE_SYNC (GETATTR)", "dontneed": "fadvise DONTNEED (none)",
                 "read4k": "DONTNEED + pread 4 KiB (READ 4 KiB)", "read128k": "DONTNEED + pread 128 KiB (READ 128 KiB)",
                 "open": "open + close (none: answered by the kernel)"}
        for op, name in names.items():
            for t in ["1", "4"]:
                for tr in transports:
                    m, d = rows[tr][("mount", t)][op], rows[("dir", t)][op]
                    print(f"| {name} | {t} | {tr} | {m['wall_ns_per_call']/1e3:.1f} | {m['calls_per_s']:,.0f} | "
                          f"{m['client_cpu_ns_per_call']/1e3:.1f} | {m['daemon_cpu_ns_per_call']/1e3:.1f} | "
                          f"{m['daemon_switches_per_call']:.2f} | {d['wall_ns_per_call']/1e3:.2f} (warm) |")
        for op in ["read4k", "read128k"]:
            for t in ["1", "4"]:
                for tr in transports:
                    m, d = rows[tr][("mount warm", t)][op], rows[("dir", t)][op]
                    print(f"| pread {'4' if op == 'read4k' else '128'} KiB, page cache holds it (none) | {t} | {tr} | "
                          f"{m['wall_ns_per_call']/1e3:.2f} | {m['calls_per_s']:,.0f} | {m['client_cpu_ns_per_call']/1e3:.2f} | "
                          f"{m['daemon_cpu_ns_per_call']/1e3:.1f} | {m['daemon_switches_per_call']:.2f} | {d['wall_ns_per_call']/1e3:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
