"""Variants beyond ../shared/data/formats, written here by each format's own writer
(write_formats.py: many WebDataset shards with PAX-long keys and no class names, 1-based
TFRecord labels without synsets, zstd MDS shards, zstd LitData chunks, a deflated zip, GulpIO
videos of four frames, Snappy and dictionary-encoded Parquet from datasets 4.5), mounted and read by ImageFolder: the classes, the labels and every
byte as the writer's input, the compressed ones through a chunk cache smaller than one chunk."""
import hashlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torchvision

from conftest import DATA, ROOT, loosefs_bin, need_mount

def samples():
    """The ImageNet sample of the tests' data (../shared/data, else the corpus the project
    makes)."""
    return DATA / "imagenet-sample"


def md5(b):
    return hashlib.md5(b).hexdigest()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("written")
    subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("write_formats.py")), str(samples()), str(out)], check=True, capture_output=True)
    classes = sorted(os.listdir(samples()))[:12]
    src = {}
    for i, c in enumerate(classes):
        for f in os.listdir(samples() / c):
            src[md5((samples() / c / f).read_bytes())] = i
    return out, classes, src


def mounted(written, name, tmp_path, *extra):
    need_mount()
    out, _, _ = written
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([loosefs_bin(), "mount", str(out / name), str(mnt), "--index-dir", str(tmp_path / "index"), *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return mnt


def umount(mnt):
    subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True)


@pytest.mark.parametrize(
    "name, dirs, extra",
    [
        ("webdataset", "numbers0", []),
        ("tfrecord", "numbers1", []),
        ("mds-zstd", "wnids", ["--chunk-cache", "256K"]),
        ("litdata-zstd", "numbers0", ["--chunk-cache", "256K"]),
        ("zip-deflated.zip", "wnids", ["--chunk-cache", "256K"]),
        ("hf-parquet-snappy", "wnids", ["--chunk-cache", "256K"]),
    ],
)
def test_written_variant_reads_as_its_source(written, tmp_path, name, dirs, extra):
    _, classes, src = written
    mnt = mounted(written, name, tmp_path, *extra)
    try:
        root = mnt / "train" if name.endswith(".zip") else mnt
        ds = torchvision.datasets.ImageFolder(str(root))
        want = {
            "wnids": classes,
            "numbers0": [f"{i:04d}" for i in range(12)],
            # TFRecord labels as stored (1-based): ImageFolder's class 0 is label 1.
            "numbers1": [f"{i:04d}" for i in range(1, 13)],
        }[dirs]
        assert ds.classes == want
        assert len(ds) == 12
        for path, y in ds.samples:
            h = md5(pathlib.Path(path).read_bytes())
            assert src.get(h) == y, path
        # The compressed ones were served through a cache smaller than one chunk: read them
        # all again in reverse (every chunk decompressed again) and compare.
        for path, y in reversed(ds.samples):
            assert src.get(md5(pathlib.Path(path).read_bytes())) == y
    finally:
        umount(mnt)


def test_mds_pil_pixels_are_served_as_ppm_equal_to_pillow(written, tmp_path):
    """An MDS `pil` column: raw RGB pixels served behind a PPM header; each equals Pillow's
    RGB of the source resized to 64x48 as the writer was given it."""
    from PIL import Image

    _, classes, _ = written
    mnt = mounted(written, "mds-pil", tmp_path)
    try:
        ds = torchvision.datasets.ImageFolder(str(mnt))
        assert ds.classes == [f"{i:04d}" for i in range(12)] and len(ds) == 12
        for path, y in ds.samples:
            c = classes[y]
            src = next((samples() / c).iterdir())
            with Image.open(src) as im:
                want = np.asarray(im.convert("RGB").resize((64, 48)))
            with Image.open(path) as im:
                assert im.format == "PPM"
                assert np.array_equal(np.asarray(im), want), path
    finally:
        umount(mnt)


def test_gulpio_videos_show_one_file_per_frame_equal_to_gulpio2(written, tmp_path):
    import gulpio2
    from gulpio2.utils import jpeg_bytes_to_img

    out, classes, _ = written
    mnt = mounted(written, "gulpio-video", tmp_path)
    try:
        ds = torchvision.datasets.ImageFolder(str(mnt))
        assert ds.classes == classes[:3]
        assert len(ds) == 12
        gd = gulpio2.GulpDirectory(str(out / "gulpio-video"))
        seen = 0
        for chunk in gd:
            for frames, meta in chunk:
                label = meta["label"]
                assert len(frames) == 4
                for k, fr in enumerate(frames):
                    p = mnt / label / f"{label}-video_{k:04d}.jpg"
                    assert np.array_equal(jpeg_bytes_to_img(p.read_bytes()), fr), p
                    seen += 1
        assert seen == 12
    finally:
        umount(mnt)


def test_damaged_compressed_parquet_answers_eio_and_never_wedges(written, tmp_path):
    """Bytes of a Snappy, dictionary-encoded Parquet file flipped after indexing (bit rot): a
    decoder that fails or panics on them fails those reads with EIO; every read ends, the
    others keep their bytes, and the mount unmounts (a panic used to leave the chunk's single
    flight set, so later readers slept forever and umount was busy)."""
    import concurrent.futures
    import errno
    import shutil

    out, _, src = written
    work = tmp_path / "w"
    shutil.copytree(out / "hf-parquet-snappy", work)
    mnt = mounted((tmp_path, None, None), "w", tmp_path)
    try:
        f = work / "train.parquet"
        data = bytearray(f.read_bytes())
        for k in range(1, 9):
            data[len(data) * k // 10] ^= 0x5A
        f.write_bytes(data)
        files = sorted(p for p in mnt.rglob("*") if p.is_file())
        assert len(files) > 0

        def read(p):
            try:
                return md5(p.read_bytes())
            except OSError as e:
                return e.errno

        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            results = list(ex.map(read, files * 2, timeout=300))
        eio = sum(r == errno.EIO for r in results)
        good = sum(isinstance(r, str) and r in src for r in results)
        assert eio + good == len(results), [r for r in results if r != errno.EIO and r not in src][:5]
        assert eio > 0, "the damage went unnoticed"
    finally:
        umount(mnt)
