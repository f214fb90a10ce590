"""Video frames of a LeRobot v3 dataset (`--decode frames`), against PyAV as the oracle: the
dataset in ../shared/data/lerobot/ was written by lerobot's own writer (AV1 MP4 + Parquet), and a
row's frame is the decoded frame whose timestamp is nearest `from_timestamp + timestamp`, as
lerobot's pyav backend picks it."""
import contextlib
import errno
import json
import os
import pathlib
import shutil
import subprocess
import threading

import pytest

from conftest import DATA, ROOT, loosefs_bin, missing_prerequisite, need_mount

LEROBOT = DATA / "lerobot" / "so100-av1"


def prerequisites():
    need_mount()
    if not LEROBOT.is_dir():
        missing_prerequisite(f"{LEROBOT} is missing")
    try:
        import av  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        missing_prerequisite("PyAV and pyarrow are not installed (scripts/python-env.sh installs them)")


@contextlib.contextmanager
def mounted(src, work, *args):
    mnt = work / f"mnt{len(list(work.iterdir()))}"
    mnt.mkdir()
    r = subprocess.run([loosefs_bin(), "mount", str(src), str(mnt), "--log", str(work / "daemon.log"), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (work / "mount.stderr").write_text(r.stderr)
    try:
        yield mnt
    finally:
        subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, timeout=60)


def oracle(root: pathlib.Path):
    """Per (camera, episode, frame_index): PyAV's RGB24 pixels of the row's frame; and the
    episodes' rows, from the dataset's own Parquet files."""
    import av
    import numpy as np
    import pyarrow.parquet as pq
    eps = {e["episode_index"]: e for f in sorted((root / "meta" / "episodes").rglob("*.parquet"))
           for e in pq.read_table(f).to_pylist()}
    rows = [r for f in sorted((root / "data").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    cams = sorted(k[len("videos/"):-len("/from_timestamp")] for k in next(iter(eps.values()))
                  if k.startswith("videos/") and k.endswith("/from_timestamp"))
    decoded = {}
    want = {}
    for cam in cams:
        for r in rows:
            e = eps[r["episode_index"]]
            rel = f"videos/{cam}/chunk-{e[f'videos/{cam}/chunk_index']:03d}/file-{e[f'videos/{cam}/file_index']:03d}.mp4"
            if rel not in decoded:
                with av.open(str(root / rel)) as c:
                    s = c.streams.video[0]
                    frames = {float(f.pts * s.time_base): f.to_ndarray(format="rgb24") for f in c.decode(s)}
                decoded[rel] = (np.array(sorted(frames)), frames)
            ts, frames = decoded[rel]
            q = e[f"videos/{cam}/from_timestamp"] + r["timestamp"]
            i = int(np.argmin(np.abs(ts - q)))
            assert abs(ts[i] - q) < 1e-4
            want[(cam, r["episode_index"], r["frame_index"])] = frames[ts[i]]
    return cams, eps, rows, want


def read_ppm(path):
    import numpy as np
    b = path.read_bytes()
    head = b.split(b"\n", 3)
    w, h = map(int, head[1].split())
    return np.frombuffer(head[3], np.uint8).reshape(h, w, 3)


def test_every_frame_and_column_of_a_lerobot_dataset_equals_pyav_and_parquet(tmp_path):
    """Every row of every episode and camera: `frames/<cam>/episode_<N>/<frame>.npy` and `.ppm`
    hold exactly PyAV's pixels of the frame LeRobot picks; each episode directory holds one frame
    per row; `columns/episode_<N>/<feature>.npy` equal the Parquet values; the dataset's own
    files are there unchanged."""
    prerequisites()
    import numpy as np
    cams, eps, rows, want = oracle(LEROBOT)
    with mounted(LEROBOT, tmp_path, "--decode", "frames") as mnt:
        for rel in ("meta/info.json", "data/chunk-000/file-000.parquet"):
            assert (mnt / rel).read_bytes() == (LEROBOT / rel).read_bytes()
        assert sorted(p.name for p in (mnt / "frames").iterdir()) == cams
        for cam in cams:
            episodes = sorted(p.name for p in (mnt / "frames" / cam).iterdir())
            assert episodes == [f"episode_{i:06d}" for i in sorted(eps)]
            for i, e in eps.items():
                names = sorted(p.name for p in (mnt / "frames" / cam / f"episode_{i:06d}").iterdir())
                assert len(names) == 2 * e["length"], (cam, i)
        for (cam, ep, fi), px in want.items():
            d = mnt / "frames" / cam / f"episode_{ep:06d}"
            got = np.load(d / f"{fi:06d}.npy")
            assert got.dtype == np.uint8 and np.array_equal(got, px), (cam, ep, fi)
            assert np.array_equal(read_ppm(d / f"{fi:06d}.ppm"), px), (cam, ep, fi)
        for ep in eps:
            mine = [r for r in rows if r["episode_index"] == ep]
            for feat in ("observation.state", "action", "timestamp", "frame_index"):
                got = np.load(mnt / "columns" / f"episode_{ep:06d}" / f"{feat}.npy")
                exp = np.array([r[feat] for r in mine]).reshape(len(mine), -1)
                assert got.shape == exp.shape and np.array_equal(got, exp.astype(got.dtype)), (ep, feat)
        # Each GOP decoded once (the GOP cache's default budget holds them all).
        import av
        import json
        gops = 0
        for mp4 in LEROBOT.rglob("*.mp4"):
            with av.open(str(mp4)) as c:
                gops += sum(1 for p in c.demux(c.streams.video[0]) if p.is_keyframe)
        st = subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True, text=True, timeout=60)
        assert st.returncode == 0, st.stderr
        f = json.loads(st.stdout)["frames"]
        assert f["gops"] == gops and f["failures"] == 0, f
        assert f["hits"] + f["misses"] + f["joined"] >= 2 * len(want), f
        text = subprocess.run([loosefs_bin(), "stats", str(mnt)], capture_output=True, text=True, timeout=60).stdout
        assert f"frames      {gops} GOPs decoded" in text, text


def test_concurrent_readers_of_one_gop_get_the_same_pixels(tmp_path):
    """Eight threads read the frames of the same GOPs at once, cold: each gets PyAV's pixels."""
    prerequisites()
    import numpy as np
    cams, eps, rows, want = oracle(LEROBOT)
    cam, ep = cams[0], sorted(eps)[-1]
    keys = [k for k in want if k[0] == cam and k[1] == ep][:12]
    with mounted(LEROBOT, tmp_path, "--decode", "frames") as mnt:
        errors = []

        def reader(seed):
            order = keys[seed % len(keys):] + keys[:seed % len(keys)]
            for k in order:
                got = np.load(mnt / "frames" / cam / f"episode_{ep:06d}" / f"{k[2]:06d}.npy")
                if not np.array_equal(got, want[k]):
                    errors.append(k)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []


LEROBOT_ITEMS = r"""
import json, numpy as np, torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
plain = LeRobotDataset("local/plain", root="/data/dir", video_backend="pyav")
mount = LeRobotDataset("local/mount", root="/data/mnt", video_backend="pyav")
assert len(plain) == len(mount), (len(plain), len(mount))
cams = list(mount.meta.camera_keys)
checked = frames = 0
for i in range(0, len(plain), 7):
    a, b = plain[i], mount[i]
    assert a.keys() == b.keys(), (i, a.keys(), b.keys())
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (i, k)
        else:
            assert a[k] == b[k], (i, k)
    # lerobot's pyav backend returns the frame's RGB24 bytes / 255 (C x H x W, float32): the
    # frame view of the row holds those bytes.
    ep, fi = int(b["episode_index"]), int(b["frame_index"])
    for cam in cams:
        px = (b[cam] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        view = np.load(f"/data/mnt/frames/{cam}/episode_{ep:06d}/{fi:06d}.npy")
        assert view.dtype == np.uint8 and np.array_equal(view, px), (i, cam)
        frames += 1
    checked += 1
print(json.dumps({"items": checked, "frames": frames, "len": len(plain), "cameras": cams}))
"""


def test_lerobots_own_loader_reads_the_same_items_through_the_mount(tmp_path):
    """lerobot 0.6.1 itself (Python 3.13 in a Debian trixie root: tests/e2e/trixie.py), unmodified:
    `LeRobotDataset(root=MNT)` over `--decode frames` gives items equal to `root=DIR` (every
    tensor, every 7th index, all cameras, pyav backend), and each item's camera images, as
    lerobot's pyav backend decodes them, equal the row's frame views."""
    prerequisites()
    import trixie
    with mounted(LEROBOT, tmp_path, "--decode", "frames") as mnt:
        got = trixie.run(LEROBOT_ITEMS, {str(LEROBOT): "/data/dir", str(mnt): "/data/mnt"})
    assert got["items"] == len(range(0, got["len"], 7)) and got["frames"] == got["items"] * len(got["cameras"]), got
    assert got["len"] > 0 and got["cameras"], got


def test_a_truncated_video_is_refused_at_mount_or_answers_eio_never_wrong_pixels(tmp_path):
    """The top camera's MP4 cut to its first half: the mount refuses it naming the file, or
    every frame it serves equals PyAV's pixels of the whole file and the rest answer EIO."""
    prerequisites()
    import numpy as np
    cams, eps, rows, want = oracle(LEROBOT)
    copy = tmp_path / "ds"
    shutil.copytree(LEROBOT, copy)
    video = copy / "videos" / cams[0] / "chunk-000" / "file-000.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    work = tmp_path / "work"
    work.mkdir()
    mnt = work / "mnt"
    mnt.mkdir()
    r = subprocess.run([loosefs_bin(), "mount", str(copy), str(mnt), "--decode", "frames",
                        "--log", str(work / "daemon.log")], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        assert "file-000.mp4" in r.stderr, r.stderr
        return
    try:
        served = failed = 0
        for (cam, ep, fi), px in want.items():
            p = mnt / "frames" / cam / f"episode_{ep:06d}" / f"{fi:06d}.npy"
            try:
                got = np.load(p)
            except OSError as e:
                assert e.errno == errno.EIO, e
                failed += 1
                continue
            assert np.array_equal(got, px), (cam, ep, fi)
            served += 1
        assert failed > 0 and served > 0
    finally:
        subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, timeout=60)


def test_a_video_path_or_camera_key_leading_out_of_the_dataset_is_refused_naming_it(tmp_path):
    """`meta/info.json` whose `video_path` is absolute or climbs out with `..`, a camera key
    holding `/`, or a video that is a link out of the tree or a FIFO: the mount is refused
    naming info.json or the file, and nothing outside the tree is opened."""
    prerequisites()
    import json
    outside = tmp_path / "outside"
    shutil.copytree(LEROBOT / "videos", outside / "videos")

    def attempt(name, edit):
        copy = tmp_path / name
        shutil.copytree(LEROBOT, copy)
        edit(copy)
        mnt = tmp_path / f"mnt-{name}"
        mnt.mkdir()
        r = subprocess.run([loosefs_bin(), "mount", str(copy), str(mnt), "--decode", "frames"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, timeout=60)
        assert r.returncode != 0, f"{name}: mounted"
        return r.stderr

    def info_edit(f):
        def edit(copy):
            p = copy / "meta" / "info.json"
            info = json.loads(p.read_text())
            f(info)
            p.write_text(json.dumps(info))
        return edit

    absolute = str(outside) + "/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    e = attempt("absolute", info_edit(lambda i: i.update(video_path=absolute.replace(str(outside), str(outside / "videos")))))
    assert "info.json" in e and "video_path" in e, e
    e = attempt("dotdot", info_edit(lambda i: i.update(
        video_path="../outside/videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")))
    assert "info.json" in e and "video_path" in e, e

    def slashed(info):
        cam = next(k for k, v in info["features"].items() if v.get("dtype") == "video")
        info["features"]["../" + cam] = info["features"][cam]
    e = attempt("camera", info_edit(slashed))
    assert "info.json" in e and "camera key" in e, e

    def link_out(copy):
        v = sorted((copy / "videos").rglob("*.mp4"))[0]
        v.unlink()
        v.symlink_to(sorted((outside / "videos").rglob("*.mp4"))[0])
    e = attempt("link", link_out)
    assert "leads out of" in e, e

    def fifo(copy):
        v = sorted((copy / "videos").rglob("*.mp4"))[0]
        v.unlink()
        os.mkfifo(v)
    e = attempt("fifo", fifo)
    assert "not a regular file" in e, e


def test_frames_need_a_lerobot_dataset_or_video_files(tmp_path, source):
    """`--decode frames` on a directory that is no LeRobot v3 dataset and holds no video file:
    refused, saying so."""
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([loosefs_bin(), "mount", str(source), str(mnt), "--decode", "frames"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "LeRobot v3" in r.stderr and ".mp4" in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["pack", "webdataset"])
def test_frames_of_a_pack_or_a_packed_format_are_refused_naming_the_view_and_the_kind(tmp_path, pack, kind):
    """A pack's or a packed format's samples are no videos: `--decode frames` is refused at
    mount, naming the view, the source and its kind (it mounted without frames, silently)."""
    need_mount()
    src = {"pack": pack, "webdataset": DATA / "formats" / "webdataset"}[kind]
    if not src.exists():
        missing_prerequisite(f"{src} is missing")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([loosefs_bin(), "mount", str(src), str(mnt), "--decode", "frames"],
                       capture_output=True, text=True, timeout=300)
    want = {"pack": "is a loosefs pack", "webdataset": "is a dataset packed as tar"}[kind]
    assert r.returncode != 0 and "--decode frames" in r.stderr and want in r.stderr, r.stderr
    assert "daemon" not in r.stderr, r.stderr  # refused before a daemon starts
    assert not os.path.ismount(mnt)


def test_plain_video_files_get_their_frames_beside_them(tmp_path):
    """A directory of plain video files (an AV1 MP4 of the dataset, the same frames re-encoded
    as H.264 with B-frames in MKV, a damaged `.webm`, a JPEG): each readable video gets
    `<name>.frames/<n 06d>.npy` and `.ppm`, one per frame in presentation order, equal to
    PyAV's decode; the damaged one gets none and the mount still serves the rest; the files
    themselves are unchanged."""
    prerequisites()
    import av
    import numpy as np
    src = sorted(LEROBOT.rglob("*.mp4"))[0]
    ds = tmp_path / "ds"
    (ds / "clips" / "b").mkdir(parents=True)
    shutil.copy(src, ds / "clips" / "a.mp4")
    with av.open(str(src)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    encode(frames[:40], ds / "clips" / "b" / "c.mkv", "libx264", 12, 2)
    (ds / "broken.webm").write_bytes(b"\x1aE\xdf\xa3 not really a video")
    jpeg = next((DATA / "imagenet-sample").rglob("*.JPEG"), None)
    if jpeg:
        shutil.copy(jpeg, ds / "x.JPEG")

    def decoded(path):
        with av.open(str(path)) as c:
            s = c.streams.video[0]
            return [f.to_ndarray(format="rgb24") for f in sorted(c.decode(s), key=lambda f: f.pts)]

    work = tmp_path / "work"
    work.mkdir()
    with mounted(ds, work, "--decode", "frames") as mnt:
        for rel in ("clips/a.mp4", "clips/b/c.mkv", "broken.webm"):
            assert (mnt / rel).read_bytes() == (ds / rel).read_bytes()
        assert not (mnt / "broken.webm.frames").exists()
        assert "broken.webm: not a video FFmpeg reads" in (work / "mount.stderr").read_text()
        for rel in ("clips/a.mp4", "clips/b/c.mkv"):
            want = decoded(ds / rel)
            d = mnt / f"{rel}.frames"
            names = sorted(p.name for p in d.iterdir())
            assert names == sorted([f"{n:06d}.npy" for n in range(len(want))] + [f"{n:06d}.ppm" for n in range(len(want))]), rel
            for n, px in enumerate(want):
                assert np.array_equal(np.load(d / f"{n:06d}.npy"), px), (rel, n)
            assert np.array_equal(read_ppm(d / f"{len(want) - 1:06d}.ppm"), want[-1]), rel
        assert sorted(p.name for p in (mnt / "clips").iterdir()) == ["a.mp4", "a.mp4.frames", "b"]


def encode(frames, path: pathlib.Path, codec: str, gop: int, bframes: int, options: dict | None = None):
    """`frames` (RGB24 arrays) written to `path` by PyAV's `codec` at 30 frames/s, frame i at
    pts i (time base 1/30), a keyframe every `gop` frames, up to `bframes` B-frames between
    references; `options` are the codec's own (x264's `x264-params`, say)."""
    import av
    with av.open(str(path), "w") as o:
        s = o.add_stream(codec, rate=30)
        s.width, s.height = frames[0].shape[1], frames[0].shape[0]
        s.pix_fmt = "yuv420p"
        s.codec_context.gop_size = gop
        s.codec_context.max_b_frames = bframes
        if codec == "libx265":
            s.codec_context.options = {"x265-params": f"keyint={gop}:min-keyint={gop}:bframes={bframes}:log-level=error"}
        if options:
            s.codec_context.options = options
        for i, px in enumerate(frames):
            f = av.VideoFrame.from_ndarray(px, format="rgb24")
            f.pts = i
            for p in s.encode(f):
                o.mux(p)
        for p in s.encode():
            o.mux(p)


def reencode(src: pathlib.Path, out: pathlib.Path, codec: str, gop: int, bframes: int):
    """The dataset `src` with every video re-encoded by PyAV's `codec` ([`encode`]), same
    frames, same timestamps (time base 1/fps): the metadata stays true as it is."""
    import av
    shutil.copytree(src, out)
    for mp4 in sorted(out.rglob("*.mp4")):
        with av.open(str(mp4)) as c:
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
        encode(frames, mp4, codec, gop, bframes)


@pytest.mark.parametrize("codec", ["libx264", "libx265"])
def test_h264_and_hevc_with_b_frames_serve_pyavs_frames(tmp_path, codec):
    """The dataset re-encoded as H.264 or HEVC with 30-frame GOPs and B-frames (frames decoded
    out of presentation order, lerobot's pyav backend's weak spot): every frame view equals
    PyAV's decode of that file at the row's timestamp."""
    prerequisites()
    import numpy as np
    ds = tmp_path / "ds"
    reencode(LEROBOT, ds, codec, 30, 2)
    cams, eps, rows, want = oracle(ds)
    work = tmp_path / "work"
    work.mkdir()
    with mounted(ds, work, "--decode", "frames") as mnt:
        for (cam, ep, fi), px in want.items():
            got = np.load(mnt / "frames" / cam / f"episode_{ep:06d}" / f"{fi:06d}.npy")
            assert np.array_equal(got, px), (codec, cam, ep, fi)


def test_an_announced_shuffled_order_of_frames_is_decoded_ahead(tmp_path):
    """A shuffled order of frame files written to `.loosefs/order`, then read one by one: the
    GOPs of the frames after each read are decoded ahead, so most reads find theirs decoded or
    under way, and every frame equals PyAV's."""
    prerequisites()
    import json
    import random
    import numpy as np
    cams, eps, rows, want = oracle(LEROBOT)
    keys = sorted(want)
    random.Random(5).shuffle(keys)
    paths = [f"frames/{c}/episode_{e:06d}/{f:06d}.npy" for c, e, f in keys]
    with mounted(LEROBOT, tmp_path, "--decode", "frames") as mnt:
        fd = os.open(mnt / ".loosefs" / "order", os.O_WRONLY | os.O_TRUNC)
        os.write(fd, "".join(p + "\n" for p in paths).encode())
        os.close(fd)
        for k, p in zip(keys, paths):
            assert np.array_equal(np.load(mnt / p), want[k]), p
        st = subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True, text=True, timeout=60)
        f = json.loads(st.stdout)["frames"]
        assert f["ahead"] > len(keys) // 4, f
        assert f["misses"] < len(keys) // 4, f


def test_a_gop_larger_than_the_frame_cache_is_decoded_within_it(tmp_path):
    """One keyframe for 160 frames of 1024²: the GOP decoded is 503 MB of pixels, the frame
    cache 64 MiB (`--decode-cache 64M`). Frames read out of order, first and last among them,
    equal PyAV's decode; the cache never holds more than its budget; the daemon's peak RSS
    stays far below the GOP's size (it held the whole GOP, 3.7 GB for a 2048² one, before)."""
    prerequisites()
    import av
    import numpy as np
    n, side = 160, 1024
    y, x = np.mgrid[0:side, 0:side]
    frames = [np.stack([(x + 7 * i) % 256, (y + 3 * i) % 256, (x + y + 11 * i) % 256], axis=-1).astype(np.uint8)
              for i in range(n)]
    ds = tmp_path / "ds"
    ds.mkdir()
    video = ds / "long-gop.mp4"
    encode(frames, video, "libx264", n, 0, {"x264-params": f"keyint={n}:min-keyint={n}:scenecut=0", "preset": "ultrafast"})
    with av.open(str(video)) as c:
        st = c.streams.video[0]
        keys = 0
        for p in c.demux(st):
            keys += bool(p.is_keyframe and p.size)
        assert keys == 1, f"{keys} keyframes: the test needs one GOP"
    with av.open(str(video)) as c:
        want = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    assert len(want) == n
    del frames
    work = tmp_path / "work"
    work.mkdir()
    budget = 64 << 20
    with mounted(ds, work, "--decode", "frames", "--decode-cache", "64M", "--decode-threads", "3") as mnt:
        d = mnt / "long-gop.mp4.frames"
        for i in (150, 0, 159, 75, 76, 3):
            assert np.array_equal(np.load(d / f"{i:06d}.npy"), want[i]), i
        stats = json.loads(subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True,
                                          text=True, check=True, timeout=60).stdout)
        fr = stats["frames"]
        assert fr["budget_bytes"] == budget and fr["cached_bytes"] <= budget, fr
        pid = stats["daemon"]["pid"]
        # `--decode-threads` reaches the frame decoder: its threads, as asked.
        names = [(t / "comm").read_text().strip() for t in pathlib.Path(f"/proc/{pid}/task").iterdir()]
        assert fr["threads"] == 3 and sum(n.startswith("loosefs-frames") for n in names) == 3, (fr, names)
        hwm = int(next(line.split()[1] for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("VmHWM:"))) << 10
        assert hwm < 400 << 20, f"daemon peak RSS {hwm >> 20} MiB for a {n * side * side * 3 >> 20} MiB GOP"
