#!/usr/bin/env python3
"""Writes a small ImageFolder tree of real JPEGs (encoded by Pillow; gradients plus noise, one
grayscale image per class) for demos and tests on machines without ../shared/data.

    scripts/make-sample-jpegs.py OUT [--classes 8] [--per-class 16] [--seed 0]
"""
import argparse
import pathlib

import numpy as np
from PIL import Image


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    for c in range(a.classes):
        d = a.out / f"class_{c:03d}"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(a.per_class):
            h, w = int(rng.integers(200, 400)), int(rng.integers(200, 500))
            yy, xx = np.mgrid[0:h, 0:w]
            img = np.stack([xx * 255 // w, yy * 255 // h, rng.integers(0, 255, (h, w))], -1).astype("uint8")
            im = Image.fromarray(img)
            if k == 0:
                im = im.convert("L")
            im.save(d / f"img_{k:04d}.JPEG", quality=int(rng.integers(88, 97)))
    print(f"wrote {a.classes * a.per_class} JPEGs under {a.out}")


if __name__ == "__main__":
    main()
