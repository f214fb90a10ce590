#!/usr/bin/env python3
"""Video frames of a LeRobot v3 dataset (issue 45): a shuffled single-frame pass over every row
of every camera, by `--workers` processes, against what users run today.

Parties, each over the same shuffled list of (camera, episode, frame_index) rows:
- `pyav-per-frame`: lerobot's pyav backend per frame (`decode_video_frames_torchvision`'s
  steps): open the episode's video, seek back to the keyframe before `from_timestamp +
  timestamp`, decode forward to it, take the nearest frame.
- `order`: the same through a fresh mount after writing the shuffled list of frame files to
  `.loosefs/order` (the announced epoch order: the GOPs of the next frames decoded ahead).
- `mount`: `np.load` of `frames/<camera>/episode_<N>/<frame>.npy` through `loosefs mount DIR
  --decode frames`: epoch 1 on a fresh mount (every GOP decoded), epoch 2 warm.
- `mount epoch 2, patch_open()` (`--parties mount,patched`): epoch 2 again with
  `loosefs.patch_open()` in the workers (no `isatty` round trip per `open()`).
- `npy-ext4`: the same frames written as `.npy` files on the local disk, read warm.
- `decode-bound`: PyAV decoding every video file whole, one process per file, all cores.
- `lerobot decode_video_frames` (`--parties lerobot`): lerobot 0.6.1's own
  `decode_video_frames(..., backend="pyav")` per frame, the same rows, in the Debian trixie
  root where lerobot runs (Python 3.13; bench/lerobot_party.py through scripts/in-trixie.sh).
- `LeRobotDataset[i]` (`--parties getitem`): lerobot's own `__getitem__` over shuffled
  dataset indices, every camera decoded (frames/s = items/s x cameras), in the same root.
Reported: frames/s, first-frame latency, p50/p95/p99 per frame (per item for `getitem`), the
daemon's peak RSS (the largest worker's for lerobot's parties).

Run as root from the repository:
  python bench/frames.py --data ../shared/data/lerobot/so100-av1 --workers 1,2
"""
import argparse
import multiprocessing as mp
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "loosefs"


def rows_of(root):
    import pyarrow.parquet as pq
    eps = {e["episode_index"]: e for f in sorted((root / "meta" / "episodes").rglob("*.parquet"))
           for e in pq.read_table(f).to_pylist()}
    rows = [r for f in sorted((root / "data").rglob("*.parquet"))
            for r in pq.read_table(f, columns=["episode_index", "frame_index", "timestamp"]).to_pylist()]
    cams = sorted(k[len("videos/"):-len("/from_timestamp")] for k in next(iter(eps.values()))
                  if k.startswith("videos/") and k.endswith("/from_timestamp"))
    out = []
    for cam in cams:
        for r in rows:
            e = eps[r["episode_index"]]
            rel = f"videos/{cam}/chunk-{e[f'videos/{cam}/chunk_index']:03d}/file-{e[f'videos/{cam}/file_index']:03d}.mp4"
            out.append((cam, r["episode_index"], r["frame_index"], rel,
                        e[f"videos/{cam}/from_timestamp"] + r["timestamp"]))
    return out


def pyav_frame(root, rel, q):
    """One frame as lerobot's pyav backend reads it: seek to the keyframe before `q`, decode on."""
    import av
    with av.open(str(root / rel)) as c:
        s = c.streams.video[0]
        c.seek(int(q / s.time_base), stream=s, backward=True, any_frame=False)
        best = None
        for f in c.decode(s):
            t = float(f.pts * s.time_base)
            if best is None or abs(t - q) < best[0]:
                best = (abs(t - q), f.to_ndarray(format="rgb24"))
            if t >= q:
                break
        return best[1]


def work(args):
    kind, root, items = args
    import numpy as np
    if kind == "npy-patched":
        # loosefs.patch_open(): no isatty round trip per open() (CPython before 3.14).
        sys.path.insert(0, str(ROOT / "python"))
        import loosefs
        loosefs.patch_open()
    lat = []
    for it in items:
        t0 = time.perf_counter()
        if kind == "pyav":
            pyav_frame(pathlib.Path(root), it[3], it[4])
        else:
            np.load(os.path.join(root, it[0], f"episode_{it[1]:06d}", f"{it[2]:06d}.npy"))
        lat.append(time.perf_counter() - t0)
    return lat


def run(kind, root, items, workers):
    parts = [items[i::workers] for i in range(workers)]
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool:
        lats = pool.map(work, [(kind, str(root), p) for p in parts])
    secs = time.perf_counter() - t0
    lat = sorted(x for l in lats for x in l)
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3
    return dict(fps=len(items) / secs, first=min(l[0] for l in lats if l) * 1e3, p50=pct(0.5), p95=pct(0.95),
                p99=pct(0.99))


def lerobot_party(kind, root, items, workers):
    """LeRobot's own reader `kind` (`decode`: items are (rel, timestamp); `getitem`: dataset
    indices) timed inside the trixie root (bench/lerobot_party.py)."""
    import json
    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(kind=kind, root="/data", items=items, workers=workers, tolerance_s=1e-4)
        pathlib.Path(tmp, "spec.json").write_text(json.dumps(spec))
        r = subprocess.run([str(ROOT / "scripts" / "in-trixie.sh"), "--bind", f"{root}:/data", "--bind",
                            f"{tmp}:/spec", "--bind", f"{ROOT / 'bench'}:/bench", "--", "/venv/bin/python",
                            "/bench/lerobot_party.py", "/spec/spec.json"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"lerobot's {kind} party failed: {r.stderr[-3000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def decode_file(path):
    """Frames of the video `path`, every one decoded and converted to RGB24."""
    import av
    with av.open(path) as c:
        return sum(1 for f in c.decode(c.streams.video[0]) if f.to_ndarray(format="rgb24") is not None)


def decode_bound(root, files, workers):
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool:
        n = sum(pool.map(decode_file, [str(root / f) for f in files]))
    return n / (time.perf_counter() - t0)


def peak_rss_kb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, type=pathlib.Path)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=0, help="the first N rows of the shuffled order only (0: all)")
    ap.add_argument("--parties", default="pyav,order,mount,npy,bound",
                    help="which of pyav (per-frame), mount (epochs 1 and 2), order (epoch 1, order announced), "
                         "npy (ext4), bound (decode bound), lerobot (lerobot's decode_video_frames per frame), "
                         "getitem (LeRobotDataset.__getitem__, all cameras), patched (mount epoch 2 again "
                         "with loosefs.patch_open() in the workers)")
    a = ap.parse_args()
    parties = set(a.parties.split(","))
    root = a.data.resolve()
    items = rows_of(root)
    cams = sorted({it[0] for it in items})
    dataset_rows = len(items) // len(cams)
    random.Random(a.seed).shuffle(items)
    if a.rows:
        items = items[:a.rows]
    files = sorted({it[3] for it in items})
    print(f"{root}: {len(items)} rows x cameras, {len(files)} video files")
    for w in [int(x) for x in a.workers.split(",")]:
        res, rss, bound = {}, 0, 0.0
        if "pyav" in parties:
            res["pyav-per-frame"] = run("pyav", root, items, w)
        if "lerobot" in parties:
            r = lerobot_party("decode", root, [[it[3], it[4]] for it in items], w)
            res["lerobot decode_video_frames"] = dict(r, fps=r["ips"], rss=r["peak_rss_mib"])
        if "getitem" in parties:
            # One item holds every camera's frame of a row: as many items as rows in the pass.
            n = max(1, len(items) // len(cams))
            order = list(range(dataset_rows))
            random.Random(a.seed).shuffle(order)
            r = lerobot_party("getitem", root, order[:n], w)
            res["LeRobotDataset[i], all cameras"] = dict(r, fps=r["ips"] * len(cams), rss=r["peak_rss_mib"])
        if "order" in parties:
            with tempfile.TemporaryDirectory() as tmp:
                mnt = pathlib.Path(tmp) / "mnt"
                mnt.mkdir()
                subprocess.run([str(BIN), "mount", str(root), str(mnt), "--decode", "frames", "--log",
                                str(pathlib.Path(tmp) / "daemon.log")], check=True, capture_output=True)
                try:
                    # Worker k reads items k, k+w, ...: announce them as they are read, interleaved.
                    names = "".join(f"frames/{it[0]}/episode_{it[1]:06d}/{it[2]:06d}.npy\n" for it in items)
                    (mnt / ".loosefs" / "order").write_text(names)
                    res["mount epoch 1, order announced"] = run("npy", mnt / "frames", items, w)
                finally:
                    subprocess.run([str(BIN), "umount", str(mnt)], check=True)
        if parties & {"mount", "npy"}:
            with tempfile.TemporaryDirectory() as tmp:
                mnt = pathlib.Path(tmp) / "mnt"
                mnt.mkdir()
                log = pathlib.Path(tmp) / "daemon.log"
                subprocess.run([str(BIN), "mount", str(root), str(mnt), "--decode", "frames", "--log", str(log)],
                               check=True, capture_output=True)
                local = pathlib.Path(tmp) / "npy"
                try:
                    if "mount" in parties:
                        res["mount epoch 1"] = run("npy", mnt / "frames", items, w)
                        res["mount epoch 2"] = run("npy", mnt / "frames", items, w)
                        if "patched" in parties:
                            res["mount epoch 2, patch_open()"] = run("npy-patched", mnt / "frames", items, w)
                        pid = int(subprocess.run(["pgrep", "-f", f"loosefs.*{mnt}"], capture_output=True,
                                                 text=True).stdout.split()[0])
                        rss = peak_rss_kb(pid)
                        stats = subprocess.run([str(BIN), "stats", str(mnt)], capture_output=True, text=True).stdout
                        print("".join(l + "\n" for l in stats.splitlines() if l.startswith("frames ")), end="")
                    if "npy" in parties:
                        for it in items:
                            d = local / it[0] / f"episode_{it[1]:06d}"
                            d.mkdir(parents=True, exist_ok=True)
                            shutil.copyfile(mnt / "frames" / it[0] / f"episode_{it[1]:06d}" / f"{it[2]:06d}.npy",
                                            d / f"{it[2]:06d}.npy")
                finally:
                    subprocess.run([str(BIN), "umount", str(mnt)], check=True)
                if "npy" in parties:
                    run("npy", local, items, w)  # warm the page cache
                    res["npy-ext4 (warm)"] = run("npy", local, items, w)
        if "bound" in parties:
            bound = decode_bound(root, files, max(w, os.cpu_count() or 1))
        base = res.get("pyav-per-frame", {}).get("fps")
        print(f"\n{w} worker(s); decode bound (PyAV, whole files, all cores): {bound:.0f} frames/s; "
              f"daemon peak RSS {rss / 1024:.0f} MiB")
        print(f"{'party':<32} {'frames/s':>9} {'x pyav':>7} {'first ms':>9} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
              f"{'peak RSS':>9}")
        for k, r in res.items():
            x = f"{r['fps'] / base:>7.1f}" if base else f"{'-':>7}"
            # lerobot's parties: the largest worker's peak RSS (MiB); the mount's: the daemon's.
            peak = f"{r['rss']:>5.0f} MiB" if "rss" in r else f"{'-':>9}"
            print(f"{k:<32} {r['fps']:>9.0f} {x} {r['first']:>9.2f} {r['p50']:>7.2f} "
                  f"{r['p95']:>7.2f} {r['p99']:>7.2f} {peak}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
