#!/usr/bin/env python3
"""Writes a LeRobot v3 dataset for the frame benchmarks without lerobot (whose install brings
torch, gigabytes from PyPI): the layout, metadata and Parquet columns lerobot 0.6 writes
(`meta/info.json`, `meta/episodes/chunk-000/file-000.parquet`, `data/chunk-000/file-000.parquet`,
`videos/<camera>/chunk-000/file-000.mp4` holding every episode one after the other), encoded by
PyAV (`libsvtav1`, a keyframe every `--gop` frames, yuv420p, as lerobot's defaults) from real
photographs: each episode pans a crop window across two ImageNet JPEGs, as make_lerobot.py does.

  python bench/make_video_set.py ../shared/data/imagenet-sample OUT --episodes 40 --frames 250 \\
      --height 240 --width 320
"""
import argparse
import json
import pathlib
import random

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

CAMS = ["observation.images.top", "observation.images.wrist"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=pathlib.Path)
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--height", type=int, default=240)
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--gop", type=int, default=2)
    ap.add_argument("--codec", default="libsvtav1")
    a = ap.parse_args()
    H, W, fps = a.height, a.width, 30
    jpgs = sorted(a.src.rglob("*.JPEG"))
    rng = random.Random(3)
    out = a.out
    (out / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (out / "data" / "chunk-000").mkdir(parents=True)
    pairs = [(rng.choice(jpgs), rng.choice(jpgs)) for _ in range(a.episodes)]

    def pan(img, t, n, k):
        img = img.convert("RGB").resize((W * 2, H * 2))
        x = int(W * t / max(1, n - 1))
        y = int(H * (0.5 + 0.5 * np.sin(t / 7 + k)))
        return np.asarray(img.crop((x, y // 2, x + W, y // 2 + H)), dtype=np.uint8)

    for k, cam in enumerate(CAMS):
        path = out / "videos" / cam / "chunk-000" / "file-000.mp4"
        path.parent.mkdir(parents=True)
        with av.open(str(path), "w") as o:
            s = o.add_stream(a.codec, rate=fps)
            s.width, s.height, s.pix_fmt = W, H, "yuv420p"
            s.codec_context.gop_size = a.gop
            if a.codec == "libsvtav1":
                s.codec_context.options = {"svtav1-params": f"keyint={a.gop}", "crf": "30", "preset": "12"}
            i = 0
            for ep, (ja, jb) in enumerate(pairs):
                img = Image.open(ja if k == 0 else jb)
                for t in range(a.frames):
                    f = av.VideoFrame.from_ndarray(pan(img, t, a.frames, k), format="rgb24")
                    f.pts = i
                    i += 1
                    for p in s.encode(f):
                        o.mux(p)
            for p in s.encode():
                o.mux(p)
    n = a.episodes * a.frames
    state = np.sin(np.arange(n * 6, dtype=np.float32).reshape(n, 6) / 10)
    data = pa.table({
        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 6),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(np.roll(state, 1, axis=1).ravel()), 6),
        "timestamp": pa.array(np.tile(np.arange(a.frames, dtype=np.float32) / fps, a.episodes)),
        "frame_index": pa.array(np.tile(np.arange(a.frames, dtype=np.int64), a.episodes)),
        "episode_index": pa.array(np.repeat(np.arange(a.episodes, dtype=np.int64), a.frames)),
        "index": pa.array(np.arange(n, dtype=np.int64)),
        "task_index": pa.array(np.zeros(n, dtype=np.int64)),
    })
    pq.write_table(data, out / "data" / "chunk-000" / "file-000.parquet")
    dur = a.frames / fps
    eps = {"episode_index": list(range(a.episodes)), "length": [a.frames] * a.episodes,
           "data/chunk_index": [0] * a.episodes, "data/file_index": [0] * a.episodes,
           "dataset_from_index": [e * a.frames for e in range(a.episodes)],
           "dataset_to_index": [(e + 1) * a.frames for e in range(a.episodes)]}
    for cam in CAMS:
        eps[f"videos/{cam}/chunk_index"] = [0] * a.episodes
        eps[f"videos/{cam}/file_index"] = [0] * a.episodes
        eps[f"videos/{cam}/from_timestamp"] = [e * dur for e in range(a.episodes)]
        eps[f"videos/{cam}/to_timestamp"] = [(e + 1) * dur for e in range(a.episodes)]
    pq.write_table(pa.table(eps), out / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    video = {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"],
             "info": {"video.height": H, "video.width": W, "video.codec": a.codec, "video.pix_fmt": "yuv420p",
                      "video.fps": fps, "video.g": a.gop}}
    feats = {c: video for c in CAMS}
    feats.update({"observation.state": {"dtype": "float32", "shape": [6]}, "action": {"dtype": "float32", "shape": [6]},
                  "timestamp": {"dtype": "float32", "shape": [1]}, "frame_index": {"dtype": "int64", "shape": [1]},
                  "episode_index": {"dtype": "int64", "shape": [1]}, "index": {"dtype": "int64", "shape": [1]},
                  "task_index": {"dtype": "int64", "shape": [1]}})
    info = {"codebase_version": "v3.0", "fps": fps, "features": feats, "total_episodes": a.episodes,
            "total_frames": n, "chunks_size": 1000,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"}
    (out / "meta" / "info.json").write_text(json.dumps(info, indent=1))
    print(f"{out}: {a.episodes} episodes x {a.frames} frames x {len(CAMS)} cameras, {H}x{W}, {a.codec} GOP {a.gop}")


if __name__ == "__main__":
    main()
