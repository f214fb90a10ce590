"""PyTorch glue: `EpochSampler` announces each epoch's order to a loosefs mount, so the
mount reads ahead exactly what the DataLoader will ask for, in the order it will ask.

    from torch.utils.data import DataLoader, RandomSampler
    from loosefs.torch import EpochSampler
    ds = torchvision.datasets.ImageFolder("/mnt/train", transform=...)
    loader = DataLoader(ds, sampler=EpochSampler(RandomSampler(ds), ds, "/mnt/train"),
                        batch_size=256, num_workers=8)

It wraps any sampler of indices (RandomSampler, DistributedSampler, a BatchSampler); the
DataLoader's workers need no change. Under DistributedSampler each rank announces only its own
indices, so each rank's mount fetches only its own samples.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Iterator, List, Optional

import torch.utils.data

from . import LoosefsError, PathLike, announce_order

__all__ = ["EpochSampler"]


def _default_path_of(dataset: Any) -> Callable[[int], str]:
    """The path of sample i of a torchvision DatasetFolder/ImageFolder (`samples`, `imgs`) or a
    dataset with a `files` list."""
    for attr in ("samples", "imgs"):
        items = getattr(dataset, attr, None)
        if items is not None:
            return lambda i, items=items: items[i][0]
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
