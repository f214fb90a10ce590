#!/usr/bin/env python3
"""Decoded-views bench: what `--decode ppm` and `--decode npy` buy a decode-bound loader, in one
run on one machine, and writes results/<timestamp>-decode/{results.json, results.md, decode.png}.

Warm (decoded cache and page cache filled by one pass first), the same loops over:
  jpeg-orig      ImageFolder (default PIL loader, no transform) over the original JPEGs
  jpeg-loosefs   the same over a plain loosefs mount (the baseline of the ratios)
  ppm-loosefs    the same code over `--decode ppm` (x.JPEG serves a PPM)
  ppm-ext4       the same over the PPM files written to the local disk (scale reference)
  npy-loosefs    np.load of every .npy of `--decode npy --decoded-only`
  npy-ext4       np.load over the .npy files written to the local disk
Cold (drop_caches + `loosefs drop-cache` before each pass): the compiled reader (4 threads)
reads every .npy of the npy mount, so every file costs a decode; its files/s is compared with
cores x the single-core in-process turbojpeg rate measured in the same run
(`loosefs-reader --op decode --threads 1`). The npy daemon's peak RSS is reported against
its --decode-cache budget.

    bench/decode.py --data ../shared/data/imagenet-sample [--repeat 3] [--limit N]
"""
import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from run import BIN, IS_ROOT, LOADER, READER, ROOT, files_under, progress, sh  # noqa: E402


def loop(root, loader, order, seed, limit):
    args = [sys.executable, LOADER, "--root", root, "--loader", loader, "--order", order, "--seed", seed]
    if limit:
        args += ["--limit", limit]
    return json.loads(sh(*args).stdout.strip().splitlines()[-1])


def raw(root, threads, order, seed, op="read"):
    return json.loads(sh(READER, "--root", root, "--threads", threads, "--order", order, "--seed", seed, "--op", op).stdout)


def drop(mounts):
    if IS_ROOT:
        subprocess.run(["sync"], check=True)
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3")
    for m in mounts:
        sh(BIN, "drop-cache", m)
    return "drop_caches+loosefs-drop-cache" if IS_ROOT else "loosefs-drop-cache only (not root)"


def stats(mnt):
    return json.loads(sh(BIN, "stats", mnt, "--json").stdout)


def med(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=pathlib.Path, default=ROOT.parent / "shared" / "data" / "imagenet-sample")
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "loosefs-bench-decode")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "results")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="samples per warm loop (0 = all)")
    ap.add_argument("--order", choices=["inorder", "shuffled"], default="shuffled")
    ap.add_argument("--decode-cache", default="2G", help="decoded cache budget of the decode mounts")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke run: 1 repetition, 100 samples per warm loop, no local-disk copies")
    a = ap.parse_args()
    if a.quick:
        a.repeat, a.limit = 1, a.limit or 100
    data = a.data.resolve()
    work = a.work
    if work.exists():
        for m in ("m-jpeg", "m-ppm", "m-npy"):
            subprocess.run([str(BIN), "umount", str(work / m)], capture_output=True)
        shutil.rmtree(work)
    work.mkdir(parents=True)
    pack = work / "d.pack"
    sh(BIN, "pack", data, pack)
    budget = a.decode_cache
    mounts = {
        "jpeg-loosefs": (work / "m-jpeg", []),
        "ppm-loosefs": (work / "m-ppm", ["--decode", "ppm", "--decode-cache", budget]),
        "npy-loosefs": (work / "m-npy", ["--decode", "npy", "--decoded-only", "--decode-cache", budget]),
    }
    for mnt, args in mounts.values():
        mnt.mkdir()
        sh(BIN, "mount", pack, mnt, *args)
    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-decode"
    outdir = a.out / run_id
    outdir.mkdir(parents=True, exist_ok=True)
    try:
        # The same decoded bytes on the local disk, copied from the mounts.
        if not a.quick:
            progress("writing the decoded files to the local disk")
            for kind in ("ppm", "npy"):
                src = mounts[f"{kind}-loosefs"][0]
                shutil.copytree(src, work / f"{kind}-ext4", ignore=shutil.ignore_patterns(".loosefs"))
        targets = {
            "jpeg-orig": (data, "folder"),
            "jpeg-loosefs": (mounts["jpeg-loosefs"][0], "folder"),
            "ppm-loosefs": (mounts["ppm-loosefs"][0], "folder"),
            "ppm-ext4": (work / "ppm-ext4", "folder"),
            "npy-loosefs": (mounts["npy-loosefs"][0], "npy"),
            "npy-ext4": (work / "npy-ext4", "npy"),
        }
        if a.quick:
            targets = {n: t for n, t in targets.items() if not n.endswith("-ext4")}
        warm = {n: [] for n in targets}
        for n, (root, loader) in targets.items():
            progress(f"warm-up pass: {n}")
            loop(root, loader, a.order, 99, a.limit)
        for rep in range(a.repeat):
            for n, (root, loader) in targets.items():
                progress(f"warm rep {rep + 1}/{a.repeat}: {n}")
                warm[n].append(loop(root, loader, a.order, rep, a.limit)["files_per_s"])
        warm = {n: med(v) for n, v in warm.items()}
        base = warm["jpeg-loosefs"]["median"]
        for n, t in warm.items():
            t["ratio_vs_jpeg_loosefs"] = t["median"] / base
        npy_stats = stats(mounts["npy-loosefs"][0])
        cold, method = {}, None
        if not a.no_cold:
            single, two, cold_npy, cold_ppm = [], [], [], []
            npy_mnt, ppm_mnt = mounts["npy-loosefs"][0], mounts["ppm-loosefs"][0]
            for rep in range(a.repeat):
                progress(f"cold rep {rep + 1}/{a.repeat}: in-process turbojpeg, 1 and {os.cpu_count()} threads")
                single.append(raw(data, 1, "inorder", rep, "decode")["files_per_s"])
                two.append(raw(data, os.cpu_count(), "inorder", rep, "decode")["files_per_s"])
                progress(f"cold rep {rep + 1}/{a.repeat}: npy mount, 4 readers")
                method = drop([npy_mnt, ppm_mnt])
                cold_npy.append(raw(npy_mnt, 4, a.order, rep)["files_per_s"])
                progress(f"cold rep {rep + 1}/{a.repeat}: ppm mount, 4 readers")
                drop([npy_mnt, ppm_mnt])
                cold_ppm.append(raw(ppm_mnt, 4, a.order, rep)["files_per_s"])
            cores = os.cpu_count()
            s1 = statistics.median(single)
            cold = {
                "turbojpeg_1_thread": med(single),
                f"turbojpeg_{cores}_threads": med(two),
                "npy_mount_raw4": med(cold_npy),
                "ppm_mount_raw4": med(cold_ppm),
                "cores": cores,
                "target_files_per_s": 0.8 * cores * s1,
            }
            for k in ("npy_mount_raw4", "ppm_mount_raw4"):
                cold[k]["ratio_vs_cores_x_single"] = cold[k]["median"] / (cores * s1)
            npy_stats = stats(npy_mnt)
    finally:
        for mnt, _ in mounts.values():
            subprocess.run([str(BIN), "umount", str(mnt)], capture_output=True)
    d = npy_stats["daemon"]
    meta = {
        "run": run_id, "data": str(data), "files": len(files_under(data)), "repeat": a.repeat, "order": a.order,
        "limit": a.limit, "decode_cache": budget, "cold_method": method,
        "npy_daemon": {"rss_bytes": d["rss_bytes"], "rss_peak_bytes": d["rss_peak_bytes"],
                       "cache": npy_stats["decode"]["cache"], "decode_us": npy_stats["decode"]["decode_us"],
                       "decodes": npy_stats["decode"]["decodes"], "hits": npy_stats["decode"]["hits"]},
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release}, "command": " ".join(sys.argv),
    }
    (outdir / "results.json").write_text(json.dumps({"meta": meta, "warm": warm, "cold": cold}, indent=1))
    md = markdown(meta, warm, cold)
    (outdir / "results.md").write_text(md)
    chart(warm, outdir / "decode.png")
    progress("")
    print(md)
    print(f"results in {outdir}")


def markdown(meta, warm, cold):
    mib = lambda b: b / 2**20
    nd = meta["npy_daemon"]
    lines = [
        f"Run {meta['run']}: {meta['files']} files from `{meta['data']}`, {meta['order']}, {meta['repeat']} repetitions "
        f"(median, min-max). Command: `{meta['command']}`.",
        "",
        "Warm (one pass first), files/s, ratio against the same loop over the plain loosefs mount:",
        "",
        "| target | loop | files/s | ratio |",
        "|---|---|---|---|",
    ]
    for n, t in warm.items():
        loop_name = "np.load" if n.startswith("npy") else "ImageFolder, no transform"
        lines.append(f"| {n} | {loop_name} | {t['median']:,.0f} ({t['min']:,.0f}–{t['max']:,.0f}) | "
                     f"**{t['ratio_vs_jpeg_loosefs']:.2f}×** |")
    if cold:
        c = cold
        k = f"turbojpeg_{c['cores']}_threads"
        lines += [
            "",
            f"Cold ({meta['cold_method']}), every .npy / PPM file read once by 4 threads of the compiled reader, so every "
            f"file is a decode; against {c['cores']} cores × the single-core in-process turbojpeg rate of the same run:",
            "",
            "| measure | files/s | ratio to cores × single |",
            "|---|---|---|",
            f"| turbojpeg in-process, 1 thread | {c['turbojpeg_1_thread']['median']:,.0f} ({c['turbojpeg_1_thread']['min']:,.0f}–{c['turbojpeg_1_thread']['max']:,.0f}) | – |",
            f"| turbojpeg in-process, {c['cores']} threads | {c[k]['median']:,.0f} ({c[k]['min']:,.0f}–{c[k]['max']:,.0f}) | "
            f"{c[k]['median'] / (c['cores'] * c['turbojpeg_1_thread']['median']):.2f}× |",
        ]
        for key, label in (("npy_mount_raw4", "npy mount, cold"), ("ppm_mount_raw4", "ppm mount, cold")):
            t = c[key]
            lines.append(f"| {label} | {t['median']:,.0f} ({t['min']:,.0f}–{t['max']:,.0f}) | **{t['ratio_vs_cores_x_single']:.2f}×** |")
    lines += [
        "",
        f"npy daemon at the end: RSS {mib(nd['rss_bytes']):.0f} MiB, peak {mib(nd['rss_peak_bytes']):.0f} MiB, decoded cache "
        f"{mib(nd['cache']['bytes']):.0f} MiB of a {mib(nd['cache']['budget_bytes']):.0f} MiB budget "
        f"({nd['cache']['entries']} images, {nd['cache']['evictions']} evictions); {nd['decodes']} decodes, "
        f"{nd['hits']} cache hits, decode p50 {nd['decode_us']['p50_us']:.0f} µs / p99 {nd['decode_us']['p99_us']:.0f} µs "
        "(power-of-two bucket bounds).",
    ]
    return "\n".join(lines) + "\n"


def chart(warm, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(warm)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, [warm[n]["median"] for n in names],
           color=["#999", "#555", "#1f77b4", "#aec7e8", "#2ca02c", "#98df8a"])
    ax.set_ylabel("samples/s (median, warm)")
    ax.set_title("Decoded views: the same loader loop over JPEG, PPM and .npy")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
