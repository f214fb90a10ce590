#!/usr/bin/env python3
"""FUSE requests per file that each loader's syscalls cost (issue 25: "fewer requests per file
wherever the kernel allows" starts from this count). A pack of DATA is mounted with
`--decode npy`; each loader reads every sample cold (`loosefs drop-cache` and `drop_caches` before: pages,
dentries and inodes gone), then warm twice (the page cache and the dentries hold everything;
the first warm pass still sees the attributes the cold pass's READs invalidated); the mount's own request counters (`loosefs stats --json`) before
and after, divided by the files read. Loaders: Python `open().read()` buffered and unbuffered,
Pillow `Image.open().convert("RGB")`, torchvision ImageFolder (listing + default loader),
`np.load` of the `.npy` views, NVIDIA DALI `readers.file` (CPU).

Run as root from the repository with the test venv: python bench/requests_per_file.py [--data DIR]
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "loosefs"
KINDS = ["lookup", "getattr", "open", "ioctl", "read", "readdir"]


def counts(mnt):
    r = subprocess.run([str(BIN), "stats", str(mnt), "--json"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)["requests"]


def loaders(mnt):
    import numpy as np
    from PIL import Image

    jpegs = sorted(p for p in mnt.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))
    npys = [p.with_suffix(".npy") for p in jpegs]

    def imagefolder():
        import torchvision
        ds = torchvision.datasets.ImageFolder(str(mnt), is_valid_file=lambda p: not p.endswith(".npy"))
        for i in range(len(ds)):
            ds[i]
        return len(ds)

    def dali():
        from nvidia.dali import fn, pipeline_def

        @pipeline_def(batch_size=50, num_threads=2, device_id=None)
        def pipe():
            jpegs, labels = fn.readers.file(file_root=str(mnt), random_shuffle=False, name="r",
                                            file_filters=["*.JPEG", "*.jpg", "*.jpeg"])
            return jpegs, labels
        p = pipe()
        p.build()
        n = p.epoch_size("r")
        got = 0
        while got < n:
            got += len(p.run()[1])
        return n

    def each(fn, files):
        def run():
            for f in files:
                fn(f)
            return len(files)
        return run

    return {
        "Python open().read() (buffered)": each(lambda p: open(p, "rb").read(), jpegs),
        "Python open(buffering=0).read()": each(lambda p: open(p, "rb", buffering=0).read(), jpegs),
        "Pillow Image.open().convert('RGB')": each(lambda p: Image.open(p).convert("RGB"), jpegs),
        "torchvision ImageFolder (list + load)": imagefolder,
        "np.load of the .npy views": each(np.load, npys),
        "DALI readers.file (CPU)": dali,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-requests-"))
    pack, mnt = work / "data.pack", work / "mnt"
    mnt.mkdir()
    subprocess.run([str(BIN), "pack", a.data, str(pack), "--json"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(BIN), "mount", str(pack), str(mnt), "--decode", "npy"], check=True,
                   stderr=subprocess.DEVNULL)
    try:
        print("| loader | state | " + " | ".join(KINDS) + " | total per file |")
        print("|---|---|" + "---|" * (len(KINDS) + 1))
        for name, run in loaders(mnt).items():
            for state in ["cold", "warm, 1st pass", "warm, 2nd pass"]:
                if state == "cold":
                    subprocess.run([str(BIN), "drop-cache", str(mnt)], check=True, capture_output=True)
                    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
                c0 = counts(mnt)
                n = run()
                c1 = counts(mnt)
                per = {k: (c1.get(k, 0) - c0.get(k, 0)) / n for k in KINDS}
                print(f"| {name} | {state} | " + " | ".join(f"{per[k]:.2f}" for k in KINDS)
                      + f" | {sum(per.values()):.2f} |")
    finally:
        subprocess.run([str(BIN), "umount", str(mnt)], check=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
