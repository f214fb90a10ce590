"""Each epoch's order announced to the loosefs mount, for unchanged PyTorch training code.

Turned on by `LOOSEFS_ANNOUNCE_ORDER=1` in the environment (the `loosefs_announce_order.pth`
file the package installs runs `loosefs._orderhook` at interpreter start-up, which imports this
module once torch's DataLoader is imported; `0`, `false`, `no`, `off` or unset: off), or
explicitly by one import before the DataLoader is iterated:

    import loosefs.autoorder  # noqa: F401

When a `torch.utils.data.DataLoader` over a map-style dataset starts an epoch, the first index
it asks its sampler for makes the whole epoch's order be taken at once, the samples' files
announced to the loosefs mount that holds them (`loosefs.announce_order`), and the indices then
handed out as the sampler gave them. The mount reads ahead along that order, so a cold shuffled
epoch reads at the storage's speed instead of one file's latency at a time.

Training is bit-for-bit the same: the sampler is iterated exactly once per epoch, at the moment
the DataLoader would have asked it for its first index, and the samplers covered draw random
numbers only then (RandomSampler's seed from the global generator or its own, a single
`randperm`; DistributedSampler from its own generator seeded by seed and epoch). Covered:
`RandomSampler`, `SequentialSampler`, `DistributedSampler` (each rank announces its own
indices) and `BatchSampler` over them, with or without worker processes, persistent or not.
Anything else (another sampler, an IterableDataset, a dataset with no file paths, files on no
loosefs mount) is left alone and said once in the log (logger `loosefs`).

The file of index i is `dataset.loosefs_path(i)` when the dataset defines it (the documented
hook for datasets of one's own), else `dataset.samples[i][0]` or `dataset.imgs[i][0]`
(torchvision's DatasetFolder and ImageFolder), else `dataset.files[i]`; a `Subset` maps its
indices to its dataset's. Relative paths are taken from the working directory.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

__all__ = ["install"]

log = logging.getLogger("loosefs")

# Each "left alone" reason is said once per process.
_said: set = set()


def _say_once(key: str, msg: str) -> None:
    if key not in _said:
        _said.add(key)
        log.warning("loosefs: %s", msg)


# --- which files, on which mount -------------------------------------------------------------

def _path_of(dataset: Any) -> "Optional[Callable[[int], str]]":
    """The file of sample i of `dataset`, or None when the dataset says no file paths."""
    hook = getattr(dataset, "loosefs_path", None)
    if callable(hook):
        return lambda i: os.fspath(hook(i))
    for attr in ("samples", "imgs"):
        items = getattr(dataset, attr, None)
        if isinstance(items, (list, tuple)) and items and isinstance(items[0], (list, tuple)):
            listed: Any = items
            return lambda i: os.fspath(listed[i][0])
    files = getattr(dataset, "files", None)
    if isinstance(files, (list, tuple)) and files and isinstance(files[0], (str, os.PathLike)):
        return lambda i: os.fspath(files[i])
    inner, indices = getattr(dataset, "dataset", None), getattr(dataset, "indices", None)
    if inner is not None and indices is not None:  # torch.utils.data.Subset
        of = _path_of(inner)
        if of is not None:
            return lambda i: of(int(indices[i]))
    return None


def _unescape(field: str) -> str:
    """A /proc/self/mountinfo field with its octal escapes (`\\040` for a space) undone."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _loosefs_mounts() -> List[str]:
    """Mount points of this process's loosefs mounts (type `fuse.loosefs`), longest first."""
    mounts = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                head, _, tail = line.partition(" - ")
                fields = head.split()
                if len(fields) >= 5 and tail.split()[:1] == ["fuse.loosefs"]:
                    mounts.append(_unescape(fields[4]))
    except OSError:
        return []
    return sorted(mounts, key=len, reverse=True)


class _Placer:
    """Maps a sample's path to (mount point, path inside it), one realpath per directory."""

    def __init__(self, mounts: List[str]):
        self.mounts = mounts
        self.dirs: Dict[str, "Optional[Tuple[str, str]]"] = {}

    def place(self, path: str) -> "Optional[Tuple[str, str]]":
        if not path.startswith("/") or "/." in path or "//" in path:
            path = os.path.abspath(path)  # relative, or not in normal form
        d, name = os.path.split(path)
        if d in self.dirs:
            where = self.dirs[d]
        else:
            where = self.dirs[d] = self._place_dir(d)
        return None if where is None else (where[0], os.path.join(where[1], name) if where[1] else name)

    def _place_dir(self, d: str) -> "Optional[Tuple[str, str]]":
        for cand in (d, os.path.realpath(d)):
            for m in self.mounts:
                if cand == m or cand.startswith(m.rstrip("/") + "/"):
                    return m, os.path.relpath(cand, m) if cand != m else ""
        return None


# --- the epoch's order ----------------------------------------------------------------------

def _covered(loader_iter: Any) -> "Optional[str]":
    """Why the iterator's sampler is left alone, or None when it is covered."""
    from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler
    from torch.utils.data.dataloader import _DatasetKind

    if loader_iter._dataset_kind != _DatasetKind.Map:
        return "an IterableDataset has no sampler order to announce"
    s = loader_iter._index_sampler
    if type(s).__iter__ is BatchSampler.__iter__:
        s = s.sampler
    if type(s).__name__ == "EpochSampler":
        return ""  # it announces its order itself
    known = (RandomSampler.__iter__, SequentialSampler.__iter__, DistributedSampler.__iter__)
    if type(s).__iter__ not in known:
        return (f"{type(s).__name__} is not a RandomSampler, SequentialSampler, DistributedSampler or "
                "BatchSampler over one: its order is not announced")
    return None


class _Taken:
    """The epoch's indices as the sampler gave them; an exception the sampler raised partway is
    raised again where the DataLoader would have met it."""

    def __init__(self, items: List[Any], error: "Optional[BaseException]"):
        self.items, self.error, self.k = items, error, 0

    def __iter__(self) -> "_Taken":
        return self

    def __next__(self) -> Any:
        if self.k < len(self.items):
            self.k += 1
            return self.items[self.k - 1]
        if self.error is not None:
            e, self.error = self.error, None
            raise e
        raise StopIteration


class _Placed:
    """Where the samples of one dataset lie: its path function and the directories placed so
    far (one `realpath` per directory, kept for the next epochs). Nothing is kept per sample:
    a dataset of a million files would hold hundreds of MB of it."""

    def __init__(self, dataset: Any, path_of: Callable[[int], str], mounts: List[str]):
        self.dataset, self.path_of, self.mounts = dataset, path_of, mounts
        self.placer = _Placer(mounts)

    def where(self, i: int) -> "Optional[Tuple[str, str]]":
        return self.placer.place(self.path_of(i))


# The datasets announced lately, by id (the dataset itself kept, so an id is never reused
# while its entry lives).
_placed: Dict[int, _Placed] = {}


def _placed_for(dataset: Any, mounts: List[str]) -> "Optional[_Placed]":
    p = _placed.get(id(dataset))
    if p is not None and p.dataset is dataset and p.mounts == mounts:
        return p
    path_of = _path_of(dataset)
    if path_of is None:
        return None
    while len(_placed) >= 4:
        del _placed[next(iter(_placed))]
    p = _placed[id(dataset)] = _Placed(dataset, path_of, mounts)
    return p


def _announce(loader_iter: Any, items: List[Any]) -> None:
    from . import LoosefsError, announce_order

    mounts = _loosefs_mounts()
    if not mounts:
        _say_once("nomount", "no loosefs mount in this process's namespace: the order is not announced")
        return
    dataset = loader_iter._dataset
    placed = _placed_for(dataset, mounts)
    if placed is None:
        _say_once(f"paths:{type(dataset).__name__}",
                  f"{type(dataset).__name__} has no loosefs_path(i), samples, imgs or files: "
                  "its order is not announced")
        return
    per_mount: Dict[str, List[str]] = {}
    for x in items:
        for i in (x if isinstance(x, (list, tuple)) else (x,)):
            where = placed.where(int(i))
            if where is not None:
                per_mount.setdefault(where[0], []).append(where[1])
    if not per_mount:
        _say_once("offmount", "no sample file of this dataset is on a loosefs mount: the order is not announced")
        return
    for mnt, rel in per_mount.items():
        try:
            n = announce_order(mnt, rel)
            key = f"announced:{mnt}"
            if key not in _said:
                _said.add(key)
                log.info("loosefs: announcing each epoch's order to %s (%d samples this epoch)", mnt, n)
        except (LoosefsError, OSError, ValueError) as e:
            _say_once(f"failed:{mnt}", f"epoch order not announced, reading without it: {e}")


def _take_epoch(loader_iter: Any, it: Iterator[Any]) -> Iterator[Any]:
    why = _covered(loader_iter)
    if why is not None:
        if why:
            _say_once(f"sampler:{why}", why)
        return it
    items: List[Any] = []
    error: Optional[BaseException] = None
    try:
        for x in it:
            items.append(x)
    except Exception as e:  # raised again at the index where the sampler raised it
        error = e
    try:
        _announce(loader_iter, items)
    except Exception as e:  # never let the hint break training
        _say_once(f"error:{type(e).__name__}", f"epoch order not announced ({type(e).__name__}: {e})")
    return _Taken(items, error)


def install() -> None:
    """Announces every DataLoader epoch's order from now on in this process (imports torch).
    Idempotent."""
    from torch.utils.data import dataloader as dl

    base = dl._BaseDataLoaderIter
    if getattr(base._next_index, "_loosefs", False):
        return
    original = base._next_index

    def _next_index(self: Any) -> Any:
        # A new sampler iterator means a new epoch (`_reset` made it); take its order whole.
        it = self._sampler_iter
        if it is not None and getattr(self, "_loosefs_taken", None) is not it:
            it = self._sampler_iter = _take_epoch(self, it)
            self._loosefs_taken = it
        return original(self)

    _next_index._loosefs = True  # type: ignore[attr-defined]
    base._next_index = _next_index  # type: ignore[method-assign]


install()
