"""LeRobot's own readers, timed where lerobot 0.6.1 runs: Python 3.13 in the Debian trixie root
(scripts/trixie-root.sh), started by bench/frames.py through scripts/in-trixie.sh with the
dataset bound at /data and this file's spec at argv[1] (JSON: kind, root, items, workers,
tolerance_s).

Kinds:
- `decode`: `decode_video_frames(video, [timestamp], tolerance_s, backend="pyav")` per item
  (`[relative video path, timestamp]`), one frame each: lerobot's per-frame decode.
- `getitem`: `LeRobotDataset(root=...)[index]` per item (a dataset index), every camera's
  frame decoded with the pyav backend, plus the row's columns.

Prints one JSON line: items/s, first-item latency, p50/p95/p99 (ms), and the largest
worker's peak RSS (MiB).
"""
import json
import multiprocessing as mp
import resource
import sys
import time


# Set up before the pool forks (imports, the dataset's metadata), as a training script has
# before its first epoch: the timed pass is the reads alone.
DATASET = None


def work(args):
    kind, root, items, tol = args
    # As torch's DataLoader does in each worker: one intra-op thread (else the workers' torch
    # thread pools oversubscribe the cores).
    import torch
    torch.set_num_threads(1)
    lat = []
    if kind == "decode":
        from lerobot.datasets.video_utils import decode_video_frames
        for rel, q in items:
            t0 = time.perf_counter()
            decode_video_frames(f"{root}/{rel}", [q], tol, backend="pyav")
            lat.append(time.perf_counter() - t0)
    else:
        for i in items:
            t0 = time.perf_counter()
            DATASET[i]
            lat.append(time.perf_counter() - t0)
    return lat


def main():
    spec = json.load(open(sys.argv[1]))
    w = spec["workers"]
    items = spec["items"]
    parts = [items[i::w] for i in range(w)]
    global DATASET
    if spec["kind"] == "decode":
        import lerobot.datasets.video_utils  # noqa: F401
    else:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
        DATASET = LeRobotDataset("local/bench", root=spec["root"], video_backend="pyav",
                                 tolerance_s=spec["tolerance_s"])
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(w) as pool:
        lats = pool.map(work, [(spec["kind"], spec["root"], p, spec["tolerance_s"]) for p in parts])
    secs = time.perf_counter() - t0
    lat = sorted(x for part in lats for x in part)

    def pct(p):
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3

    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps(dict(ips=len(items) / secs, first=min(p[0] for p in lats if p) * 1e3, p50=pct(0.5),
                          p95=pct(0.95), p99=pct(0.99), peak_rss_mib=rss)))


if __name__ == "__main__":
    main()
