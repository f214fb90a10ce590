#!/usr/bin/env python3
"""loosefs bench harness: reads a dataset through loosefs mounts and as the original loose files,
in the same run, warm and cold, and writes results/<timestamp>/{results.json, results.csv,
results.md, files_per_s.png}.

Targets:  orig (the directory itself), loosefs (default mount), loosefs-warm (--warm: a
          whole-pack warm starts with each cold epoch, and its clock runs from the warm's
          start to the end of the pass, listing included), loosefs-pin
          (--pin all), pread (the same files' byte ranges read straight from the pack with one
          pread each, by the raw reader: the pack's own speed), loosefs-push / loosefs-nopush
          (--push-ahead 64 / 0), loosefs-uring / loosefs-classic (--transport uring / classic:
          FUSE over io_uring / /dev/fuse), loosefs-hint / loosefs-wronghint (the raw reader announces its
          order to <mnt>/.loosefs/order inside the timed pass / announces another seed's
          permutation; loosefs-hint-nopush announces, with --push-ahead 0), loosefs-auto (a
          DataLoader reader, tv<N> or bytes<N>, with LOOSEFS_ANNOUNCE_ORDER=1 and the package's .pth: the
          order announced for unchanged code; raw readers skip it), loosefs-a512 /
          loosefs-a4096 (default mount of a pack made with --align 512 / 4096), loosefs-dir / loosefs-dir-daemon (the directory itself mounted in
          place: FUSE passthrough / --passthrough off).
Readers:  raw<N> (the compiled loosefs-reader: open/read/close per file on N threads),
          tv<N> (torchvision ImageFolder + DataLoader with N workers, standard train transform),
          bytes<N> (ImageFolder + DataLoader with N workers returning each file's encoded bytes,
          as a GPU-decode pipeline's workers do: bound by reads, not by decoding),
          dali (readers.file + CPU decode): bench/loader_pass.py, which also reports first-batch
          latency, CPU seconds and peak RSS of the reader process tree.
Orders:   inorder (pack order), shuffled, block<N> (runs of N consecutive files in random run
          order, as chunk-shuffling samplers read; raw readers only) and workers (DataLoader
          workers over an in-order sampler: reader thread t reads batches t, t+N, ... of 32
          consecutive files; raw readers only).
Profiles: --profiles host,ssd,cloud,hdd runs every scenario on each emulated disk (block throttling
          of the bench, its readers and the daemons: bench/diskprofile.py). Each pass also
          reports the bytes the group read from the disk divided by the bytes served, and each
          profile its bandwidth bound (dd of the pack under it, in files/s). A cold pass runs
          after the same reader has read a one-file tree, so the reader's and the bench's own
          code, read back after drop_caches, are not counted (`disk_reader_bytes` in the JSON).
States:   warm (after a pass), cold (caches emptied: `sync; echo 3 > drop_caches` as root, else
          posix_fadvise(DONTNEED) on every file and the pack, as nocache does; plus
          `loosefs drop-cache`), dropped (drop_caches only: what a pinned pack survives).
Each measurement is repeated (--repeat, default 3), targets alternating within a repetition;
tables give the median and min-max, and ratios against orig's median from the same run.

    bench/run.py --data DIR [--quick] [--repeat 3] [--targets ...] [--readers raw1,raw4]
"""
import argparse
import csv
import datetime
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import diskprofile  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "loosefs"
READER = ROOT / "target" / "release" / "loosefs-reader"
LOADER = ROOT / "bench" / "loader_pass.py"
IS_ROOT = os.geteuid() == 0


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, **kw)


def progress(msg):
    """One progress line: redrawn in place on a terminal, printed plainly otherwise."""
    if sys.stderr.isatty():
        print(f"\r\033[K{msg}", end="", file=sys.stderr, flush=True)
    elif msg:
        print(msg, file=sys.stderr, flush=True)


def files_under(root):
    out = []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        out.extend(os.path.join(d, n) for n in sorted(names))
    return out


class Target:
    def __init__(self, name, path, mount_args=None, pack=None, mnt=None):
        self.name, self.path, self.mount_args, self.pack, self.mnt = name, path, mount_args, pack, mnt
        self.mount_seconds = None

    @property
    def is_loosefs(self):
        return self.mount_args is not None

    def mount(self):
        if not self.is_loosefs:
            return
        self.mnt.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        sh(BIN, "mount", self.pack, self.mnt, *self.mount_args)
        self.mount_seconds = time.perf_counter() - t
        if "--pin" in self.mount_args:  # wait until the pin is complete
            for _ in range(600):
                if self.stats()["pin"]["pinned_bytes"] >= self.stats()["pin"]["target_bytes"] > 0:
                    break
                time.sleep(0.2)

    def umount(self):
        if self.is_loosefs:
            sh(BIN, "umount", self.mnt)

    def stats(self):
        return json.loads(sh(BIN, "stats", self.mnt, "--json").stdout)


def drop_caches(targets, files, pack, full):
    """Empties the page cache of everything read. Returns the method used."""
    if IS_ROOT:
        subprocess.run(["sync"], check=True)
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3")
        method = "drop_caches"
    else:
        for p in files + [str(pack)]:
            try:
                fd = os.open(p, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            except OSError:
                pass
        method = "fadvise-dontneed"
    if full:
        for t in targets:
            if t.is_loosefs:
                sh(BIN, "drop-cache", t.mnt)
        method += "+loosefs-drop-cache"
    return method


def order_args(order):
    """The raw reader's arguments for an order name."""
    if order.startswith("block"):
        return ["--order", "block", "--block", order.removeprefix("block") or "8"]
    return ["--order", order]


def read_pass(target, reader, order, seed, limit):
    """One pass of `reader` over `target`: rawN (compiled, N threads), tvN (ImageFolder +
    DataLoader with N workers) or dali. Returns the reader's JSON result."""
    if reader.startswith("raw"):
        if target.name == "loosefs-auto":
            return None  # the automatic order is Python's: a DataLoader reader only
        args = [READER, "--root", target.path, "--threads", reader.removeprefix("raw"), *order_args(order), "--seed", seed]
        if target.name == "pread":
            args += ["--pack", target.pack]
        if target.name in ("loosefs-hint", "loosefs-hint-nopush"):
            args += ["--announce"]
        if target.name == "loosefs-wronghint":
            args += ["--announce", "--announce-seed", str(int(seed) + 1)]
    elif target.name == "pread" or order not in ("inorder", "shuffled"):
        return None
    else:
        if reader == "dali":
            loader = ["--loader", "dali"]
        elif reader.startswith("bytes"):
            loader = ["--loader", "bytes", "--workers", reader.removeprefix("bytes")]
        else:
            loader = ["--loader", "imagefolder", "--workers", reader.removeprefix("tv")]
        args = [sys.executable, LOADER, "--root", target.path, "--order", order, "--seed", seed, *loader]
    env = None
    if target.name == "loosefs-auto":
        # The loader's script unchanged, the package's .pth processed as an installed wheel's is
        # at start-up, and LOOSEFS_ANNOUNCE_ORDER=1: each epoch's order is announced.
        env = {**os.environ, "LOOSEFS_ANNOUNCE_ORDER": "1", "PYTHONPATH": str(ROOT / "python")}
        boot = ("import runpy, site, sys; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        args = [sys.executable, "-c", boot, ROOT / "python", *args[1:]]
    if limit:
        args += ["--limit", limit]
    try:
        out = sh(*args, env=env).stdout
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.stderr[-4000:])  # the reader's own account of why
        raise
    return json.loads(out.strip().splitlines()[-1])


def importable(module):
    """True when this Python can import `module` (a dotted name; the module itself is not
    imported, its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=pathlib.Path, required=True, help="ImageFolder-like directory")
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "loosefs-bench")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "results")
    ap.add_argument("--targets", default="orig,loosefs,loosefs-warm,loosefs-pin")
    ap.add_argument("--peers", default="squashfs,squashfuse,fuse-zip,ratarmount,archivemount",
                    help="peer tools to compare with ('' for none); see bench/peers.py")
    ap.add_argument("--readers", default="raw1,raw4",
                    help="rawN (compiled, N threads), tvN (ImageFolder+DataLoader, N workers), bytesN (the same, encoded bytes only), dali")
    ap.add_argument("--orders", default="inorder,shuffled")
    ap.add_argument("--states", default="warm,cold,dropped")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="files per pass (0 = all)")
    ap.add_argument("--align", type=int, default=0, help="pack alignment in bytes (0 = pack's default)")
    ap.add_argument("--profiles", default="host", help="disk profiles: host, ssd, cloud, hdd (needs root)")
    ap.add_argument("--quick", action="store_true", help="CI smoke run: 1 repeat, few files, few scenarios")
    a = ap.parse_args()
    if a.quick:
        a.repeat, a.limit = 1, a.limit or 300
        a.readers, a.orders = "raw1", "shuffled"
    for b in (BIN, READER):
        if not b.exists():
            sys.exit(f"bench: {b} missing: run cargo build --release --features bench")
    for r in a.readers.split(","):
        module = "nvidia.dali" if r == "dali" else "torchvision" if r.startswith(("tv", "bytes")) else None
        if module and not importable(module):
            sys.exit(f"bench: reader {r} needs {module}, which {sys.executable} cannot import: run the bench "
                     "with the test venv's Python, `$(scripts/python-env.sh)/bin/python bench/run.py ...`")
    data = a.data.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    pack = a.work / (data.name + ".pack")
    t = time.perf_counter()
    sh(BIN, "pack", data, pack, "--force", *(["--align", str(a.align)] if a.align else []))
    pack_seconds = time.perf_counter() - t
    files = files_under(data)
    # Loader passes (ImageFolder, DataLoader, DALI) report files, not bytes: their served bytes
    # are the tree's mean file size times the files read (exact for a whole epoch).
    mean_file_bytes = sum(os.path.getsize(f) for f in files) / max(1, len(files))
    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = a.out / run_id
    outdir.mkdir(parents=True, exist_ok=True)

    all_targets = {
        "orig": Target("orig", data),
        "loosefs": Target("loosefs", a.work / "m-default", [], pack, a.work / "m-default"),
        "loosefs-warm": Target("loosefs-warm", a.work / "m-warm", [], pack, a.work / "m-warm"),
        "loosefs-pin": Target("loosefs-pin", a.work / "m-pin", ["--pin", "all", "--wait"], pack, a.work / "m-pin"),
        # Push-ahead on and off, whatever the default: what each costs in disk bytes.
        "loosefs-push": Target("loosefs-push", a.work / "m-push", ["--push-ahead", "64"], pack, a.work / "m-push"),
        "loosefs-nopush": Target("loosefs-nopush", a.work / "m-nopush", ["--push-ahead", "0"], pack, a.work / "m-nopush"),
        # The two transports of the kernel's requests, whatever the default.
        "loosefs-uring": Target("loosefs-uring", a.work / "m-uring", ["--transport", "uring"], pack, a.work / "m-uring"),
        "loosefs-classic": Target("loosefs-classic", a.work / "m-classic", ["--transport", "classic"], pack,
                                  a.work / "m-classic"),
        "pread": Target("pread", data, pack=pack),
        # The reader announces its order (<mnt>/.loosefs/order) before reading; the wrong hint
        # announces another seed's permutation.
        # A DataLoader reader with LOOSEFS_ANNOUNCE_ORDER=1 (python/loosefs/autoorder.py).
        "loosefs-auto": Target("loosefs-auto", a.work / "m-auto", [], pack, a.work / "m-auto"),
        "loosefs-hint": Target("loosefs-hint", a.work / "m-hint", [], pack, a.work / "m-hint"),
        "loosefs-hint-nopush": Target("loosefs-hint-nopush", a.work / "m-hintnp", ["--push-ahead", "0"], pack,
                                      a.work / "m-hintnp"),
        "loosefs-wronghint": Target("loosefs-wronghint", a.work / "m-whint", [], pack, a.work / "m-whint"),
        # The directory itself mounted in place: FUSE passthrough (the kernel reads the
        # originals), and the daemon's own reads (--passthrough off).
        "loosefs-dir": Target("loosefs-dir", a.work / "m-dir", ["--passthrough", "on"], data, a.work / "m-dir"),
        "loosefs-dir-daemon": Target("loosefs-dir-daemon", a.work / "m-dird", ["--passthrough", "off"], data,
                                     a.work / "m-dird"),
    }
    # The default mount of packs aligned to 512 bytes or to pages (4 KiB), whatever the default.
    for al in (512, 4096):
        p = a.work / (data.name + f".a{al}.pack")
        all_targets[f"loosefs-a{al}"] = Target(f"loosefs-a{al}", a.work / f"m-a{al}", [], p, a.work / f"m-a{al}")
        if f"loosefs-a{al}" in a.targets.split(","):
            sh(BIN, "pack", data, p, "--force", "--align", str(al))
    targets = [all_targets[n] for n in a.targets.split(",") if n]
    peer_names = [p for p in a.peers.split(",") if p]
    notes = []
    pack_times = {"loosefs pack": pack_seconds}
    if peer_names:
        import peers as peer_mod

        progress("building peer images")
        images, secs, n1 = peer_mod.build_images(data, a.work, files, peer_names)
        pack_times.update(secs)
        peer_targets, n2 = peer_mod.make_peers(peer_names, images, a.work, len(files))
        notes += n1 + n2
        targets += peer_targets
    all_targets_list = targets
    rows, cold_method, dd = [], None, {}
    # A one-file tree each cold pass's reader reads first (its own code and the bench's, read
    # back after drop_caches, ~40 MB here, are then not counted as bytes of the pass).
    primer = a.work / "primer"
    (primer / "class").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files[0], primer / "class" / pathlib.Path(files[0]).name)
    mean_file = sum(os.path.getsize(f) for f in files) / max(1, len(files))
    scenarios = [(s, r, o) for s in a.states.split(",") for r in a.readers.split(",") for o in a.orders.split(",")]
    for profile in a.profiles.split(","):
        group = None
        if profile != "host" or len(a.profiles.split(",")) > 1:
            if not IS_ROOT:
                sys.exit("bench: disk profiles need root")
            group = diskprofile.Group(profile, data)
            group.join()  # the readers and the daemons started from here on are throttled
            notes.append(f"profile {group.describe()}")
        mounted = []
        for tg in all_targets_list:
            try:
                tg.mount()
                mounted.append(tg)
            except subprocess.CalledProcessError as e:
                notes.append(f"{tg.name}: mount failed ({(e.stderr or '').strip()[:200]}): skipped")
        targets = mounted
        try:
            # Sequential limit for cold reads: dd of the pack.
            dd[profile] = []
            if "cold" in a.states:
                for _ in range(a.repeat):
                    drop_caches(targets, files, pack, full=True)
                    t = time.perf_counter()
                    with open(pack, "rb", buffering=0) as f:
                        while f.read(1 << 20):
                            pass
                    dd[profile].append(os.path.getsize(pack) / 1e6 / (time.perf_counter() - t))
            for k, (state, reader, order) in enumerate(scenarios):
                for rep in range(a.repeat):
                    for tg in targets:
                        progress(f"{profile} [{k + 1}/{len(scenarios)}] {state} {reader} {order} rep {rep + 1}/{a.repeat}: {tg.name}")
                        t0 = time.perf_counter()
                        if state == "warm":
                            if read_pass(tg, reader, order, rep, a.limit) is None:
                                continue
                        elif state == "cold":
                            cold_method = drop_caches(targets, files, pack, full=True)
                            primer0 = group.read_bytes() if group else None
                            read_pass(Target("primer", primer), reader, order, rep, a.limit)
                            reader_bytes = group.read_bytes() - primer0 if group else None
                            t0 = time.perf_counter()
                            if tg.name == "loosefs-warm":
                                sh(BIN, "warm", tg.mnt)
                        elif state == "dropped":
                            if read_pass(tg, reader, order, rep, a.limit) is None:
                                continue
                            drop_caches(targets, files, pack, full=False)
                        disk0 = group.read_bytes() if group else None
                        t1 = time.perf_counter()
                        r = read_pass(tg, reader, order, rep, a.limit)
                        if r is None:
                            continue
                        # Wall clock of the pass process: its listing of the tree included.
                        wall = time.perf_counter() - t1
                        row = {"profile": profile, "state": state, "reader": reader, "order": order, "target": tg.name, "rep": rep,
                               **r, "wall_s": wall}
                        if tg.name == "loosefs-warm" and state == "cold":
                            # The clock runs from the start of the warm to the end of the pass.
                            row["files_per_s"] = r["files"] / (wall + (t1 - t0))
                        if "bytes" not in r:
                            row["bytes"] = round(r["files"] * mean_file_bytes)
                            row["bytes_from_mean_size"] = True
                        if group:
                            row["disk_bytes"] = group.read_bytes() - disk0
                            if state == "cold":
                                row["disk_reader_bytes"] = reader_bytes
                            row["disk_ratio"] = row["disk_bytes"] / max(1, row["bytes"])
                        if tg.is_loosefs:
                            st = tg.stats()
                            d = st["daemon"]
                            row["daemon_rss_bytes"], row["daemon_rss_peak_bytes"] = d["rss_bytes"], d["rss_peak_bytes"]
                            row["prefetch_bytes"] = st["prefetch"]["bytes"]
                            row["prefetch_unserved_bytes"] = st["prefetch"].get("unserved_bytes")
                        rows.append(row)
                # Partial results after every scenario: a crash or an interrupt loses nothing.
                (outdir / "rows.partial.json").write_text(json.dumps(rows))
        finally:
            for tg in targets:
                try:
                    tg.umount()
                except subprocess.CalledProcessError as e:
                    print(f"bench: unmount of {tg.mnt} failed: {e.stderr}", file=sys.stderr)
    targets = all_targets_list
    progress("")
    summary = summarise(rows, [t.name for t in targets])
    meta = {
        "run": run_id, "data": str(data), "files": len(files), "pack": str(pack), "pack_bytes": os.path.getsize(pack),
        "pack_seconds": pack_seconds, "cold_method": cold_method, "dd_pack_mb_per_s": dd, "repeat": a.repeat,
        "mean_file_bytes": mean_file,
        "limit": a.limit, "mount_seconds": {t.name: t.mount_seconds for t in targets if t.mount_seconds is not None},
        "pack_seconds_by_tool": pack_times, "notes": notes,
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release},
        "command": " ".join(sys.argv),
    }
    (outdir / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    with open(outdir / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)
    md = markdown(meta, summary, [t.name for t in targets])
    (outdir / "results.md").write_text(md)
    chart(summary, [t.name for t in targets], outdir / "files_per_s.png")
    print(md)
    print(f"results in {outdir}")


def summarise(rows, names):
    out = []
    seen = []
    key_of = lambda r: (r.get("profile", "host"), r["state"], r["reader"], r["order"])  # noqa: E731
    for r in rows:
        k = key_of(r)
        if k not in seen:
            seen.append(k)
    for k in seen:
        entry = {"profile": k[0], "state": k[1], "reader": k[2], "order": k[3], "targets": {}}
        for n in names:
            sel = [r for r in rows if key_of(r) == k and r["target"] == n]
            v = [r["files_per_s"] for r in sel]
            if v:
                t = {"median": statistics.median(v), "min": min(v), "max": max(v)}
                for key in ("p95_us", "p99_us", "first_batch_s", "cpu_s", "max_rss_bytes", "daemon_rss_peak_bytes", "disk_ratio"):
                    vals = [r[key] for r in sel if r.get(key) is not None]
                    if vals:
                        t[key] = statistics.median(vals)
                entry["targets"][n] = t
        base = entry["targets"].get("orig", {}).get("median")
        for n, t in entry["targets"].items():
            t["ratio_vs_orig"] = t["median"] / base if base else None
        out.append(entry)
    return out


def markdown(meta, summary, names):
    lines = [
        f"Run {meta['run']}: {meta['files']} files from `{meta['data']}`, pack {meta['pack_bytes'] / 1e6:.0f} MB "
        f"(packed in {meta['pack_seconds']:.1f} s); {meta['repeat']} repetitions, median (min-max) files/s, "
        f"ratio against the original files in the same run. Cold method: {meta['cold_method']}. "
        "Sequential cold read of the pack (dd), MB/s, and the bandwidth bound it sets in files/s: "
        + "; ".join(f"{p}: {', '.join(f'{x:.0f}' for x in v)} MB/s = {statistics.median(v) * 1e6 / meta['mean_file_bytes']:,.0f} files/s"
                    for p, v in meta["dd_pack_mb_per_s"].items() if v) + ". "
        f"Command: `{meta['command']}`.",
        "",
        "Image build time on the same tree: " + ", ".join(f"{k} {v:.1f} s" for k, v in meta["pack_seconds_by_tool"].items()) + ". "
        "Mount time: " + ", ".join(f"{k} {v:.2f} s" for k, v in meta["mount_seconds"].items()) + ".",
        "",
        *(f"Note: {n}" for n in meta["notes"]),
        "",
        "Cells: median files/s (min–max), **ratio** against orig's median in the same run, and under a"
        " disk profile the bytes read from the disk ÷ bytes served (`disk ×`).",
        "",
        "| profile | state | reader | order | " + " | ".join(names) + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for e in summary:
        cells = []
        for n in names:
            t = e["targets"].get(n)
            if not t:
                cells.append("–")
                continue
            ratio = f" **{t['ratio_vs_orig']:.2f}×**" if t.get("ratio_vs_orig") and n != "orig" else ""
            disk = f", disk {t['disk_ratio']:.2f}×" if t.get("disk_ratio") is not None else ""
            cells.append(f"{t['median']:,.0f} ({t['min']:,.0f}–{t['max']:,.0f}){ratio}{disk}")
        lines.append(f"| {e['profile']} | {e['state']} | {e['reader']} | {e['order']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def chart(summary, names, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib missing, no chart", file=sys.stderr)
        return
    labels = [f"{e['profile']} {e['state']}\n{e['reader']} {e['order']}" for e in summary]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels)), 4.5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        vals = [e["targets"].get(n, {}).get("median", 0) for e in summary]
        ax.bar([x + i * width for x in range(len(labels))], vals, width, label=n)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("files/s (median)")
    ax.set_yscale("log")
    ax.set_title("loosefs vs original files, warm and cold")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
