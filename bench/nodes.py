#!/usr/bin/env python3
"""N nodes reading one S3 dataset (issue 46): what a data-parallel epoch costs the object store.

Each emulated node is its own loosefs mount with its own block cache of one S3 dataset on
SeaweedFS (`--sources`: `pack`, the sample packed; `mds`, the same images written by MDS's own
writer with the shared index `loosefs index` wrote beside it; `loose`, every file its own object
under a prefix with the shared listing beside it), behind the fault proxy of tests/e2e/servers.py (`--cap` MB/s shared by all nodes, as a storage
link is, and `--latency` ms per request). For N in `--nodes` (1, 2, 4, 8):

1. the N mounts are made one after another on fresh caches: each node's mount time and the
   requests it made (counted at the proxy);
2. one DDP-style epoch: every rank r reads its share of one shuffled order (files r, r+N, ...,
   as DistributedSampler splits it; `loosefs-reader --share r/N`, 4 threads), all ranks at
   once, each with its share announced (`--announce`) or not (`--no-order` adds that pass).

Reported per N: requests and bytes at the server for the epoch (÷ the dataset's bytes), each
node's mount requests and seconds, each rank's bytes received ÷ its share's bytes (worst rank),
and the epoch's wall time against the link's bound (the dataset's bytes at the cap).

The nodes share this machine's CPU and the proxy's one link; they are separate processes with
separate caches and no shared state, not separate network namespaces (the figures measured here
— requests and bytes — do not depend on the network path).

Run as root from the repository:
  python bench/nodes.py --data ../shared/data/imagenet-sample --cap 100 --latency 20 --sources pack,mds,loose
"""
import argparse
import concurrent.futures
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
import servers  # noqa: E402
from remote import BIN, READER, env, remote_stats  # noqa: E402


def epoch(mnts, announce: bool, seed: int):
    """Every rank reads its share at once; (wall seconds, per-rank reader results)."""
    n = len(mnts)

    def rank(r):
        extra = ["--announce"] if announce else []
        out = subprocess.run([READER, "--root", str(mnts[r]), "--threads", "4", "--order", "shuffled", "--seed",
                              str(seed), "--share", f"{r}/{n}", *extra],
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    t = time.time()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        res = list(ex.map(rank, range(n)))
    return time.time() - t, res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--cap", type=float, default=100.0, help="MB/s, shared by all nodes")
    ap.add_argument("--latency", type=float, default=20.0, help="ms per request")
    ap.add_argument("--no-order", action="store_true", help="also run the epoch without announcing the shares")
    ap.add_argument("--sources", default="pack", help="pack, mds (with its shared index), loose (with its listing)")
    ap.add_argument("--mds", default=str(ROOT.parent / "shared" / "data" / "formats" / "mds"))
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-nodes-"))
    data = pathlib.Path(a.data)
    pack = work / "data.pack"
    subprocess.run([BIN, "pack", str(data), str(pack), "--force"], check=True, stdout=subprocess.DEVNULL)
    dataset_bytes = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    weed = servers.Seaweed(work / "weed").start()
    out = {"cap_MBps": a.cap, "latency_ms": a.latency, "dataset_bytes": dataset_bytes,
           "files": sum(1 for p in data.rglob("*") if p.is_file()), "runs": []}
    mnts = []
    try:
        direct = ["--endpoint-url", weed.endpoint, "--allow-http"]
        urls, stored = {}, {}
        for src in a.sources.split(","):
            if src == "pack":
                weed.put("data.pack", pack)
                urls[src] = "s3://packs/data.pack"
                stored[src] = dataset_bytes
            elif src == "mds":
                for f in sorted(pathlib.Path(a.mds).rglob("*")):
                    if f.is_file():
                        weed.put("mds/" + str(f.relative_to(a.mds)), f)
                urls[src] = "s3://packs/mds/"
                stored[src] = sum(f.stat().st_size for f in pathlib.Path(a.mds).rglob("*") if f.is_file())
            elif src == "loose":
                c = weed.client()
                for f in sorted(data.rglob("*")):
                    if f.is_file():
                        c.upload_file(str(f), weed.bucket, "loose/" + str(f.relative_to(data)))
                urls[src] = "s3://packs/loose/"
                stored[src] = dataset_bytes
            else:
                raise SystemExit(f"--sources: unknown {src}")
            if src != "pack":  # the shared index, written once, straight to the server
                subprocess.run([BIN, "index", urls[src], *direct, "--cache-dir", str(work / "index-cache")],
                               check=True, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proxy = servers.FaultProxy(weed.port, rate=a.cap * 1e6, latency=a.latency / 1e3).start()
        ep = ["--endpoint-url", f"http://127.0.0.1:{proxy.port}", "--allow-http"]
        for src, n in [(src, int(x)) for src in urls for x in a.nodes.split(",")]:
            for announce in [True, False] if a.no_order else [True]:
                mnts, mounts = [], []
                for r in range(n):
                    m = work / f"mnt{r}"
                    m.mkdir(exist_ok=True)
                    cache = work / f"cache{r}"
                    shutil.rmtree(cache, ignore_errors=True)
                    shutil.rmtree(work / f"index{r}", ignore_errors=True)
                    q0, t = proxy.requests, time.time()
                    subprocess.run([BIN, "mount", urls[src], str(m), *ep, "--cache-dir", str(cache),
                                    "--index-dir", str(work / f"index{r}")],
                                   check=True, env=env(), stderr=subprocess.DEVNULL)
                    mounts.append(dict(seconds=time.time() - t, requests=proxy.requests - q0))
                    mnts.append(m)
                before = [remote_stats(m)["bytes_received"] for m in mnts]
                q0 = proxy.requests
                wall, res = epoch(mnts, announce, seed=7)
                reqs = proxy.requests - q0
                got = [remote_stats(m)["bytes_received"] - b for m, b in zip(mnts, before)]
                for m in mnts:
                    subprocess.run([BIN, "umount", str(m)], check=True)
                mnts = []
                bound_s = stored[src] / 1e6 / a.cap
                run = dict(source=src, nodes=n, announced=announce, epoch_s=wall, bound_s=bound_s,
                           ratio_to_bound=bound_s / wall, epoch_requests=reqs,
                           server_bytes_per_dataset=sum(got) / stored[src],
                           worst_rank_bytes_per_share=max(g / r["bytes"] for g, r in zip(got, res)),
                           files_read=sum(r["files"] for r in res),
                           max_mount_requests=max(m["requests"] for m in mounts),
                           max_mount_s=max(m["seconds"] for m in mounts))
                out["runs"].append(run)
                print(json.dumps(run), flush=True)
    finally:
        for m in mnts:
            subprocess.run([BIN, "umount", str(m)])
        weed.stop()
        print(json.dumps(out, indent=1))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
