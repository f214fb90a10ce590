"""loosefs from Python: mount a packed dataset (a loosefs pack, WebDataset, MDS, LitData,
TFRecord, Parquet, FFCV, GulpIO, zip; local, or `s3://`, `gs://`, `az://`, `https://`) as
ordinary files, pack a directory, read `info` and `stats`. Every call runs the `loosefs` command line (the binary this
package carries, or `$LOOSEFS_BIN`), so behaviour, options and messages are the CLI's.

    import loosefs, torchvision
    with loosefs.mount("train.pack", warm=True) as m:
        ds = torchvision.datasets.ImageFolder(m.path)
        ...
"""
from __future__ import annotations

import atexit
import dataclasses
import difflib
import inspect
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import re
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Union

__all__ = ["LoosefsError", "MountError", "NotFoundError", "AccessError", "Mount", "Info", "PackResult", "Stats",
           "announce_order", "binary", "index", "mount", "pack", "patch_open", "info", "stats", "unmount"]

PathLike = Union[str, "os.PathLike[str]"]

from ._options import KINDS, OPTIONS  # noqa: E402  (generated from the CLI's --help)

if TYPE_CHECKING:
    # The keyword options, typed for mypy and pyright (PEP 692): a misspelled option or a value
    # of the wrong type is flagged where the call is written.
    from typing_extensions import Unpack

    from ._options import IndexOptions, InfoOptions, MountOptions, PackOptions

# A byte size as the CLI reads it: 4096, 512K, 2G, 2GB, 8GiB (`--pin` also takes `all`).
_SIZE = re.compile(r"\s*\d+(\.\d+)?\s*([kmgtp](i?b)?|b)?\s*", re.I)


def _check_value(command: str, key: str, value: Any, kind: str, choices: Optional[tuple]) -> None:
    """Raises ValueError naming `key` when `value` is not what the option takes."""
    where = f"{command}(): {key}={value!r}"
    if kind == "int":
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
            raise ValueError(f"{where}: give a whole number")
    elif kind == "size":
        ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
            isinstance(value, str) and (_SIZE.fullmatch(value) or (key == "pin" and value == "all")))
        if not ok:
            raise ValueError(f"{where}: give a size in bytes or with a unit: 512M, 2G, 8GiB"
                             + (", or 'all'" if key == "pin" else ""))
    elif kind == "choice" and choices and not isinstance(value, bool):
        values = value if isinstance(value, (list, tuple)) else str(value).split(",")
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise ValueError(f"{where}: give one of {', '.join(repr(c) for c in choices)}")


def _checked(command: str, options: Mapping[str, object]) -> Dict[str, Any]:
    """`options` as `loosefs COMMAND` takes them: True/False for on/off options become
    "on"/"off". Raises, before any process starts, TypeError for a keyword the command does not
    take (naming the nearest one) or a value other than True/False for a flag, and ValueError
    (naming the keyword) for a value the option does not take: not a whole number, not a size,
    not one of its choices."""
    known = {o[0]: o for o in OPTIONS[command]}
    out: Dict[str, Any] = {}
    for key, value in options.items():
        o = known.get(key)
        if o is None:
            near = difflib.get_close_matches(key, known, 1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"{command}() got an unexpected keyword argument {key!r}{hint}; "
                            f"help(loosefs.{command}) lists its options")
        _, value_name, _, choices, _ = o
        if isinstance(value, bool) and choices and {"on", "off"} <= set(choices):
            value = "on" if value else "off"
        elif value_name is None and value not in (True, False, None):
            raise TypeError(f"{command}(): {key} is a flag: give True or False, not {value!r}")
        elif value is not None and value_name is not None:
            _check_value(command, key, value, KINDS[command][key], choices)
        out[key] = value
    return out


def _document(fn: Any, command: str, leading: List[inspect.Parameter]) -> Any:
    """Gives `fn` (which takes `**options`) the signature and docstring of every option of
    `loosefs COMMAND`, keyword-only, default None (the CLI's own default applies)."""
    params = list(leading)
    lines = ["", f"Keyword options (those of `loosefs {command}`; None leaves the CLI's default):", ""]
    for name, value_name, default, choices, text in OPTIONS[command]:
        if value_name is None:
            ann = "bool"
        elif choices and {"on", "off"} <= set(choices):
            ann = "bool | str"
        elif choices:
            ann = "str | list[str]" if name == "decode" else "str"
        else:
            ann = "str | int | os.PathLike"
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann))
        extra = []
        if choices:
            extra.append("one of " + ", ".join(choices))
        if default:
            extra.append(f"default {default}")
        lines.append(f"    {name}: {text}" + (f" ({'; '.join(extra)})" if extra else "") + ".")
    fn.__signature__ = inspect.Signature(params, return_annotation=inspect.signature(fn).return_annotation)
    fn.__doc__ = (fn.__doc__ or "") + "\n" + "\n".join(lines)
    return fn


class LoosefsError(RuntimeError):
    """A `loosefs` command failed. `reason` is its message (stderr), `returncode` its exit
    status, by kind: 1 failed, 2 bad usage, 65 damaged source, 66 not found, 69 a server out of
    reach, 75 the source changed while read, 77 permission denied (the `EXIT_*` constants)."""

    def __init__(self, reason: str, returncode: int = 1, command: Optional[List[str]] = None):
        super().__init__(reason)
        self.reason, self.returncode, self.command = reason, returncode, command or []


class MountError(LoosefsError):
    """`loosefs mount` refused the source or the mountpoint, or the daemon did not start."""


class NotFoundError(LoosefsError, FileNotFoundError):
    """What a command was given does not exist: a source path, a bucket, an object, a
    mountpoint. Also a FileNotFoundError."""


class AccessError(LoosefsError, PermissionError):
    """A command was refused access: a file's permissions, a store's credentials or policy.
    Also a PermissionError."""


class _MountNotFound(MountError, NotFoundError):
    pass


class _MountAccess(MountError, AccessError):
    pass


# `loosefs`'s exit codes by kind of failure (docs/CONFIGURATION.md, "Exit codes"; sysexits.h).
EXIT_USAGE, EXIT_DAMAGED, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_CHANGED, EXIT_DENIED = 2, 65, 66, 69, 75, 77


def _error_class(error: type, returncode: int) -> type:
    """`error`, or its subclass that is also a FileNotFoundError or PermissionError when the
    CLI's exit code says that is what happened (never its words)."""
    if returncode == EXIT_NOT_FOUND:
        return _MountNotFound if issubclass(error, MountError) else NotFoundError
    if returncode == EXIT_DENIED:
        return _MountAccess if issubclass(error, MountError) else AccessError
    return error


def binary() -> str:
    """The `loosefs` executable: `$LOOSEFS_BIN`, else the release wheel's binary (in
    `loosefs.scripts/` beside this package, its libraries in `loosefs.libs/`), else the one
    installed beside this Python (a wheel built from source), else the first on `PATH`.
    Raises LoosefsError when there is none."""
    env = os.environ.get("LOOSEFS_BIN")
    if env:
        return env
    # The release wheel's `bin/loosefs` is a Python shim that execs this one; calling it
    # directly saves a Python start per command.
    bundled = pathlib.Path(__file__).resolve().parent.parent / "loosefs.scripts" / "loosefs"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    here = pathlib.Path(sys.executable).parent / "loosefs"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("loosefs")
    if found:
        return found
    raise LoosefsError("no loosefs executable: install the loosefs wheel, put loosefs on PATH or set LOOSEFS_BIN")


def _flags(options: Dict[str, Any]) -> List[str]:
    """CLI flags of keyword options: `warm=True` → `--warm`, `warm=False` → `--warm=false`
    (off even where a `LOOSEFS_WARM` variable would turn it on), `pin="8G"` → `--pin 8G`,
    `decode=["npy", "ppm"]` → `--decode npy,ppm`; None is left out."""
    out: List[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if value is False:
            out.append(flag + "=false")
        elif value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return out


def _run(args: List[str], error=LoosefsError, stream_stderr: bool = False) -> str:
    cmd = [binary(), *args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if stream_stderr else subprocess.PIPE, text=True)
    if r.returncode != 0:
        reason = (r.stderr or "").strip() or f"{' '.join(cmd)} exited {r.returncode}"
        raise _error_class(error, r.returncode)(reason, r.returncode, cmd)
    return r.stdout


@dataclasses.dataclass(frozen=True)
class Info:
    """What `loosefs info --json` says of a source: `format` is `"loosefs"` for a pack, else
    the detected format (`mds`, `tar`, ...). `jpeg_samples` is 0 for a zip or FFCV file at a
    URL indexed from its tables alone (`raw["verify"] == "table"`: no JPEG header read).
    `raw` holds every field of the JSON."""

    source: str
    format: str
    samples: int
    sample_bytes: int
    jpeg_samples: int
    raw: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PackResult:
    """What `loosefs pack --json` wrote: files, directories and bytes of the tree, the pack's
    size (bytes), the paths skipped (symlinks, special files) and the seconds it took."""

    out: pathlib.Path
    files: int
    dirs: int
    bytes: int
    jpegs: int
    pack_bytes: int
    skipped: List[Any]
    seconds: float


@dataclasses.dataclass(frozen=True)
class Stats:
    """A mount's `stats --json`: the daemon's pid, RSS (bytes) and log file, bytes served,
    errors answered, request counts by kind. `raw` holds every section (page cache,
    read-ahead, pin, warm, decode, remote, latency percentiles and buckets in µs)."""

    pid: int
    rss_bytes: int
    rss_peak_bytes: int
    bytes_served: int
    errors: int
    requests: Dict[str, int]
    log: str
    raw: Dict[str, Any]


def info(source: PathLike, **options: Unpack[InfoOptions]) -> Info:
    """`loosefs info SOURCE --json` with the CLI's options (`format="mds"`, `index_dir=...`,
    remote options). Raises LoosefsError with the CLI's reason."""
    d = json.loads(_run(["info", os.fspath(source), "--json", *_flags(_checked("info", options))]))
    return Info(
        source=d.get("source", d.get("pack", os.fspath(source))),
        format=d.get("format", "loosefs"),
        samples=int(d.get("samples", 0)),
        sample_bytes=int(d.get("sample_bytes", 0)),
        jpeg_samples=int(d.get("jpeg_samples", d.get("jpeg_files", 0))),
        raw=d,
    )


def pack(source: PathLike, out: PathLike, progress: Optional[bool] = None, **options: Unpack[PackOptions]) -> PackResult:
    """`loosefs pack SOURCE OUT --json`: a directory or a dataset in another format into one
    pack (`force=True` replaces OUT, `align=512`, `jobs=N`). Progress (sample bytes written)
    is a tqdm bar when tqdm is installed, else the CLI's own bar on a terminal; `progress=None`
    (the default) shows it when stderr is a terminal, `True` always, `False` never. Raises
    LoosefsError with the CLI's reason; OUT is never left half-written."""
    args = ["pack", os.fspath(source), os.fspath(out), "--json", *_flags(_checked("pack", options))]
    d = json.loads(_run_showing_progress(args, progress))
    return PackResult(out=pathlib.Path(out), files=d["files"], dirs=d["dirs"], bytes=d["bytes"], jpegs=d["jpegs"],
                      pack_bytes=d["pack_bytes"], skipped=d.get("skipped", []), seconds=d["seconds"])


def _run_showing_progress(args: List[str], progress: Optional[bool], error: Optional[type] = None) -> str:
    """Runs the CLI, showing its progress (see `_progress_wanted`) as tqdm bars fed by its
    `--progress-lines` when tqdm is installed, else as the CLI's own bars on this stderr.
    Returns stdout; raises `error` (LoosefsError) with the CLI's reason."""
    error = error or LoosefsError
    if not _progress_wanted(progress):
        return _run(args, error=error)
    tqdm = _tqdm()
    if tqdm is None:
        return _run(args, error=error, stream_stderr=True)
    return _run_with_progress_lines([*args, "--progress-lines"], tqdm, error)


def _run_with_progress_lines(args: List[str], tqdm: Any, error: type) -> str:
    """Runs the CLI with `--progress-lines`, drawing a tqdm bar per step it reports (`pack`,
    `walk`, `index`, `download`, `pin`, `warm`, ...: bytes, or a count) and writing its notes
    above them; other stderr lines are kept for the error. Returns stdout."""
    cmd = [binary(), *args]
    with tempfile.TemporaryFile("w+") as out, \
            subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True) as p:
        bars: Dict[str, Any] = {}
        other: List[str] = []
        try:
            assert p.stderr is not None
            for line in p.stderr:
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = None
                if not isinstance(msg, dict):
                    other.append(line)
                elif "note" in msg:
                    tqdm.write(f"loosefs: {msg['note']}", file=sys.stderr)
                elif isinstance(msg.get("progress"), dict):
                    _show_step(bars, msg["progress"], tqdm)
                else:
                    other.append(line)
        finally:
            for bar in bars.values():
                bar.close()
        code = p.wait()
        out.seek(0)
        text = out.read()
    if code != 0:
        reason = "".join(other).strip() or f"{' '.join(cmd)} exited {code}"
        raise _error_class(error, code)(reason, code, cmd)
    return text


def _show_step(bars: Dict[str, Any], prog: Dict[str, Any], tqdm: Any) -> None:
    """One `--progress-lines` line: its step's tqdm bar made (bytes scaled, else a count),
    moved, and closed at the step's end."""
    step, unit, total = str(prog.get("step", "")), prog.get("unit"), prog.get("total")
    bar = bars.get(step)
    if bar is None:
        # Bytes scaled (MB, GB); a count in its unit; a step that counts nothing, its time.
        kind: Dict[str, Any] = {"unit": "B", "unit_scale": True} if unit == "bytes" else \
            {"unit": f" {unit}"} if unit else {"bar_format": "{desc}: {elapsed}"}
        bar = bars[step] = tqdm(total=total, desc=f"loosefs {step}", **kind)
    if total != bar.total:
        bar.total = total
    bar.n = prog.get("done", 0)
    if "files" in prog:
        bar.set_postfix(files=prog["files"], refresh=False)
    bar.refresh()
    if prog.get("end"):
        bar.close()
        del bars[step]


def index(source: PathLike, out: Optional[PathLike] = None, progress: Optional[bool] = None,
          **options: Unpack[IndexOptions]) -> str:
    """Indexes SOURCE (a dataset in another format, or a prefix of loose objects: a path or an
    `s3://`, `gs://`, `az://` or `https://` URL) once for every node, as `loosefs index` does,
    and returns where the shared index went: `OUT`, else `<SOURCE>.loosefs-index` beside the
    dataset (an object inside a bucket's or container's prefix). Mounts
    of SOURCE on any machine then use it (`mount(SOURCE, index=...)` names another place).
    Options are the CLI's (`label=`, `verify="full"`, `endpoint_url=`, ...). Progress (the
    scan, the samples read, a remote dataset's download) shows as tqdm bars as `pack`'s does.
    Raises LoosefsError carrying the CLI's reason."""
    args = ["index", os.fspath(source)]
    if out is not None:
        args += ["--out", os.fspath(out)]
    args += _flags(_checked("index", options))
    line = _run_showing_progress(args, progress).strip().splitlines()[-1]
    return line.split(": shared index of ", 1)[0]


_PLAIN_OPEN: Optional[Any] = None


def patch_open(enable: bool = True, buffering: int = 128 << 10) -> None:
    """Makes every binary read-only `open()` of this process (and of the DataLoader workers it
    forks afterwards) pass an explicit `buffering` when the caller gave none, as
    `open(p, "rb", buffering=131072)` would. CPython before 3.14 otherwise asks whether each
    file it opens is a terminal (`isatty`: an `ioctl(TCGETS)`), which on a FUSE mount is a round
    trip to the daemon per `open()` that no kernel setting removes: the whole warm gap of
    Python readers (Pillow's `Image.open`, `np.load`, `open().read()` and torchvision's loader
    all open this way). A binary read's bytes and behaviour are the same either way (line
    buffering, all `isatty` decides, applies to text only). `builtins.open` and `io.open` are
    replaced; `enable=False` puts the originals back. Workers started by `spawn` (not `fork`)
    must call it themselves (e.g. in `worker_init_fn`)."""
    import builtins
    import functools
    import io

    global _PLAIN_OPEN
    if not enable:
        if _PLAIN_OPEN is not None:
            builtins.open = io.open = _PLAIN_OPEN
            _PLAIN_OPEN = None
        return
    if _PLAIN_OPEN is not None:
        return
    plain, size = builtins.open, buffering

    @functools.wraps(plain)
    def open_(file: Any, mode: str = "r", buffering: int = -1, *args: Any, **kwargs: Any) -> Any:
        if buffering == -1 and "b" in mode and not any(c in mode for c in "wax+"):
            buffering = size
        return plain(file, mode, buffering, *args, **kwargs)

    _PLAIN_OPEN = plain
    builtins.open = io.open = open_


def stats(mountpoint: PathLike) -> Stats:
    """`loosefs stats MOUNTPOINT --json` of a live mount."""
    d = json.loads(_run(["stats", os.fspath(mountpoint), "--json"]))
    daemon = d.get("daemon", {})
    return Stats(pid=daemon.get("pid", 0), rss_bytes=daemon.get("rss_bytes", 0),
                 rss_peak_bytes=daemon.get("rss_peak_bytes", 0), bytes_served=d.get("bytes_served", 0),
                 errors=d.get("errors", 0), requests=d.get("requests", {}), log=daemon.get("log", ""), raw=d)


def announce_order(mountpoint: PathLike, paths: "Iterable[PathLike]") -> int:
    """Tells the loosefs mount at `mountpoint` the order in which the coming epoch's files will
    be read: `paths` (relative to the mount root, or absolute under it; decoded views too), in
    read order. The mount then reads ahead along that order: a shuffled epoch is read at the
    storage's speed, and each rank of a distributed job fetches only its own samples. The
    announcement replaces this process's previous one; a wrong one costs no more than none.
    Returns the number of paths announced; `stats(mountpoint)` shows the order's progress.

    Raises ValueError for a path holding a newline, LoosefsError when `mountpoint` is not a
    loosefs mount that takes orders."""
    root = os.path.realpath(os.fspath(mountpoint))
    prefix = os.fsencode(root) + b"/"
    lines = []
    for p in paths:
        b = os.fsencode(p)
        if b"\n" in b:
            raise ValueError(f"a path holds a newline: {p!r}")
        if b.startswith(b"/") and not b.startswith(prefix):
            b = os.fsencode(os.path.realpath(b))  # reached through a symlink
        if b.startswith(prefix):
            b = b[len(prefix):]
        lines.append(b)
    data = b"".join(line + b"\n" for line in lines)
    target = os.path.join(root, ".loosefs", "order")
    try:
        # One write(2): the kernel hands it to the daemon in pieces, in order, before it returns.
        fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except OSError as e:
        raise LoosefsError(f"{root}: cannot announce an order ({e.strerror}): not a loosefs mount, or one "
                           f"that takes no orders") from e
    return len(lines)


def unmount(mountpoint: PathLike, lazy: bool = False) -> None:
    """`loosefs umount MOUNTPOINT` (waits for the daemon to finish; `lazy=True` detaches a
    busy mount)."""
    _run(["umount", os.fspath(mountpoint), *(["--lazy"] if lazy else [])])


_LIVE: Dict[str, "Mount"] = {}
_LOCK = threading.Lock()


class Mount(os.PathLike):
    """A live mount: `path` is its root (a `pathlib.Path`); the object is `os.PathLike`, so it
    can be given wherever a path is. Unmounted by `unmount()`, at the end of a `with` block
    (also after an exception), and at interpreter exit; a mountpoint made for it is removed."""

    def __init__(self, source: PathLike, path: pathlib.Path, made_dir: bool):
        self.source, self.path, self._made_dir = os.fspath(source), path, made_dir
        self.mounted = True
        # The process that mounted it: a child forked inside the block (a DataLoader worker)
        # that exits must not unmount its parent's mount.
        self._pid = os.getpid()

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"<loosefs.Mount {self.source!r} at {str(self.path)!r}{'' if self.mounted else ' (unmounted)'}>"

    def stats(self) -> Stats:
        """The mount's `stats` (see `loosefs.stats`)."""
        return stats(self.path)

    def unmount(self, lazy: bool = False) -> None:
        """Unmounts (once; later calls do nothing) and removes a mountpoint made for it. In a
        process forked from the one that mounted it, does nothing: the mount is the parent's."""
        if os.getpid() != self._pid:
            return
        with _LOCK:
            if not self.mounted:
                return
            _LIVE.pop(str(self.path), None)
            unmount(self.path, lazy=lazy)
            self.mounted = False
        if self._made_dir:
            try:
                self.path.rmdir()
            except OSError:
                pass

    def __enter__(self) -> "Mount":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.unmount()
        except LoosefsError:
            # Busy (a file still open, a process inside): detach it rather than leave it.
            self.unmount(lazy=True)


def _progress_wanted(progress: Optional[bool]) -> bool:
    """`progress`, or when None: stderr is a terminal, or this runs in a Jupyter kernel."""
    if progress is not None:
        return progress
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm  # type: ignore
        return tqdm
    except ImportError:
        return None


def mount(source: PathLike, mountpoint: Optional[PathLike] = None, progress: Optional[bool] = None,
          **options: Unpack[MountOptions]) -> Mount:
    """Mounts SOURCE (a pack, a dataset in another format, a plain directory served in place,
    an `s3://`, `gs://`, `az://` or `https://` URL of any of these) at MOUNTPOINT, or at a new temporary directory, and returns
    once it answers. Options are the
    CLI's: `warm=True`, `pin="8G"`, `decode="npy"`, `index_dir=...`, `endpoint_url=...`, ...
    Use it as a context manager; it is unmounted at interpreter exit in any case. Raises
    MountError carrying the CLI's reason. `log="-"` sends the daemon's log to this process's
    stderr (the CLI's own messages then go there too, and the error carries only the exit
    status). With `wait=True` and `warm` or `pin`, the call returns once they are done.
    Progress (a first mount's indexing or directory walk, `wait`'s pin and warm) shows as a
    tqdm bar per step (when tqdm is installed, else the CLI's own bars) if `progress` is True,
    or when None (the default) if stderr is a terminal or this runs in a Jupyter notebook."""
    flags = _checked("mount", options)
    made = mountpoint is None
    path = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-") if mountpoint is None else mountpoint)
    # A captured stderr would stay open in the daemon with `--log -`: the call would wait for it.
    to_stderr = str(flags.get("log")) == "-"
    _unmount_on_signals()
    try:
        # In the background whatever LOOSEFS_FOREGROUND says: the call returns once mounted.
        args = ["mount", os.fspath(source), str(path), "--foreground=false", *_flags(flags)]
        if to_stderr or _tqdm() is None:
            # Without tqdm the CLI's messages are kept for the error, not shown as bars.
            _run(args, error=MountError, stream_stderr=to_stderr)
        else:
            _run_showing_progress(args, progress, MountError)
    except BaseException:
        # Interrupted (Ctrl-C) while the mount was being made or warmed: it may be up already.
        if os.path.ismount(path):
            try:
                unmount(path, lazy=True)
            except LoosefsError:
                pass
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise
    m = Mount(source, path, made)
    with _LOCK:
        _LIVE[str(path)] = m
    return m


_SIGNALS_SET = False


def _unmount_on_signals() -> None:
    """SIGTERM and SIGHUP (how Slurm, Kubernetes and a closed terminal stop a job) end the
    process without running `with` blocks or atexit: where they still have their default
    action, loosefs handles them once, unmounting this process's mounts first, then dies of the
    same signal (the exit status its parent expects). A handler the program set is left alone.
    Only from the main thread (Python sets handlers there alone)."""
    global _SIGNALS_SET
    if _SIGNALS_SET or threading.current_thread() is not threading.main_thread():
        return
    _SIGNALS_SET = True
    import signal

    def handler(signum, _frame):
        _unmount_all()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, handler)


@atexit.register
def _unmount_all() -> None:
    for m in [m for m in _LIVE.values() if m._pid == os.getpid()]:
        try:
            m.unmount(lazy=True)
        except LoosefsError:
            pass


_P = inspect.Parameter
_document(mount, "mount", [_P("source", _P.POSITIONAL_OR_KEYWORD, annotation="PathLike"),
                            _P("mountpoint", _P.POSITIONAL_OR_KEYWORD, default=None, annotation="Optional[PathLike]")])
_document(pack, "pack", [_P("source", _P.POSITIONAL_OR_KEYWORD, annotation="PathLike"),
                         _P("out", _P.POSITIONAL_OR_KEYWORD, annotation="PathLike"),
                         _P("progress", _P.POSITIONAL_OR_KEYWORD, default=None, annotation="Optional[bool]")])
_document(info, "info", [_P("source", _P.POSITIONAL_OR_KEYWORD, annotation="PathLike")])
_document(index, "index", [_P("source", _P.POSITIONAL_OR_KEYWORD, annotation="PathLike"),
                           _P("out", _P.POSITIONAL_OR_KEYWORD, default=None, annotation="Optional[PathLike]")])
