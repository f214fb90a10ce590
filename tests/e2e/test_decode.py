"""Decoded views through a real mount (`--decode npy,ppm`): every sample's .npy, read with
np.load and with np.load(mmap_mode='r'), equals Pillow's Image.open(x).convert('RGB') pixel for
pixel; ImageFolder over the PPM view (original names) sees the same classes and samples and
decodes equal tensors; grayscale samples come out RGB; stat sizes equal the bytes read."""
import json
import os
import subprocess

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision.transforms import v2 as T

from conftest import loosefs_bin


def jpegs(source):
    for c in sorted(os.listdir(source)):
        d = os.path.join(source, c)
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                yield c, f


def stats(mnt):
    out = subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], check=True, capture_output=True)
    return json.loads(out.stdout)["decode"]


def test_npy_equals_pillow_for_every_sample(source, decoded_mount):
    n = grey = 0
    for c, f in jpegs(source):
        with Image.open(os.path.join(source, c, f)) as im:
            grey += im.mode != "RGB"
            ref = np.asarray(im.convert("RGB"))
        p = os.path.join(decoded_mount, c, os.path.splitext(f)[0] + ".npy")
        a = np.load(p)
        m = np.load(p, mmap_mode="r")
        assert a.dtype == np.uint8 and a.shape == ref.shape and a.shape[2] == 3, (f, a.shape, ref.shape)
        diff = int(np.abs(a.astype(np.int16) - ref).max())
        assert diff == 0, f"{c}/{f}: max difference {diff}"
        assert np.array_equal(m, ref), f
        assert os.stat(p).st_size == len(open(p, "rb").read())
        n += 1
    assert n > 0
    if os.path.basename(source) == "imagenet-sample":
        assert n == 1000 and grey == 23, (n, grey)
    s = stats(decoded_mount)
    assert s["failures"] == 0 and s["decodes"] >= n


def test_imagefolder_over_ppm_view_equals_jpeg(source, decoded_mount):
    a = torchvision.datasets.ImageFolder(str(source))
    b = torchvision.datasets.ImageFolder(str(decoded_mount))
    assert b.classes == a.classes
    rel = lambda ds, root: [(os.path.relpath(p, root), y) for p, y in ds.samples]
    assert rel(b, decoded_mount) == rel(a, source)
    to_tensor = T.Compose([T.ToImage(), T.ToDtype(torch.uint8)])
    for i in range(len(a)):
        path = b.samples[i][0]
        with open(path, "rb") as fh:
            head = fh.read(2)
        assert head == b"P6", path
        assert os.stat(path).st_size == len(open(path, "rb").read())
        (xa, ya), (xb, yb) = a[i], b[i]
        assert ya == yb and xb.mode == "RGB"
        ta, tb = to_tensor(xa.convert("RGB")), to_tensor(xb)
        assert ta.shape == tb.shape and torch.equal(ta, tb), path
