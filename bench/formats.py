#!/usr/bin/env python3
"""Foreign formats against a native pack of the same samples (issue 11's targets).

1. Writes an ImageFolder tree (`--data`) with each format's own writer (webdataset ShardWriter,
   tfrecord TFRecordWriter, MosaicML MDSWriter, LitData optimize) into WORK/<format>, once.
2. Packs each format's mount tree into a native pack (`loosefs pack WORK/<format> ...`: same
   files, same order) and mounts both.
3. Reads every file with the compiled reader (`loosefs-reader`, N threads, in order and
   shuffled), warm (second pass after a first) and cold (`sync; drop_caches` and a fresh
   mount before the pass), `--repeat` times; prints files/s and the ratio to the native pack
   measured in the same run.
4. `--index-scale N`: writes an N-sample WebDataset (one small real JPEG repeated, 1,000
   samples per shard), then times the first `loosefs info` (scan + index build) and the second
   (index loaded), and a second `loosefs mount` (from start to the mount answering).

5. `--chunk-rss SRC`: the daemon's peak and idle RSS over a compressed source under each
   `--chunk-budgets` value, `--threads` shuffled readers (`--formats ''` to run it alone).

Run as root from the repository: python bench/formats.py --data /work/bench30k --work /work/fmtbench
The machine's disk mood changes cold figures: say which (dd of a pack) when quoting them.
"""
import argparse
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "loosefs"
READER = ROOT / "target" / "release" / "loosefs-reader"


def tree(data):
    classes = sorted(d for d in os.listdir(data) if os.path.isdir(os.path.join(data, d)))
    out = []
    for label, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(data, c))):
            out.append((label, c, f, os.path.join(data, c, f)))
    return out


def write_webdataset(samples, out):
    import webdataset as wds

    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=1000, verbose=0) as w:
        for label, c, f, p in samples:
            w.write({"__key__": f"{c}_{os.path.splitext(f)[0]}", "jpg": open(p, "rb").read(), "cls": label, "txt": c})


def write_tfrecord(samples, out):
    import tfrecord

    out.mkdir(parents=True)
    per = 5000
    for k in range(0, len(samples), per):
        w = tfrecord.TFRecordWriter(str(out / f"train-{k // per:05d}"))
        for label, c, f, p in samples[k:k + per]:
            w.write({
                "image/encoded": (open(p, "rb").read(), "byte"),
                "image/class/label": (label + 1, "int"),
                "image/class/synset": (c.encode(), "byte"),
                "image/filename": (f.encode(), "byte"),
            })
        w.close()


def write_mds(samples, out):
    from PIL import Image
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"image": "jpeg", "label": "int", "synset": "str"}, size_limit=64 << 20) as w:
        for label, c, f, p in samples:
            w.write({"image": Image.open(p), "label": label, "synset": c})


def write_mds_zstd(samples, out):
    from PIL import Image
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"image": "jpeg", "label": "int", "synset": "str"}, compression="zstd", size_limit=64 << 20) as w:
        for label, c, f, p in samples:
            w.write({"image": Image.open(p), "label": label, "synset": c})


def write_zip_deflated(samples, out):
    import zipfile

    out.mkdir(parents=True)
    with zipfile.ZipFile(out / "train.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for label, c, f, p in samples:
            z.write(p, f"{c}/{f}")


def decompress_bound(fmt, src):
    """Decompressed bytes per second of one core over the whole source (the codec's own C
    library through Python), times the cores: the bound the issue sets for compressed formats."""
    t0 = time.time()
    n = 0
    if fmt == "mds-zstd":
        import zstd

        for f in sorted(src.glob("*.zstd")):
            n += len(zstd.decompress(f.read_bytes()))
    elif fmt == "zip-deflated":
        import zipfile

        with zipfile.ZipFile(src) as z:
            for i in z.infolist():
                n += len(z.read(i))
    secs = time.time() - t0
    return n / secs * os.cpu_count(), n


def _litdata_item(s):
    from PIL import Image

    label, c, f, p = s
    return (Image.open(p), label, c)


def write_litdata(samples, out):
    from litdata import optimize

    optimize(fn=_litdata_item, inputs=samples, output_dir=str(out), chunk_bytes="64MB", num_workers=1)


WRITERS = {
    "webdataset": write_webdataset,
    "tfrecord": write_tfrecord,
    "mds": write_mds,
    "litdata": write_litdata,
    "mds-zstd": write_mds_zstd,
    "zip-deflated": write_zip_deflated,
}


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, **kw)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def mount(src, mnt, index_dir):
    mnt.mkdir(parents=True, exist_ok=True)
    sh(BIN, "mount", src, mnt, "--index-dir", index_dir)


def umount(mnt):
    subprocess.run([str(BIN), "umount", str(mnt)], capture_output=True)


def read_pass(mnt, order, threads):
    r = sh(READER, "--root", mnt, "--threads", threads, "--order", order)
    return json.loads(r.stdout)


def bench_formats(a):
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    index_dir = work / "index"
    samples = tree(a.data)
    results = []
    for fmt in a.formats.split(","):
        src = work / fmt
        if not (src / ".written").exists():
            if src.exists():
                subprocess.run(["rm", "-rf", str(src)], check=True)
            t0 = time.time()
            WRITERS[fmt](samples, src)
            (src / ".written").write_text(f"{time.time() - t0:.1f}")
            print(f"{fmt}: written by its writer in {time.time() - t0:.1f} s", file=sys.stderr)
        if fmt == "zip-deflated":
            src = src / "train.zip"  # the writer's directory holds the archive
        info = json.loads(sh(BIN, "info", src, "--json", "--index-dir", index_dir).stdout)
        bound = None
        if fmt in ("mds-zstd", "zip-deflated"):
            drop_caches()
            bound, _ = decompress_bound(fmt, src)
            print(f"{fmt}: decompressor bound {bound / 1e6:.0f} MB/s ({os.cpu_count()} cores x one core's speed, page cache warm after the first file)", flush=True)
        pack = work / f"{fmt}.pack"
        if not pack.exists():
            sh(BIN, "pack", src, pack)
        for state in a.states.split(","):
            for order in a.orders.split(","):
                for rep in range(a.repeat):
                    row = {"format": fmt, "state": state, "order": order, "rep": rep, "samples": info["samples"], "sample_bytes": info["sample_bytes"], "bound_bytes_per_s": bound}
                    targets = [("pack", pack), (fmt, src)]
                    if rep % 2:
                        targets.reverse()  # neither target always goes first
                    for target, path in targets:
                        mnt = work / "mnt"
                        if state == "cold":
                            drop_caches()
                        mount(path, mnt, index_dir)
                        try:
                            if state == "warm":
                                # A warm pass of 30k files lasts a third of a second: the
                                # median of three passes after a first that warms.
                                read_pass(mnt, order, a.threads)
                                runs = sorted((read_pass(mnt, order, a.threads) for _ in range(3)), key=lambda x: x["files_per_s"])
                                r = runs[1]
                            else:
                                r = read_pass(mnt, order, a.threads)
                        finally:
                            umount(mnt)
                        row[target] = r["files_per_s"]
                        row[target + "_mb_per_s"] = r["files_per_s"] * info["sample_bytes"] / info["samples"] / 1e6
                    row["ratio"] = row[fmt] / row["pack"]
                    if bound:
                        row["ratio_to_bound"] = row[fmt + "_mb_per_s"] * 1e6 / bound
                    results.append(row)
                    extra = f", {row[fmt + '_mb_per_s']:.0f} MB/s = {row['ratio_to_bound']:.2f}x the decompressor bound" if bound else ""
                    print(f"{fmt:10} {state:4} {order:8} rep {rep}: pack {row['pack']:9.0f} files/s, {fmt} {row[fmt]:9.0f} files/s, ratio {row['ratio']:.2f}{extra}", flush=True)
    return results


def bench_index(a):
    import webdataset as wds

    work = pathlib.Path(a.work) / f"wds-{a.index_scale}"
    index_dir = pathlib.Path(a.work) / "index-scale"
    # A small real JPEG (the smallest of --data), repeated: the index cost depends on the number
    # of members, not on their bytes.
    samples = tree(a.data)
    jpeg = min((open(p, "rb").read() for _, _, _, p in samples[:200]), key=len)
    if not (work / ".written").exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
        work.mkdir(parents=True)
        t0 = time.time()
        with wds.ShardWriter(str(work / "shard-%06d.tar"), maxcount=1000, verbose=0) as w:
            for i in range(a.index_scale):
                w.write({"__key__": f"s{i:09d}", "jpg": jpeg, "cls": i % 1000})
        (work / ".written").write_text(f"{time.time() - t0:.1f}")
        print(f"index-scale: wrote {a.index_scale} samples in {time.time() - t0:.1f} s", file=sys.stderr)
    subprocess.run(["rm", "-rf", str(index_dir)], check=True)
    out = {"samples": a.index_scale, "shards": len(list(work.glob("*.tar")))}
    t0 = time.time()
    sh(BIN, "info", work, "--json", "--index-dir", index_dir)
    out["first_info_s"] = time.time() - t0
    t0 = time.time()
    i = json.loads(sh(BIN, "info", work, "--json", "--index-dir", index_dir).stdout)
    out["second_info_s"] = time.time() - t0
    assert i["index_built_now"] is False and i["samples"] == a.index_scale
    mnt = pathlib.Path(a.work) / "mnt-scale"
    mnt.mkdir(exist_ok=True)
    times = []
    for _ in range(3):
        t0 = time.time()
        mount(work, mnt, index_dir)
        times.append(time.time() - t0)
        umount(mnt)
    out["second_mount_s"] = times
    print(json.dumps(out), flush=True)
    return out


def bench_chunk_rss(a):
    """The daemon's memory over a compressed source (`--chunk-rss SRC`): for each
    `--chunk-cache` budget, a fresh mount, `--threads` shuffled readers over every file, then
    the daemon's peak RSS (VmHWM) and its RSS once idle, from `loosefs stats`."""
    work = pathlib.Path(a.work)
    index_dir, mnt = work / "index", work / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    rows = []
    for budget in a.chunk_budgets.split(","):
        for rep in range(a.repeat):
            drop_caches()
            mnt.mkdir(parents=True, exist_ok=True)
            sh(BIN, "mount", a.chunk_rss, mnt, "--index-dir", index_dir, "--chunk-cache", budget)
            try:
                r = read_pass(mnt, "shuffled", a.threads)
                d = json.loads(sh(BIN, "stats", mnt, "--json").stdout)["daemon"]
                row = {"budget": budget, "rep": rep, "threads": a.threads, "files_per_s": r.get("files_per_s"),
                       "rss_peak_bytes": d["rss_peak_bytes"], "rss_idle_bytes": d["rss_bytes"]}
            finally:
                umount(mnt)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="ImageFolder tree of JPEGs")
    ap.add_argument("--work", required=True, help="where the formats, packs and results go")
    ap.add_argument("--formats", default="webdataset,tfrecord,mds,litdata,mds-zstd,zip-deflated")
    ap.add_argument("--states", default="warm,cold")
    ap.add_argument("--orders", default="inorder,shuffled")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--index-scale", type=int, default=0, help="also time the index of an N-sample WebDataset")
    ap.add_argument("--chunk-rss", help="a compressed source (zstd MDS, deflated zip): measure the daemon's RSS under --chunk-budgets")
    ap.add_argument("--chunk-budgets", default="16M,128M")
    ap.add_argument("--loosefs", help="another loosefs binary to measure (a baseline build)")
    a = ap.parse_args()
    if a.loosefs:
        global BIN
        BIN = pathlib.Path(a.loosefs)
    res = {"formats": bench_formats(a) if a.formats else []}
    if a.chunk_rss:
        res["chunk_rss"] = bench_chunk_rss(a)
    if a.index_scale:
        res["index"] = bench_index(a)
    out = pathlib.Path(a.work) / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(res, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
