"""Unmodified loaders over a loosefs mount must see exactly what they see on the original
directory: torchvision ImageFolder (+ DataLoader) and NVIDIA DALI's readers.file (CPU), over a
pack's mount and over the directory itself mounted in place (`loader_mount`)."""
import errno
import json
import os
import pathlib
import shutil
import subprocess
import time

import numpy as np
import pytest
import torch
import torchvision
from torchvision.transforms import v2 as T

from conftest import loosefs_bin, need_mount


def rel(samples, root):
    return [(os.path.relpath(p, root), y) for p, y in samples]


def test_imagefolder_identical(source, loader_mount):
    mount = loader_mount
    a = torchvision.datasets.ImageFolder(str(source))
    b = torchvision.datasets.ImageFolder(str(mount))
    assert b.classes == a.classes
    assert ".loosefs" not in b.classes and os.path.isdir(os.path.join(mount, ".loosefs"))
    assert b.class_to_idx == a.class_to_idx
    assert rel(b.samples, mount) == rel(a.samples, source)
    assert len(b) == len(a) > 0
    to_tensor = T.Compose([T.ToImage(), T.ToDtype(torch.uint8)])
    for i in range(len(a)):
        (xa, ya), (xb, yb) = a[i], b[i]
        assert ya == yb
        ta, tb = to_tensor(xa), to_tensor(xb)
        assert ta.shape == tb.shape and torch.equal(ta, tb), a.samples[i][0]


def test_dataloader_shuffled_epoch(loader_mount):
    mount = loader_mount
    tf = T.Compose([T.ToImage(), T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True)])
    ds = torchvision.datasets.ImageFolder(str(mount), transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=2)
    seen = 0
    labels = []
    for x, y in dl:
        assert x.shape[1:] == (3, 224, 224)
        seen += x.shape[0]
        labels.append(y)
    assert seen == len(ds)
    assert sorted(torch.cat(labels).tolist()) == sorted(t for _, t in ds.samples)


def dali_epoch(root):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=25, num_threads=2, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(root), random_shuffle=False, name="r")
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), labels

    p = pipe()
    p.build()
    n = p.epoch_size("r")
    images, labels = [], []
    while len(labels) < n:
        im, lb = p.run()
        for k in range(len(lb)):
            images.append(np.array(im.at(k)))
            labels.append(int(np.array(lb.at(k)).reshape(-1)[0]))
    return images[:n], labels[:n]


def test_dali_readers_file_identical(source, loader_mount):
    mount = loader_mount
    # DALI is installed by scripts/python-env.sh: a broken install fails here instead of skipping.
    import nvidia.dali  # noqa: F401
    ia, la = dali_epoch(source)
    ib, lb = dali_epoch(mount)
    assert la == lb and len(la) > 0
    for k, (a, b) in enumerate(zip(ia, ib)):
        assert a.shape == b.shape and np.array_equal(a, b), f"sample {k}"


def test_stats_through_plain_open(loader_mount):
    mount = loader_mount
    import json

    with open(os.path.join(mount, ".loosefs", "stats")) as f:
        first = json.load(f)
    with open(os.path.join(mount, ".loosefs", "stats")) as f:
        second = json.load(f)
    assert second["requests"]["lookup"] > first["requests"]["lookup"], "stats are fresh on every open"
    assert first["pack"]["samples"] > 0
    if "dir-passthrough" in str(mount):
        # The directory is read in place by the kernel: the loaders above sent no READ.
        assert first["pack"]["reads"] == "passthrough" and first["requests"]["read"] == 0, first
    elif "dir" in pathlib.Path(mount).parent.name:
        assert first["pack"]["reads"] == "daemon" and first["requests"]["read"] > 0, first


def wait_until(what, done, secs=30):
    """Polls `done` until it holds: a change reaches a mount when its watcher has read the
    event (milliseconds, not at once)."""
    t0 = time.monotonic()
    while not done():
        assert time.monotonic() - t0 < secs, f"never seen: {what}"
        time.sleep(0.002)


def reads_as(path, want):
    """True once `path` reads as `want`. Until the mount has seen a file replaced, an open of
    it reaches the version it indexed, which answers EIO (its bytes are gone): not yet."""
    try:
        return path.read_bytes() == want
    except OSError as e:
        if e.errno != errno.EIO:
            raise
        return False


@pytest.mark.parametrize("passthrough", ["off", "on"])
def test_imagefolder_follows_a_directory_changed_while_mounted(source, tmp_path, passthrough):
    """A dataset directory grown and pruned while mounted: a class directory moved in whole, a
    sample removed, a sample replaced. ImageFolder built after the changes sees what it sees
    on the directory itself, sample for sample."""
    need_mount()
    dirs = sorted(d for d in pathlib.Path(source).iterdir() if d.is_dir())
    classes = [d.name for d in dirs[:3]]
    src = tmp_path / "src"
    for c in classes[:2]:
        shutil.copytree(pathlib.Path(source) / c, src / c)
    # Three samples in the first class at least (the shared sample has one per class).
    for k, d in enumerate(dirs[3:5]):
        shutil.copyfile(next(d.iterdir()), src / classes[0] / f"extra_{k}.JPEG")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    b = loosefs_bin()
    subprocess.run([b, "mount", str(src), str(mnt), "--log", str(tmp_path / "daemon.log"),
                    "--passthrough", passthrough], check=True)
    try:
        before = torchvision.datasets.ImageFolder(str(mnt))
        assert before.classes == classes[:2]
        # A new class arrives the way dataset updates do: written aside, then renamed in.
        shutil.copytree(pathlib.Path(source) / classes[2], tmp_path / "incoming")
        os.rename(tmp_path / "incoming", src / classes[2])
        first = sorted((src / classes[0]).iterdir())
        first[0].unlink()
        shutil.copyfile(first[2], src / classes[0] / ".tmp")
        os.rename(src / classes[0] / ".tmp", first[1])
        wait_until("the new class", lambda: classes[2] in os.listdir(mnt))
        wait_until("the removed sample", lambda: first[0].name not in os.listdir(mnt / classes[0]))
        wait_until("the replaced sample", lambda: reads_as(mnt / classes[0] / first[1].name, first[2].read_bytes()))
        a = torchvision.datasets.ImageFolder(str(src))
        after = torchvision.datasets.ImageFolder(str(mnt))
        assert after.classes == a.classes == classes
        assert rel(after.samples, mnt) == rel(a.samples, src)
        for (pa, _), (pb, _) in zip(a.samples, after.samples):
            assert pathlib.Path(pa).read_bytes() == pathlib.Path(pb).read_bytes(), pa
        stats = json.loads((mnt / ".loosefs" / "stats").read_text())
        assert stats["changes"]["late_nodes"] >= 1 + len(os.listdir(src / classes[2])), stats["changes"]
    finally:
        subprocess.run([b, "umount", str(mnt)], check=True)
