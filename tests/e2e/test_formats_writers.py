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


def _write_beton():
    """scripts/make-test-data.py's FFCV writer (the corpus' ffcv/ files)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_test_data", ROOT / "scripts" / "make-test-data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_beton


def _beton(path):
    """(header, descriptors, rows, allocation table) of a .beton, parsed with struct as
    research/formats.md §1 lays it out."""
    import struct
    b = path.read_bytes()
    header = struct.unpack_from("<HHIQQ", b, 0)
    _v, nf, page, n, alloc = header
    descriptors = b[24:24 + 1041 * nf]
    meta = 24 + 1041 * nf
    rows = [struct.unpack_from("<BHHQ3xq", b, meta + 24 * i) for i in range(n)]
    table = [struct.unpack_from("<QQQ", b, k) for k in range(alloc, len(b), 24)]
    return b, header, descriptors, rows, table


@pytest.mark.parametrize("mode", ["jpg", "raw"])
def test_the_corpus_ffcv_writer_lays_out_a_beton_as_ffcvs_own_writer_does(mode, tmp_path):
    """The corpus' FFCV files come from the project's writer, not ffcv's (which needs OpenCV
    and a compiler). Its layout is held to research/formats.md §1 (ffcv's writer.py), and,
    where ../shared/data has files ffcv 1.0.2's writer made from the ImageNet sample, to those:
    written here from the same 48 images, the header and field descriptors are byte-identical,
    every row's mode, size and label equal, and for raw pixels (whose length depends only on
    the size) every data offset and the whole allocation table too."""
    from PIL import Image
    write_beton = _write_beton()
    real_dir = ROOT.parent / "shared" / "data" / "formats"
    real = real_dir / "ffcv" / f"{mode}.beton"
    if real.is_file():
        import json
        m = json.loads((real_dir / "manifest.json").read_text())
        src = ROOT.parent / "shared" / "data" / "imagenet-sample"
        items = [(m["classes"].index(f.split("/")[0]), src / f) for f in m["files"]]
    else:  # a clone: the rules alone, on the corpus' images
        src = samples()
        classes = sorted(os.listdir(src))[:48]
        items = [(i, src / c / f) for i, c in enumerate(classes) for f in sorted(os.listdir(src / c))]
    out = tmp_path / f"{mode}.beton"
    write_beton(out, items, mode)
    b, header, descriptors, rows, table = _beton(out)
    version, nf, page, n, alloc = header
    assert (version, nf, page, n) == (2, 2, 1 << 21, len(items))
    assert descriptors[0] == 2 and descriptors[1:17] == b"image".ljust(16, b"\0")
    assert descriptors[1041] == 1 and descriptors[1042:1058] == b"label".ljust(16, b"\0")
    assert not any(descriptors[17:1041]) and not any(descriptors[1058:])
    data_start = -(-(24 + 1041 * 2 + 24 * n) // page) * page
    assert alloc % page == 0 and len(b) == alloc + 24 * n
    assert [t[0] for t in table] == list(range(n))
    sizes = {ptr: size for _sid, ptr, size in table}
    for i, ((row_mode, w, h, ptr, label), (want_label, path)) in enumerate(zip(rows, items)):
        assert row_mode == (0 if mode == "jpg" else 1) and label == want_label, i
        assert max(w, h) <= 256 and table[i][1] == ptr, i
        assert data_start <= ptr and ptr // page == (ptr + sizes[ptr] - 1) // page, f"sample {i} spans pages"
        with Image.open(path) as im:
            ow, oh = im.size
        r = 256 / max(ow, oh)
        assert (w, h) == ((int(ow * r), int(oh * r)) if r < 1 else (ow, oh)), i
        if mode == "raw":
            assert sizes[ptr] == w * h * 3, i
        else:
            with Image.open(__import__("io").BytesIO(b[ptr:ptr + sizes[ptr]])) as im:
                assert im.format == "JPEG" and im.size == (w, h), i
    if real.is_file():
        rb, rheader, rdescriptors, rrows, rtable = _beton(real)
        assert header == rheader and descriptors == rdescriptors
        assert [(r[0], r[1], r[2], r[4]) for r in rows] == [(r[0], r[1], r[2], r[4]) for r in rrows]
        if mode == "raw":
            assert rows == rrows and table == rtable and len(b) == len(rb)
