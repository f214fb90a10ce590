#!/usr/bin/env python3
"""Remote packs against a capped link (issue 12's targets), all servers on 127.0.0.1.

SeaweedFS (S3) holds the pack and, for comparison, every file as its own object; the fault
proxy of tests/e2e/servers.py sits between the clients and it with a bandwidth cap (`--cap`,
MB/s, shared by all connections) and added latency per request (`--latency`, ms). Measured in
one run, each pass timed by the compiled reader (`loosefs-reader`, 4 threads):

1. cold epoch in pack order: fresh block cache, mount, read every file;
2. shuffled epoch after `--warm --wait` (the clock includes the mount and the warm);
   baseline: the same files as loose objects, one GET each, 8 threads (boto3), shuffled;
3. second epoch from the block cache (remount, page cache dropped) against the local pack
   mounted and read the same way (page cache dropped), alternated `--repeat` times (medians);
4. `--big PACK`: mount time of a large remote pack (fresh cache: tail GET + index GET) against
   2 round trips + the index's transfer time at the cap;
5. announced orders (fresh cache each, no warm): a shuffled cold epoch with and without the
   order announced (`loosefs-reader --announce`; a wrong one: another seed's), against the cap; a rank of 8 (the first 1/8
   of a shuffled epoch) with and without its order, bytes received ÷ the bytes of its samples.
6. `--formats mds,litdata,webdataset`: the same samples written by each format's own writer
   (bench/formats.py's writers) under `s3://packs/fmt/<format>/`: the first mount without a
   shared index (downloads and indexes) then an epoch in storage order; `loosefs index` (proxy
   bypassed); then, on a fresh cache and index directory each (another node), a cold epoch in
   storage order and a shuffled epoch after `--warm --wait` (clock from the mount's start).

Ratios are against the cap (1–2) or the baseline of the same run (2–3). Cold figures for the
local pack depend on the disk's mood: the dd line says which.

Run as root from the repository:
  python bench/remote.py --data ../shared/data/imagenet-sample --cap 40 --latency 20
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import servers  # noqa: E402

BIN = str(ROOT / "target" / "release" / "loosefs")
READER = str(ROOT / "target" / "release" / "loosefs-reader")


def env():
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    e.update(AWS_ACCESS_KEY_ID=servers.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=servers.SECRET_KEY,
             AWS_EC2_METADATA_DISABLED="true")
    return e


def drop_caches():
    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)


def mount(src, mnt, *args):
    t = time.time()
    subprocess.run([BIN, "mount", src, str(mnt), *args], check=True, env=env(), stderr=subprocess.DEVNULL)
    return time.time() - t


def umount(mnt):
    subprocess.run([BIN, "umount", str(mnt)], check=True)


def read(mnt, order="inorder", threads=4, *extra):
    r = subprocess.run([READER, "--root", str(mnt), "--threads", str(threads), "--order", order, "--seed", "1",
                        *extra], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def remote_stats(mnt):
    r = subprocess.run([BIN, "stats", str(mnt), "--json"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)["remote"]


def ordered_passes(url, mnt, ep, work, cap, n_files):
    """Section 5: announced orders over a fresh block cache each, no warm."""
    out = {}
    for name, extra in [("shuffled_no_order", []), ("shuffled_order", ["--announce"]),
                        ("shuffled_wrong_order", ["--announce", "--announce-seed", "2"]),
                        ("rank8_no_order", ["--limit", str(n_files // 8)]),
                        ("rank8_order", ["--limit", str(n_files // 8), "--announce"])]:
        cache = work / f"cache5-{name}"
        shutil.rmtree(cache, ignore_errors=True)
        t = time.time()
        mount(url, mnt, *ep, "--cache-dir", str(cache))
        tm = time.time() - t
        before = remote_stats(mnt)["bytes_received"]
        r = read(mnt, "shuffled", 4, *extra)
        st = remote_stats(mnt)
        umount(mnt)
        got = st["bytes_received"] - before
        out[name] = dict(files=r["files"], seconds=r["seconds"], files_per_s=r["files"] / r["seconds"],
                         ratio_to_cap=r["bytes"] / 1e6 / r["seconds"] / cap,
                         ratio_to_cap_incl_mount=r["bytes"] / 1e6 / (r["seconds"] + tm) / cap,
                         bytes_read=r["bytes"], bytes_received=got, received_per_read=got / r["bytes"],
                         exact_gets=st.get("exact_gets", 0), gets=st["gets"])
    return out


def foreign_passes(weed, proxy, work, data, formats, ep, cap):
    """Section 6: foreign datasets by prefix, with and without their shared index."""
    sys.path.insert(0, str(ROOT / "bench"))
    import formats as fm

    mnt = work / "mnt6"
    mnt.mkdir(exist_ok=True)
    out = {}
    for name in formats:
        src = work / f"fmt-{name}"
        if not src.exists():
            fm.WRITERS[name](fm.tree(str(data)), src)
        for p in sorted(src.rglob("*")):
            if p.is_file():
                weed.put(f"fmt/{name}/{p.relative_to(src)}", p)
        url = f"s3://packs/fmt/{name}/"
        size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        res = out[name] = dict(dataset_bytes=size)

        def fresh(tag):
            dirs = [work / f"cache6-{name}-{tag}", work / f"idx6-{name}-{tag}"]
            for d in dirs:  # a node that never mounted it (a reused --work too)
                shutil.rmtree(d, ignore_errors=True)
            return ["--cache-dir", str(dirs[0]), "--index-dir", str(dirs[1])]

        def epoch(tag, order, *extra):
            n0 = proxy.requests
            tm = mount(url, mnt, *ep, *fresh(tag), *extra)
            r = read(mnt, order)
            st = remote_stats(mnt)
            umount(mnt)
            total = tm + r["seconds"]  # from the mount's start to the epoch's end
            res[tag] = dict(mount_s=tm, epoch_s=r["seconds"], files=r["files"], bytes_read=r["bytes"],
                            ratio_to_cap=r["bytes"] / 1e6 / r["seconds"] / cap,
                            ratio_incl_mount=r["bytes"] / 1e6 / total / cap,
                            requests=proxy.requests - n0, bytes_received=st["bytes_received"])

        # No shared index yet (a reused --work keeps the last run's objects).
        weed.client().delete_object(Bucket=weed.bucket, Key=f"fmt/{name}/.loosefs-index")
        epoch("no_shared_index_inorder", "inorder")
        t = time.time()
        subprocess.run([BIN, "index", url, "--endpoint-url", f"http://127.0.0.1:{weed.port}", "--allow-http",
                        *fresh("indexer")], check=True, env=env(), stdout=subprocess.DEVNULL)
        res["index_s"] = time.time() - t
        epoch("shared_index_cold_inorder", "inorder")
        epoch("shared_index_warm_then_shuffled", "shuffled", "--warm", "--wait")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--cap", type=float, default=40.0, help="MB/s")
    ap.add_argument("--latency", type=float, default=20.0, help="ms per request")
    ap.add_argument("--big", default=None, help="a large pack to time the mount of")
    ap.add_argument("--repeat", type=int, default=3, help="alternations of the block-cache vs local pass")
    ap.add_argument("--only-orders", action="store_true", help="run section 5 only")
    ap.add_argument("--mount-arg", action="append", default=[], help="an extra mount option (repeatable)")
    ap.add_argument("--formats", default="", help="section 6 only: comma-separated foreign formats")
    a = ap.parse_args()
    work = pathlib.Path(a.work or tempfile.mkdtemp(prefix="loosefs-remote-"))
    work.mkdir(parents=True, exist_ok=True)
    data = pathlib.Path(a.data)
    pack = work / "data.pack"
    subprocess.run([BIN, "pack", str(data), str(pack), "--json", "--force"], check=True, stdout=subprocess.DEVNULL)
    weed = servers.Seaweed(work / "weed").start()
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    out = {"cap_MBps": a.cap, "latency_ms": a.latency, "mount_args": a.mount_arg}
    try:
        weed.put("data.pack", pack)
        files = sorted(p for p in data.rglob("*") if p.is_file())
        c = weed.client()
        for p in files if not (a.only_orders or a.formats) else []:
            c.upload_file(str(p), weed.bucket, "loose/" + str(p.relative_to(data)))
        proxy = servers.FaultProxy(weed.port, rate=a.cap * 1e6, latency=a.latency / 1e3).start()
        ep = ["--endpoint-url", f"http://127.0.0.1:{proxy.port}", "--allow-http", *a.mount_arg]
        url = "s3://packs/data.pack"
        cap = a.cap

        def ratio(bytes_, seconds):
            return bytes_ / 1e6 / seconds / cap

        if a.formats:
            out["formats"] = foreign_passes(weed, proxy, work, data, a.formats.split(","), ep, cap)
            return
        # 5. Announced orders.
        out["orders"] = ordered_passes(url, mnt, ep, work, cap, len(files))
        if a.only_orders:
            return
        # 1. Cold epoch in pack order.
        cache1 = work / "cache1"
        shutil.rmtree(cache1, ignore_errors=True)
        n0 = proxy.requests
        tm = mount(url, mnt, *ep, "--cache-dir", str(cache1))
        r = read(mnt)
        umount(mnt)
        out["cold_inorder"] = dict(mount_s=tm, seconds=r["seconds"], MBps=r["mb_per_s"],
                                   ratio_to_cap=ratio(r["bytes"], r["seconds"]),
                                   ratio_incl_mount=ratio(r["bytes"], r["seconds"] + tm),
                                   requests=proxy.requests - n0)
        # 2. Shuffled after --warm --wait, clock includes the mount and the warm.
        cache2 = work / "cache2"
        shutil.rmtree(cache2, ignore_errors=True)
        n0 = proxy.requests
        tw = mount(url, mnt, *ep, "--cache-dir", str(cache2), "--warm", "--wait")
        r = read(mnt, "shuffled")
        umount(mnt)
        out["warm_then_shuffled"] = dict(mount_and_warm_s=tw, epoch_s=r["seconds"],
                                         ratio_to_cap=ratio(r["bytes"], tw + r["seconds"]),
                                         requests=proxy.requests - n0)
        # Baseline: loose objects, one GET each, 8 threads, shuffled.
        keys = ["loose/" + str(p.relative_to(data)) for p in files]
        random.Random(1).shuffle(keys)
        pc = weed.client(endpoint=f"http://127.0.0.1:{proxy.port}")
        t = time.time()
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            got = sum(ex.map(lambda k: len(pc.get_object(Bucket=weed.bucket, Key=k)["Body"].read()), keys))
        tl = time.time() - t
        out["loose_objects_shuffled"] = dict(seconds=tl, ratio_to_cap=ratio(got, tl))
        out["warm_then_shuffled"]["vs_loose_objects"] = tl / (tw + r["seconds"])
        # 3. Second epoch from the block cache vs the local pack, page cache dropped.
        cache_runs, local_runs = [], []
        for _ in range(a.repeat):
            mount(url, mnt, *ep, "--cache-dir", str(cache2))
            drop_caches()
            cache_runs.append(read(mnt)["mb_per_s"])
            umount(mnt)
            mount(str(pack), mnt)
            drop_caches()
            local_runs.append(read(mnt)["mb_per_s"])
            umount(mnt)
        drop_caches()
        dd = subprocess.run(["dd", f"if={pack}", "of=/dev/null", "bs=4M"], capture_output=True, text=True).stderr
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        out["second_epoch_from_cache"] = dict(cache_MBps=cache_runs, local_MBps=local_runs,
                                              ratio_of_medians=med(cache_runs) / med(local_runs),
                                              disk_mood_dd=dd.strip().splitlines()[-1])
        # 4. Mount time of a large pack.
        if a.big:
            big = pathlib.Path(a.big)
            weed.put("big.pack", big)
            info = json.loads(subprocess.run([BIN, "info", str(big), "--json"], capture_output=True, text=True,
                                             check=True).stdout)
            cache4 = work / "cache4"
            shutil.rmtree(cache4, ignore_errors=True)
            n0 = proxy.requests
            tb = mount("s3://packs/big.pack", mnt, *ep, "--cache-dir", str(cache4))
            reqs = proxy.requests - n0
            umount(mnt)
            index_bytes = (cache4 / next(os.listdir(cache4).__iter__()) / "index").stat().st_size
            bound = 2 * a.latency / 1e3 + index_bytes / 1e6 / cap
            n0 = proxy.requests
            tb2 = mount("s3://packs/big.pack", mnt, *ep, "--cache-dir", str(cache4))
            reqs2 = proxy.requests - n0
            umount(mnt)
            out["big_mount"] = dict(samples=info["samples"], index_bytes=index_bytes, mount_s=tb, requests=reqs,
                                    bound_s=bound, ratio_to_bound=tb / bound, remount_s=tb2, remount_requests=reqs2)
    finally:
        weed.stop()
        print(json.dumps(out, indent=1))
        if not a.work:  # a directory of its own: nothing in it is kept
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
