"""PyTorch glue: `EpochSampler` announces each epoch's order to a loosefs mount, so the
mount reads ahead exactly what the DataLoader will ask for, in the order it will ask.

    from torch.utils.data import DataLoader, RandomSampler
    from loosefs.torch import EpochSampler
    ds = torchvision.datasets.ImageFolder("/mnt/train", transform=...)
    loader = DataLoader(ds, sampler=EpochSampler(RandomSampler(ds), ds, "/mnt/train"),
                        batch_size=256, num_workers=8)

It wraps any sampler of indices (RandomSampler, DistributedSampler, a BatchSampler); the
DataLoader's workers need no change. Under DistributedSampler each rank announces only its own
indices, so each rank's mount fetches only its own samples. `EpochSampler.for_rank(ds, MNT)`
builds that DistributedSampler from the job's rank and world size (`rank_and_world`: torch.
distributed, torchrun's RANK/WORLD_SIZE, or Slurm's SLURM_PROCID/SLURM_NTASKS).
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Iterator, List, Optional

import torch.utils.data

from . import LoosefsError, PathLike, announce_order

__all__ = ["EpochSampler", "rank_and_world"]


def rank_and_world() -> "tuple[int, int]":
    """This process's (rank, world size): from an initialised `torch.distributed`, else the
    environment torchrun sets (`RANK`, `WORLD_SIZE`), else Slurm's (`SLURM_PROCID`,
    `SLURM_NTASKS`, one task per rank as `srun` starts them), else (0, 1).

    Raises ValueError when the variables are not integers or the rank is not below the world
    size (naming them)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    for rank_var, world_var in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_var in os.environ and world_var in os.environ:
            try:
                rank, world = int(os.environ[rank_var]), int(os.environ[world_var])
            except ValueError:
                raise ValueError(f"{rank_var}={os.environ[rank_var]!r} and {world_var}="
                                 f"{os.environ[world_var]!r} must be integers") from None
            if not 0 <= rank < world:
                raise ValueError(f"{rank_var}={rank} is not below {world_var}={world}")
            return rank, world
    return 0, 1


def _default_path_of(dataset: Any) -> Callable[[int], str]:
    """The path of sample i of a torchvision DatasetFolder/ImageFolder (`samples`, `imgs`) or a
    dataset with a `files` list."""
    for attr in ("samples", "imgs"):
        items = getattr(dataset, attr, None)
        if items is not None:
            listed: Any = items
            return lambda i: str(listed[i][0])
    files = getattr(dataset, "files", None)
    if files is not None:
        return lambda i: files[i]
    raise TypeError(f"{type(dataset).__name__} has no samples, imgs or files list: pass path_of=")


class EpochSampler(torch.utils.data.Sampler):
    """Yields what `sampler` yields, after announcing the epoch's file order to the loosefs
    mount at `mountpoint` (see `loosefs.announce_order`) when each iteration starts.

    `path_of(i)` gives the file of index i (default: `dataset.samples[i][0]`, as ImageFolder
    keeps them; a relative path is taken from the working directory). A failed announcement warns once and training goes on without the hint."""

    def __init__(self, sampler: Any, dataset: Any, mountpoint: PathLike,
                 path_of: Optional[Callable[[int], PathLike]] = None):
        self.sampler, self.mountpoint = sampler, mountpoint
        self.path_of = path_of or _default_path_of(dataset)
        self._warned = False

    @classmethod
    def for_rank(cls, dataset: Any, mountpoint: PathLike, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False,
                 path_of: Optional[Callable[[int], PathLike]] = None) -> "EpochSampler":
        """An EpochSampler around a `DistributedSampler` of this rank's share of `dataset`
        (rank and world size from `rank_and_world()`), so each rank's mount fetches only its
        own samples. Call `set_epoch(e)` each epoch, as with DistributedSampler."""
        rank, world = rank_and_world()
        sampler: Any = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                      shuffle=shuffle, seed=seed, drop_last=drop_last)
        return cls(sampler, dataset, mountpoint, path_of=path_of)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the wrapped sampler (DistributedSampler shuffles per epoch)."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        items: List[Any] = list(iter(self.sampler))
        flat = [j for x in items for j in (x if isinstance(x, (list, tuple)) else (x,))]
        try:
            announce_order(self.mountpoint, (os.path.abspath(self.path_of(int(i))) for i in flat))
        except (LoosefsError, OSError) as e:
            if not self._warned:
                self._warned = True
                warnings.warn(f"loosefs: epoch order not announced, reading without it: {e}")
        return iter(items)
