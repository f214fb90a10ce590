#!/usr/bin/env python3
"""One pass of a real training loader over a directory, for bench/run.py. Prints one JSON line:
files, seconds, files_per_s, first_batch_s (time from creating the loader to the first batch),
cpu_s (user+system of this process and its workers) and max_rss_bytes (largest resident set
among this process and its workers).

Loaders: `imagefolder` (torchvision ImageFolder + DataLoader, the standard train transform
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor, batch 32) and `dali` (readers.file +
CPU decode + random resized crop 224 + flip, batch 32, device_id=None); for the decoded views,
`folder` (ImageFolder with its default loader and no transform: every sample opened by PIL and
converted to RGB, the loop of a JPEG vs PPM comparison) and `npy` (np.load of every .npy file);
`bytes` (ImageFolder whose loader reads the file + DataLoader, batch 32: each sample's encoded
bytes, what a GPU-decode pipeline's workers do before `decode_jpeg(device="cuda")`, so the
pass is bound by reads, not by the CPU's decoding).

    bench/loader_pass.py --root DIR --loader imagefolder --workers 2 --order shuffled --limit 2000
"""
import argparse
import json
import resource
import time


def rusage():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime, max(s.ru_maxrss, c.ru_maxrss) * 1024


def pass_loader(a, ds, **kw):
    """A DataLoader (batch 32, `--workers`) over `ds` in the pass's order: a torch permutation
    of `--seed` when shuffled, cut to `--limit`."""
    import torch

    idx = list(range(len(ds)))
    if a.order == "shuffled":
        g = torch.Generator().manual_seed(a.seed)
        idx = torch.randperm(len(ds), generator=g).tolist()
    if a.limit:
        idx = idx[: a.limit]
    return torch.utils.data.DataLoader(torch.utils.data.Subset(ds, idx), batch_size=32, shuffle=False,
                                       num_workers=a.workers, **kw)


def timed(batches, size):
    """Iterates `batches`: (samples, seconds, seconds to the first batch); `size(batch)` counts
    a batch's samples."""
    n, first = 0, None
    t0 = time.perf_counter()
    for batch in batches:
        if first is None:
            first = time.perf_counter() - t0
        n += size(batch)
    return n, time.perf_counter() - t0, first


def imagefolder(a):
    import torchvision
    from torchvision import transforms as T

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = torchvision.datasets.ImageFolder(a.root, transform=tf)
    return timed(pass_loader(a, ds), lambda batch: batch[0].shape[0])


def read_bytes(path):
    """A sample's encoded bytes (returned as bytes: worker processes hand tensors over by
    passing file descriptors, which a batch of thousands of small tensors runs out of)."""
    with open(path, "rb") as f:
        return f.read()


def collate_list(batch):
    return batch


def encoded(a):
    import torchvision

    ds = torchvision.datasets.ImageFolder(a.root, loader=read_bytes)
    return timed(pass_loader(a, ds, collate_fn=collate_list), len)


def order(a, n):
    import random

    idx = list(range(n))
    if a.order == "shuffled":
        random.Random(a.seed).shuffle(idx)
    return idx[: a.limit] if a.limit else idx


def folder(a):
    import torchvision

    ds = torchvision.datasets.ImageFolder(a.root)
    idx = order(a, len(ds))
    t0 = time.perf_counter()
    first = None
    for k, i in enumerate(idx):
        img, _ = ds[i]
        if first is None:
            first = time.perf_counter() - t0
    return len(idx), time.perf_counter() - t0, first


def npy(a):
    import os

    import numpy as np

    paths = []
    for d, dirs, names in os.walk(a.root):
        dirs.sort()
        paths += [os.path.join(d, n) for n in sorted(names) if n.endswith(".npy")]
    idx = order(a, len(paths))
    t0 = time.perf_counter()
    first = None
    pixels = 0
    for i in idx:
        x = np.load(paths[i])
        pixels += x.shape[0] * x.shape[1]
        if first is None:
            first = time.perf_counter() - t0
    return len(idx), time.perf_counter() - t0, first


def dali(a):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=32, num_threads=2, device_id=None, seed=a.seed)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=a.root, random_shuffle=a.order == "shuffled", name="r")
        img = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        img = fn.random_resized_crop(img, size=(224, 224))
        img = fn.flip(img, horizontal=fn.random.coin_flip())
        return img, labels

    t0 = time.perf_counter()
    p = pipe()
    p.build()
    total = p.epoch_size("r")
    want = min(a.limit, total) if a.limit else total
    n, first = 0, None
    while n < want:
        imgs, _ = p.run()
        if first is None:
            first = time.perf_counter() - t0
        n += len(imgs)
    return min(n, want), time.perf_counter() - t0, first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--loader", choices=["imagefolder", "dali", "folder", "npy", "bytes"], default="imagefolder")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--order", choices=["inorder", "shuffled"], default="inorder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    loaders = {"imagefolder": imagefolder, "dali": dali, "folder": folder, "npy": npy, "bytes": encoded}
    n, secs, first = loaders[a.loader](a)
    cpu, rss = rusage()
    print(json.dumps({"files": n, "seconds": secs, "files_per_s": n / secs, "first_batch_s": first,
                      "cpu_s": cpu, "max_rss_bytes": rss, "p50_us": None, "p95_us": None, "p99_us": None}))


if __name__ == "__main__":
    main()
