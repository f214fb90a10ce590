#!/usr/bin/env python3
"""Writes variants of the foreign formats with their own writers, for test_formats_writers.py:
the first 12 classes of imagenet-sample (class i = label i), as

- webdataset/: webdataset ShardWriter, 3 samples per shard (4 shards), keys over 100 characters
  (PAX headers), `.cls` labels only (no class names);
- tfrecord/: tfrecord TFRecordWriter, two files, 1-based `image/class/label`, no synset;
- mds-zstd/: MosaicML MDSWriter, compression zstd, 512 KB shards;
- mds-pil/: MosaicML MDSWriter, a `pil` column of 64x48 RGB images (raw pixels);
- litdata-zstd/: LitData optimize, compression zstd (batch level, its default);
- zip-deflated.zip: Python zipfile, ZIP_DEFLATED;
- gulpio-video/: gulpio2 GulpIngestor, 3 items of 4 frames each (a video per class, frames being
  the class's image cropped four ways);
- hf-parquet-snappy/: Hugging Face datasets 4.5 (before 4.6 made image columns uncompressed)
  `Dataset.to_parquet`, two row groups: Snappy-compressed, dictionary-encoded pages.

Usage: write_formats.py SAMPLES OUT
"""
import io
import os
import sys
import zipfile


def items(samples):
    classes = sorted(os.listdir(samples))[:12]
    return [(i, c, os.path.join(samples, c, f)) for i, c in enumerate(classes) for f in sorted(os.listdir(os.path.join(samples, c)))]


def webdataset(it, out):
    import webdataset as wds

    os.makedirs(out)
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=3, verbose=0) as w:
        for i, c, p in it:
            key = f"{c}_" + "x" * 110 + f"_{os.path.basename(p).split('.')[0]}"
            w.write({"__key__": key, "jpg": open(p, "rb").read(), "cls": i})


def tfrecord(it, out):
    import tfrecord as tfr

    os.makedirs(out)
    for k in range(2):
        w = tfr.TFRecordWriter(os.path.join(out, f"train-{k:05d}-of-00002"))
        for i, c, p in it[k::2]:
            w.write({"image/encoded": (open(p, "rb").read(), "byte"), "image/class/label": (i + 1, "int"), "image/filename": (os.path.basename(p).encode(), "byte")})
        w.close()


def mds(it, out):
    from PIL import Image
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"image": "jpeg", "label": "int", "synset": "str"}, compression="zstd", size_limit=512 << 10) as w:
        for i, c, p in it:
            w.write({"image": Image.open(p), "label": i, "synset": c})


def mds_pil(it, out):
    from PIL import Image
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"image": "pil", "label": "int"}) as w:
        for i, c, p in it:
            w.write({"image": Image.open(p).convert("RGB").resize((64, 48)), "label": i})


def _lit(x):
    from PIL import Image

    i, c, p = x
    return (Image.open(p), i)


def litdata(it, out):
    from litdata import optimize

    optimize(fn=_lit, inputs=it, output_dir=out, chunk_bytes="600KB", num_workers=1, compression="zstd")


def zip_deflated(it, out):
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for i, c, p in it:
            z.write(p, f"train/{c}/{os.path.basename(p)}")


class Videos:
    """A gulpio2 adapter (iter_data/__len__): one 4-frame video per row, frames being the
    image cropped four ways (module level: the ingestor pickles it to its workers)."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def iter_data(self, slice_element=None):
        import numpy as np
        from PIL import Image

        for i, c, p in self.rows[slice_element or slice(None)]:
            im = np.asarray(Image.open(p).convert("RGB"))
            h, w = im.shape[:2]
            frames = [im[: h // 2, : w // 2], im[: h // 2, w // 2:], im[h // 2:, : w // 2], im[h // 2:, w // 2:]]
            yield {"meta": {"label": c}, "frames": [np.ascontiguousarray(f) for f in frames], "id": f"{c}-video"}


def gulpio(it, out):
    from gulpio2 import GulpIngestor

    GulpIngestor(Videos(it[:3]), out, videos_per_chunk=2, num_workers=1)()


def hf_parquet(it, out):
    import datasets

    os.makedirs(out)
    classes = sorted({c for _, c, _ in it})
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    ds = datasets.Dataset.from_dict({"image": [p for _, _, p in it], "label": [i for i, _, _ in it]}, features=feats)
    # Embed the bytes (not only the paths), as push_to_hub and save_to_disk do.
    ds = ds.cast_column("image", datasets.Image(decode=False)).map(lambda x: {"image": {"bytes": open(x["image"]["path"], "rb").read(), "path": os.path.basename(x["image"]["path"])}}, features=feats.copy())
    ds.to_parquet(os.path.join(out, "train.parquet"), batch_size=6)


def main():
    samples, out = sys.argv[1], sys.argv[2]
    it = items(samples)
    webdataset(it, os.path.join(out, "webdataset"))
    tfrecord(it, os.path.join(out, "tfrecord"))
    mds(it, os.path.join(out, "mds-zstd"))
    mds_pil(it, os.path.join(out, "mds-pil"))
    litdata(it, os.path.join(out, "litdata-zstd"))
    zip_deflated(it, os.path.join(out, "zip-deflated.zip"))
    gulpio(it, os.path.join(out, "gulpio-video"))
    hf_parquet(it, os.path.join(out, "hf-parquet-snappy"))


if __name__ == "__main__":
    main()
