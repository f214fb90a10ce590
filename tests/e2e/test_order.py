"""Announced epoch orders over a real mount of the sample pack: `loosefs.announce_order` and
`loosefs.torch.EpochSampler` around RandomSampler and DistributedSampler, a DataLoader with
workers reading byte-identical files in the announced order, the mount's `order` stats
(every sample served in order, none off it), a stale order abandoned, bad paths counted."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import ROOT, loosefs_bin, missing_prerequisite, need_mount, order_stats

sys.path.insert(0, str(ROOT / "python"))
import loosefs  # noqa: E402

try:
    import torch
    import torchvision  # noqa: F401
except ImportError as e:  # the venv of scripts/python-env.sh has both
    missing_prerequisite(f"torch/torchvision cannot be imported ({e})")
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler  # noqa: E402

from loosefs.torch import EpochSampler  # noqa: E402


class RawFolder(torchvision.datasets.ImageFolder):
    """ImageFolder returning each file's bytes (no decode): what is compared is what was read."""

    def __getitem__(self, i):
        with open(self.samples[i][0], "rb") as f:
            return i, f.read()


def collate(batch):
    return batch


def epoch(ds, sampler, workers=2):
    loader = DataLoader(ds, sampler=sampler, batch_size=16, num_workers=workers, collate_fn=collate)
    return [item for batch in loader for item in batch]


def test_epoch_sampler_announces_a_shuffled_epoch_read_identical(order_mount, source):
    ds = RawFolder(str(order_mount))
    sampler = EpochSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(3)), ds, order_mount)
    got = epoch(ds, sampler)
    assert len(got) == len(ds)
    for i, data in got:
        rel = os.path.relpath(ds.samples[i][0], order_mount)
        assert data == (source / rel).read_bytes(), rel
    o = order_stats(order_mount)
    assert o["announced"] == 1 and o["unresolved_paths"] == 0, o
    assert o["served"] == len(ds) and o["left"] == 0 and o["abandoned"] == 0, o
    assert o["read_ahead"] > 0, o
    # Samples after a READ that the order read ahead were pushed into the kernel's cache of
    # their files (the listing made their inodes known): the bytes compared above include
    # those the kernel served from what was pushed.
    with open(order_mount / ".loosefs" / "stats") as f:
        push = json.load(f)["push_ahead"]
    assert push["samples"] > 0, push
    # The next epoch announces again; the kernel holds every file whole now, so the order
    # reads nothing (a file the kernel dropped meanwhile is read again and counted served).
    first = o
    epoch(ds, sampler)
    o = order_stats(order_mount)
    assert o["announced"] == 2 and o["abandoned"] == 0 and o["live"] == 0, o
    assert o["cached"] + (o["served"] - len(ds)) == len(ds), o
    assert o["read_ahead"] - first["read_ahead"] == o["served"] - len(ds), o


def test_a_rank_announces_only_its_own_samples(order_mount):
    ds = RawFolder(str(order_mount))
    dist = DistributedSampler(ds, num_replicas=4, rank=1, shuffle=True, seed=5)
    sampler = EpochSampler(dist, ds, order_mount)
    sampler.set_epoch(1)
    got = epoch(ds, sampler, workers=1)
    mine = list(dist)
    assert sorted(i for i, _ in got) == sorted(mine)
    o = order_stats(order_mount)
    assert o["served"] == len(mine) and o["left"] == 0, o
    assert o["read_ahead"] <= len(mine), o


def test_a_slurm_task_announces_its_share_from_the_environment(order_mount, monkeypatch):
    """Under `srun` (SLURM_PROCID/SLURM_NTASKS, no torchrun variables) `for_rank` gives task 2
    of 3 its DistributedSampler share, and only that share is announced; torchrun's RANK and
    WORLD_SIZE win over Slurm's; a rank past the world size is refused naming both."""
    from loosefs.torch import rank_and_world
    for v in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    assert rank_and_world() == (2, 3)
    ds = RawFolder(str(order_mount))
    sampler = EpochSampler.for_rank(ds, order_mount, seed=7)
    sampler.set_epoch(2)
    ref = DistributedSampler(ds, num_replicas=3, rank=2, shuffle=True, seed=7)
    ref.set_epoch(2)
    mine = list(ref)
    got = epoch(ds, sampler, workers=1)
    assert sorted(i for i, _ in got) == sorted(mine)
    o = order_stats(order_mount)
    assert o["served"] == len(mine) and o["left"] == 0, o
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rank_and_world() == (0, 2)
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match="RANK=5 is not below WORLD_SIZE=2"):
        rank_and_world()


def test_announce_order_takes_relative_and_absolute_paths_and_counts_the_rest(order_mount, source):
    rel = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file())
    paths = [rel[0], str(order_mount / rel[1]), "no/such/file.JPEG", "/elsewhere/x.JPEG"]
    assert loosefs.announce_order(order_mount, paths) == 4
    o = order_stats(order_mount)
    assert (o["samples"], o["unresolved_paths"]) == (2, 2), o
    with pytest.raises(ValueError):
        loosefs.announce_order(order_mount, ["a\nb"])
    with pytest.raises(loosefs.LoosefsError):
        loosefs.announce_order(source, rel[:3])


def test_a_stale_order_is_abandoned_and_reads_stay_identical(order_mount, source):
    rel = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file())
    half = len(rel) // 2
    loosefs.announce_order(order_mount, rel[:half])
    for r in rel[half:]:
        assert (order_mount / r).read_bytes() == (source / r).read_bytes(), r
    o = order_stats(order_mount)
    assert o["abandoned"] == 1 and o["live"] == 0 and o["window_bytes"] == 0, o


def test_an_order_over_a_mebibyte_written_through_the_mount_keeps_the_daemon_small(tmp_path, monkeypatch):
    """20,000 samples announced twice each in one write (2.4 MB of paths, as one `write()`
    the kernel splits into requests of its own size), twice: every line counted; the daemon's
    anonymous memory grows by less than twice the text for the first, and hardly at all for
    the second, which replaces it (what an order keeps is a few bytes a line)."""
    need_mount()
    monkeypatch.setenv("LOOSEFS_BIN", loosefs_bin())
    src = tmp_path / "many"
    names = []
    for c in range(100):
        d = src / f"class_{c:03d}_with_a_longer_directory_name"
        d.mkdir(parents=True)
        for k in range(200):
            (d / f"sample_{c:03d}_{k:04d}.bin").write_bytes(b"%d.%d" % (c, k))
            names.append(f"{d.name}/sample_{c:03d}_{k:04d}.bin")
    pack = tmp_path / "many.pack"
    r = subprocess.run([loosefs_bin(), "pack", str(src), str(pack), "--align", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    order = names + names[::-1]
    text = "".join(f"{n}\n" for n in order).encode()
    assert len(text) > 1 << 20, len(text)
    (tmp_path / "mnt").mkdir()
    # One thread over /dev/fuse takes the writes: one request buffer filled (over io_uring each
    # ring entry that takes a write touches a payload buffer of its own, up to 1 MiB each).
    with loosefs.mount(pack, tmp_path / "mnt", threads=1, transport="classic") as m:
        mnt = pathlib.Path(m.path)
        pid = json.loads((mnt / ".loosefs" / "stats").read_text())["daemon"]["pid"]
        rss0 = rss_kb(pid)
        grown = []
        for _ in range(2):  # the second replaces the first (same writer)
            fd = os.open(mnt / ".loosefs" / "order", os.O_WRONLY | os.O_TRUNC)
            try:
                assert os.write(fd, text) == len(text)
            finally:
                os.close(fd)
            grown.append(rss_kb(pid) - rss0)
            o = order_stats(mnt)
            assert (o["samples"], o["unresolved_paths"]) == (len(order), 0), o
        print(f"order of {len(text)} bytes, {len(order)} lines: daemon RssAnon +{grown[0]} KiB, "
              f"+{grown[1] - grown[0]} KiB more for the second")
        # One order's records and the request buffer the writes filled: below the text (never
        # held whole); the second order reuses what the first freed.
        assert grown[0] * 1024 < len(text), f"the daemon grew by {grown[0]} KiB for a {len(text)}-byte order"
        assert (grown[1] - grown[0]) * 1024 < len(text) / 4, f"the second order grew it by {grown[1] - grown[0]} KiB"
        for n in order[:50]:
            assert (mnt / n).read_bytes() == (src / n).read_bytes(), n


def rss_kb(pid: int) -> int:
    """The daemon's anonymous resident memory (its heap and stacks; not the pack's index
    pages it maps, which resolving 20,000 paths touches)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError(f"no RssAnon for {pid}")
