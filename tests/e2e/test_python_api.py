"""The Python package (`python/loosefs`, imported from the source tree with `$LOOSEFS_BIN`):
`mount` as a context manager over real mounts (a temporary mountpoint made and removed, the
mount gone after the block, after an exception in it, and at interpreter exit), the CLI's
options and refusals (`MountError` with the CLI's reason), `pack` (with a tqdm bar), `info`,
`stats` as dataclasses, `python -m loosefs`, and `pip install` of the repository into a new
venv."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import DATA, ROOT, loosefs_bin, missing_prerequisite, need_mount

sys.path.insert(0, str(ROOT / "python"))
import loosefs  # noqa: E402


@pytest.fixture(autouse=True)
def _bin(monkeypatch):
    monkeypatch.setenv("LOOSEFS_BIN", loosefs_bin())


def mounted(path) -> bool:
    p = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == p for line in f)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_mount_is_a_context_manager_that_leaves_nothing_behind(pack, source):
    need_mount()
    with loosefs.mount(pack, warm=True) as m:
        assert isinstance(m, os.PathLike) and mounted(m.path)
        root = m.path
        files = sorted(p for p in pathlib.Path(source).rglob("*") if p.is_file())[:20]
        for f in files:
            rel = f.relative_to(source)
            assert (m.path / rel).read_bytes() == f.read_bytes(), rel
            assert open(os.path.join(m, rel), "rb").read() == f.read_bytes()
        s = m.stats()
        assert s.pid > 0 and s.bytes_served > 0 and s.requests["read"] > 0
        assert s.raw["warm"]["state"] in ("running", "done", "idle")
    assert not mounted(root) and not root.exists()


def test_an_exception_in_the_block_still_unmounts(pack, tmp_path):
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with pytest.raises(ZeroDivisionError):
        with loosefs.mount(pack, mnt):
            assert mounted(mnt)
            1 / 0
    assert not mounted(mnt) and mnt.is_dir(), "a mountpoint given is kept"


def test_refusals_raise_mount_error_with_the_clis_reason(pack, tmp_path):
    need_mount()
    import tempfile

    made = lambda: set(pathlib.Path(tempfile.gettempdir()).glob("loosefs-*"))  # noqa: E731
    before = made()
    bad = tmp_path / "bad.pack"
    bad.write_bytes(b"hello, not a pack")
    with pytest.raises(loosefs.MountError) as e:
        loosefs.mount(bad)
    assert "bad.pack" in e.value.reason and e.value.returncode == loosefs.EXIT_DAMAGED == 65
    assert made() == before, "the temporary mountpoint of a refused mount is removed"
    with pytest.raises(loosefs.MountError) as e:
        loosefs.mount(pack, tmp_path / "missing")
    assert "missing" in e.value.reason and "does not exist" in e.value.reason


def test_options_reach_the_cli(pack):
    need_mount()
    with loosefs.mount(pack, decode=["npy"], decoded_only=False) as m:
        npy = list(m.path.rglob("*.npy"))
        assert npy, "decode=['npy'] gave .npy views"


def test_the_python_options_are_the_clis_and_help_lists_every_one(monkeypatch):
    """python/loosefs/_options.py is what scripts/gen-python-options makes of the CLI's --help
    now; help(loosefs.mount) names every mount option; a mistyped keyword raises TypeError
    naming the nearest option before any process starts; booleans work for on/off options."""
    import inspect
    import runpy
    gen = runpy.run_path(str(ROOT / "scripts" / "gen-python-options"))
    assert gen["render"](loosefs_bin()) == (ROOT / "python" / "loosefs" / "_options.py").read_text(), \
        "python/loosefs/_options.py is stale: run scripts/gen-python-options"
    text = subprocess.run([loosefs_bin(), "mount", "--help"], capture_output=True, text=True, timeout=60).stdout
    flags = {o[0] for o in gen["parse"](text)} - {"foreground"}
    assert len(flags) > 30
    params = inspect.signature(loosefs.mount).parameters
    doc = loosefs.mount.__doc__
    for f in flags:
        assert f in params and params[f].kind == inspect.Parameter.KEYWORD_ONLY, f
        assert f"    {f}: " in doc, f
    monkeypatch.setenv("LOOSEFS_BIN", "/nonexistent/loosefs")
    with pytest.raises(TypeError, match="'warmm'.*did you mean 'warm'"):
        loosefs.mount("x.pack", warmm=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        loosefs.pack("src", "out.pack", bogus=1)
    with pytest.raises(TypeError, match="warm is a flag"):
        loosefs.mount("x.pack", warm="yes")
    assert loosefs._flags(loosefs._checked("mount", {"passthrough": True})) == ["--passthrough", "on"]
    assert loosefs._flags(loosefs._checked("mount", {"passthrough": False})) == ["--passthrough", "off"]


def test_pack_info_and_stats_return_dataclasses(source, tmp_path):
    out = tmp_path / "p.pack"
    r = loosefs.pack(source, out, align=4096)
    n = sum(1 for p in pathlib.Path(source).rglob("*") if p.is_file())
    assert r.files == n and r.pack_bytes == out.stat().st_size and r.out == out
    i = loosefs.info(out)
    assert (i.format, i.samples) == ("loosefs", n) and i.raw["alignment"] == 4096
    with pytest.raises(loosefs.LoosefsError) as e:
        loosefs.pack(source, out)
    assert "p.pack" in e.value.reason, "an existing OUT is refused without force=True"
    assert loosefs.pack(source, out, force=True).files == n


def test_pack_progress_reaches_a_tqdm_bar(source, tmp_path, capsys):
    """`progress=True` with tqdm installed: the CLI's `--progress-lines` feed a tqdm bar that
    ends at the sample bytes written; without tqdm the CLI's own output is used."""
    import tqdm  # noqa: F401  (installed by scripts/python-env.sh)
    r = loosefs.pack(source, tmp_path / "p.pack", progress=True)
    err = capsys.readouterr().err
    assert "loosefs pack" in err and "files=%d" % r.files in err, err[-500:]
    raw = subprocess.run([loosefs_bin(), "pack", str(source), str(tmp_path / "q.pack"), "--json", "--progress-lines"],
                         capture_output=True, text=True, timeout=300)
    lines = [json.loads(x)["progress"] for x in raw.stderr.splitlines()]
    # The directory's walk first (a count of its files), then the bytes written.
    walk = [x for x in lines if x["step"] == "walk"]
    assert walk[-1] == {"step": "walk", "unit": "files", "done": r.files, "total": None, "end": True}, walk[-2:]
    packed = [x for x in lines if x["step"] == "pack"]
    assert lines.index(walk[-1]) < lines.index(packed[0])
    assert packed[-1] == {"step": "pack", "unit": "bytes", "done": r.bytes, "total": r.bytes, "files": r.files,
                          "end": True}, packed[-3:]
    assert all(a["done"] <= b["done"] for a, b in zip(packed, packed[1:]))


def _progress_lines(stderr: str):
    """The `{"progress": …}` objects of a `--progress-lines` stderr, and its notes."""
    objs = [json.loads(x) for x in stderr.splitlines() if x.startswith("{")]
    return [o["progress"] for o in objs if "progress" in o], [o["note"] for o in objs if "note" in o]


def _foreign_copy(tmp_path) -> pathlib.Path:
    src = DATA / "formats" / "webdataset"
    if not src.is_dir():
        missing_prerequisite("../shared/data/formats is missing")
    import shutil
    return pathlib.Path(shutil.copytree(src, tmp_path / "wds"))


def test_index_progress_reaches_tqdm_bars_and_its_lines_count_every_sample(tmp_path, capsys):
    """`loosefs index --progress-lines`: the note, the scan's spinner, then the samples read,
    ending at all of them; `loosefs.index(progress=True)` draws them as tqdm bars."""
    import tqdm  # noqa: F401  (installed by scripts/python-env.sh)
    ds = _foreign_copy(tmp_path)
    raw = subprocess.run([loosefs_bin(), "index", str(ds), "--out", str(tmp_path / "a.idx"), "--verify", "full",
                          "--index-dir", str(tmp_path / "ix0"), "--progress-lines"],
                         capture_output=True, text=True, timeout=300)
    assert raw.returncode == 0, raw.stderr
    lines, notes = _progress_lines(raw.stderr)
    assert [x["step"] for x in lines if x.get("end")] == ["scan", "index"], lines
    assert lines[-1] == {"step": "index", "unit": "samples", "done": 48, "total": 48, "end": True}, lines[-2:]
    assert any("indexing" in n and str(ds) in n for n in notes), notes
    where = loosefs.index(ds, index_dir=tmp_path / "ix1", progress=True)
    assert pathlib.Path(where).is_file()
    err = capsys.readouterr().err
    assert "loosefs index" in err and "48/48" in err and "loosefs: indexing" in err, err[-800:]


def test_a_first_mount_from_python_shows_its_indexing_and_a_directory_walk(tmp_path, source, capsys):
    """`mount(progress=True)`: a foreign dataset's first mount draws the indexing's bar; a
    directory's mount, the walk's count of its files (the launcher's and the daemon's)."""
    need_mount()
    import tqdm  # noqa: F401
    ds = _foreign_copy(tmp_path)
    with loosefs.mount(ds, index_dir=tmp_path / "ix", progress=True) as m:
        assert len(list(m.path.rglob("*.jpg"))) == 48
    err = capsys.readouterr().err
    assert "loosefs index" in err and "48/48" in err, err[-800:]
    files = sum(1 for p in source.rglob("*") if p.is_file())
    with loosefs.mount(source, progress=True):
        pass
    err = capsys.readouterr().err
    assert "loosefs walk" in err and f"{files} files" in err, err[-800:]


def test_foreign_info(tmp_path):
    mds = DATA / "formats" / "mds"
    if not mds.is_dir():
        missing_prerequisite("../shared/data/formats is missing")
    i = loosefs.info(mds, index_dir=tmp_path / "ix")
    assert i.format == "mds" and i.samples == 48 and i.jpeg_samples == 48


def test_index_writes_a_shared_index_that_another_nodes_mount_uses(tmp_path):
    src = DATA / "formats" / "webdataset"
    if not src.is_dir():
        missing_prerequisite("../shared/data/formats is missing")
    need_mount()
    import shutil
    ds = tmp_path / "wds"
    shutil.copytree(src, ds)
    where = loosefs.index(ds, index_dir=tmp_path / "ix1")
    assert where == str(ds) + ".loosefs-index" and pathlib.Path(where).is_file()
    # Another node: an empty index directory; the shared index spares the scan.
    with loosefs.mount(ds, index_dir=tmp_path / "ix2") as m:
        assert len(list(m.path.rglob("*.jpg"))) == 48
    assert not any((tmp_path / "ix2").glob("*.lfx"))
    with pytest.raises(loosefs.LoosefsError) as e:
        loosefs.index(tmp_path / "nothing-here", index_dir=tmp_path / "ix1")
    assert "nothing-here" in str(e.value)


def test_a_mount_left_open_is_unmounted_at_interpreter_exit(pack, tmp_path):
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'python')!r}); import loosefs; " \
           f"m = loosefs.mount({str(pack)!r}, {str(mnt)!r}); print(len(list(m.path.iterdir())))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and int(r.stdout) > 0, r.stderr
    assert not mounted(mnt)


def test_log_dash_sends_the_daemon_log_to_the_scripts_stderr(pack, tmp_path):
    """`loosefs.mount(PACK, log="-")` returns (a captured stderr would stay open in the daemon
    and hang the call), `stats().log` says `-`, and the daemon's log lines reach the script's
    stderr."""
    need_mount()
    err = tmp_path / "stderr.txt"
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'python')!r}); import loosefs\n"
            f"with loosefs.mount({str(pack)!r}, log='-') as m:\n    print(m.stats().log)\n")
    with open(err, "w") as f:
        r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=f, text=True, timeout=120,
                           env={**os.environ, "RUST_LOG": "info"})
    text = err.read_text()
    assert r.returncode == 0 and r.stdout.strip() == "-", text
    assert "serving" in text and "log on stderr" in text, text


def test_python_dash_m_runs_the_cli():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    r = subprocess.run([sys.executable, "-m", "loosefs", "--version"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("loosefs "), r.stderr


def test_pip_install_of_the_repository_mounts_byte_identical_and_leaves_nothing(pack, source, tmp_path):
    """`pip install <this repository>` into a new venv (PEP 517: pip fetches maturin from PyPI
    and builds the wheel, stripped CLI inside, in this repository's target directory). Then,
    with no cargo, rustc or loosefs on PATH and no $LOOSEFS_BIN: `python -m loosefs --help`;
    `loosefs.mount(PACK)` serves every file of the sample byte-identical to the source; after
    the `with` block, and after a script that raises inside it, neither the mount nor its
    daemon remains. The order hook's `.pth` is installed and loads only when switched on."""
    need_mount()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(ROOT)], capture_output=True, text=True,
                       timeout=2400)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("LOOSEFS_BIN", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "loosefs", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "mount" in r.stdout, r.stderr
    exe = venv / "bin" / "loosefs"
    assert exe.stat().st_size < 40 << 20, "the wheel's binary is stripped"
    bench = [b for b in ("loosefs-reader", "loosefs-request-cost") if (venv / "bin" / b).exists()]
    assert not bench, f"the bench's programs are not the user's: {bench}"
    check = ("import loosefs, os, pathlib, sys\n"
             "assert loosefs.binary() == %r, loosefs.binary()\n"
             "src = pathlib.Path(%r)\n"
             "with loosefs.mount(%r) as m:\n"
             "    print(m.path, m.stats().pid, flush=True)\n"
             "    n = 0\n"
             "    for f in sorted(p for p in src.rglob('*') if p.is_file()):\n"
             "        assert (m.path / f.relative_to(src)).read_bytes() == f.read_bytes(), f\n"
             "        n += 1\n"
             "    served = sum(1 for p in m.path.rglob('*') if p.is_file())\n"
             "    assert served == n, (served, n)\n"
             "    if sys.argv[1] == 'raise':\n"
             "        raise RuntimeError('inside the with block')\n"
             "print(n)\n" % (str(exe), str(source), str(pack)))
    n_src = sum(1 for p in pathlib.Path(source).rglob("*") if p.is_file())
    for how in ("ok", "raise"):
        r = subprocess.run([py, "-c", check, how], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        lines = r.stdout.split()
        if how == "ok":
            assert r.returncode == 0 and int(lines[-1]) == n_src, r.stderr
        else:
            assert r.returncode == 1 and "inside the with block" in r.stderr, r.stderr
        path, pid = lines[0], int(lines[1])
        assert not mounted(path), f"{how}: {path} is still mounted"
        assert not alive(pid), f"{how}: the daemon {pid} is still running"
    # The wheel puts the order hook's .pth at the top of site-packages: read at start-up, it
    # loads the hook's start-up module only when LOOSEFS_ANNOUNCE_ORDER is on.
    pths = list(venv.glob("lib/python*/site-packages/loosefs_announce_order.pth"))
    assert len(pths) == 1, list(venv.glob("lib/python*/site-packages/*.pth"))
    probe = "import sys; print('loosefs._orderhook' in sys.modules, 'torch' in sys.modules)"
    for value, loaded in (("1", "True False"), ("0", "False False"), ("", "False False")):
        r = subprocess.run([py, "-c", probe], capture_output=True, text=True,
                           env={**env, "LOOSEFS_ANNOUNCE_ORDER": value}, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == loaded, (value, r.stdout, r.stderr)


WHEEL_CHECK = r"""
import hashlib, json, subprocess, sys, loosefs
b = loosefs.binary()
ldd = subprocess.run(["ldd", b], capture_output=True, text=True).stdout
version = subprocess.run([b, "--version"], capture_output=True, text=True).stdout.strip()
with loosefs.mount("/data/dir", decode=["frames"]) as m:
    files = sorted(p for p in (m.path / "frames").rglob("*.npy"))
    digests = {str(p.relative_to(m.path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files[::37]}
    digests["meta/info.json"] = hashlib.sha256((m.path / "meta" / "info.json").read_bytes()).hexdigest()
    n = len(files)
print(json.dumps({"binary": b, "ldd": ldd, "version": version, "frames": n, "digests": digests}))
"""


def test_the_release_wheel_installs_and_mounts_on_another_linux_without_a_toolchain(tmp_path):
    """scripts/wheel.sh's wheel ($LOOSEFS_WHEEL, else built here): a manylinux tag, FFmpeg and
    every library the binary needs beyond glibc, libgcc_s and libstdc++ inside. Installed with
    `pip --no-index` in a Debian trixie root (another glibc, no FFmpeg, no X11 or GLib, no Rust,
    no C compiler), its `loosefs` finds every library inside the wheel, and
    `loosefs.mount(DIR, decode=["frames"])` there serves a LeRobot dataset's frame views
    byte-identical to this machine's build."""
    need_mount()
    import hashlib
    import trixie
    lerobot = DATA / "lerobot" / "so100-av1"
    if not lerobot.is_dir():
        missing_prerequisite(f"{lerobot} is missing")
    if os.environ.get("LOOSEFS_WHEEL"):
        wheel = ROOT / os.environ["LOOSEFS_WHEEL"]  # scripts/test.sh built it (an absolute path stays)
    else:
        r = subprocess.run([str(ROOT / "scripts" / "wheel.sh"), str(tmp_path / "wheels")], capture_output=True,
                           text=True, timeout=2400)
        assert r.returncode == 0, r.stderr[-3000:]
        wheel = pathlib.Path(r.stdout.strip().splitlines()[-1])
    out = wheel.parent
    assert wheel.name.startswith("loosefs-") and "manylinux_2_" in wheel.name, wheel.name
    got = trixie.run(WHEEL_CHECK, {str(lerobot): "/data/dir", str(out): "/wheels"}, python="/tmp/w/bin/python",
                     prelude=f"python3 -m venv /tmp/w\n/tmp/w/bin/pip install --quiet --no-index /wheels/{wheel.name}")
    assert got["binary"].endswith("/site-packages/loosefs.scripts/loosefs"), got["binary"]
    assert got["version"].startswith("loosefs "), got["version"]
    assert "not found" not in got["ldd"], got["ldd"]
    for lib in ("libavcodec", "libavformat", "libswscale", "libdav1d"):
        line = next((l for l in got["ldd"].splitlines() if lib in l), "")
        assert "/site-packages/" in line and "/loosefs.libs/" in line, (lib, got["ldd"])
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = subprocess.run([loosefs_bin(), "mount", str(lerobot), str(mnt), "--decode", "frames"], capture_output=True,
                       text=True, timeout=300)
    assert m.returncode == 0, m.stderr
    try:
        assert got["frames"] == sum(1 for _ in (mnt / "frames").rglob("*.npy")) > 0
        mine = {rel: hashlib.sha256((mnt / rel).read_bytes()).hexdigest() for rel in got["digests"]}
        assert mine == got["digests"], json.dumps(got["digests"])[:1000]
    finally:
        subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, timeout=60)


def test_patch_open_removes_the_isatty_round_trip_of_every_python_open(pack):
    """Pillow, np.load, pathlib and open() through the mount: one IOCTL per open by default, none
    once patched; the same bytes, pixels and arrays either way; unpatched again, they are back."""
    need_mount()
    import numpy as np
    from PIL import Image

    def ioctls(m):
        return m.stats().requests["ioctl"]

    with loosefs.mount(pack, decode=["npy"]) as m:
        jpegs = sorted(p for p in pathlib.Path(m.path).rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))[:20]
        assert jpegs

        def read_all():
            return ([(open(p, "rb").read(), p.read_bytes()) for p in jpegs],
                    [np.asarray(Image.open(p).convert("RGB")) for p in jpegs],
                    [np.load(p.with_suffix(".npy")) for p in jpegs])
        n0 = ioctls(m)
        plain = read_all()
        assert ioctls(m) - n0 >= 4 * len(jpegs)
        loosefs.patch_open()
        try:
            n1 = ioctls(m)
            patched = read_all()
            assert ioctls(m) == n1, "a patched open() still asked isatty"
            with open(jpegs[0], "r", encoding="latin-1") as f:  # text: untouched
                assert f.read(3) == plain[0][0][0][:3].decode("latin-1")
        finally:
            loosefs.patch_open(False)
        assert patched[0] == plain[0]
        assert all(np.array_equal(a, b) for a, b in zip(patched[1] + patched[2], plain[1] + plain[2]))
        n2 = ioctls(m)
        open(jpegs[0], "rb").read()
        assert ioctls(m) == n2 + 1


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_inside_the_block_unmounts_then_ends_the_process_by_that_signal(pack, sig):
    """How Slurm, Kubernetes and a closed terminal stop a job: the mount, its daemon and its
    temporary mountpoint are gone, and the process still ends by the signal."""
    import signal
    need_mount()
    # The signal's default action, as a job started from a terminal has it (a run under
    # `nohup` ignores SIGHUP, and loosefs leaves an ignored signal alone).
    code = (f"import signal, sys, time; sys.path.insert(0, {str(ROOT / 'python')!r})\n"
            f"signal.signal(signal.{sig}, signal.SIG_DFL)\n"
            f"import loosefs\n"
            f"with loosefs.mount({str(pack)!r}) as m:\n"
            f"    print(m.path, m.stats().pid, flush=True)\n"
            f"    time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    path, pid = p.stdout.readline().split()
    assert mounted(path) and alive(int(pid))
    p.send_signal(getattr(signal, sig))
    assert p.wait(timeout=120) == -getattr(signal, sig)
    assert not mounted(path) and not os.path.exists(path)
    for _ in range(600):  # the daemon exits once unmounted
        if not alive(int(pid)):
            break
        import time
        time.sleep(0.05)
    assert not alive(int(pid))


def test_a_child_forked_inside_the_block_that_exits_leaves_the_parents_mount(pack):
    """A DataLoader worker is such a child: its normal exit (atexit run) must not unmount."""
    need_mount()
    code = (f"import os, sys; sys.path.insert(0, {str(ROOT / 'python')!r}); import loosefs\n"
            f"with loosefs.mount({str(pack)!r}) as m:\n"
            f"    child = os.fork()\n"
            f"    if child == 0:\n"
            f"        sys.exit(0)\n"
            f"    os.waitpid(child, 0)\n"
            f"    print(m.path, os.path.ismount(m.path), len(list(m.path.iterdir())), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path, still, n = r.stdout.split()
    assert still == "True" and int(n) > 0, "the child's exit unmounted the parent's mount"
    assert not mounted(path) and not os.path.exists(path)


def test_every_public_function_is_exported_by_star_import():
    # `from loosefs import *` gives every public function and class of the module (index and
    # patch_open were missing from __all__).
    import inspect
    import loosefs

    public = {n for n, v in vars(loosefs).items()
              if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
              and getattr(v, "__module__", "") == "loosefs"}
    assert public <= set(loosefs.__all__), public - set(loosefs.__all__)
    assert all(hasattr(loosefs, n) for n in loosefs.__all__)


def test_a_type_checker_flags_a_misspelled_option_and_a_wrong_type(tmp_path):
    """The keyword options are typed (PEP 692 TypedDicts generated with them): mypy accepts
    the right calls and names the misspelled keyword, the wrong type and the unknown choice."""
    code = tmp_path / "train.py"
    code.write_text("import loosefs\n"
                    "\n"
                    "loosefs.mount('train.pack', warm=True, threads=4, pin='8G', decode=['npy'], passthrough=True)\n"
                    "loosefs.mount('train.pack', wram=True)\n"
                    "loosefs.mount('train.pack', threads='many')\n"
                    "loosefs.mount('train.pack', decode='jpeg')\n"
                    "loosefs.info('shards/', verify='full', chunk_cache='2G')\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, str(code)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "MYPYPATH": str(ROOT / "python")},
                       cwd=tmp_path)
    if "No module named mypy" in r.stderr:
        missing_prerequisite("mypy is not installed (scripts/python.lock has it)")
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert [e.split(":")[1] for e in errors] == ["4", "5", "6"], r.stdout
    assert '"wram"' in errors[0] and '"threads"' in errors[1] and "'jpeg'" in errors[2], r.stdout
    # The package itself type-checks.
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, "-p", "loosefs"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT / "python")
    assert r.returncode == 0, r.stdout


def test_bad_values_raise_value_error_naming_the_keyword_before_any_process(monkeypatch, tmp_path):
    import time
    marker = tmp_path / "ran"
    trap = tmp_path / "loosefs"
    trap.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    trap.chmod(0o755)
    monkeypatch.setenv("LOOSEFS_BIN", str(trap))
    for kw, said in [({"pin": "8X"}, "pin='8X'"), ({"threads": "many"}, "threads='many'"),
                     ({"decode": "jpeg"}, "decode='jpeg'"), ({"cache_size": -1}, "cache_size=-1"),
                     ({"transport": "fast"}, "transport='fast'")]:
        t0 = time.monotonic()
        with pytest.raises(ValueError) as e:
            loosefs.mount("train.pack", tmp_path, **kw)
        assert time.monotonic() - t0 < 1 and said in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="chunk_cache='lots'"):
        loosefs.info("x", chunk_cache="lots")
    assert not marker.exists(), "a process was started for a bad value"


def test_errors_are_file_not_found_and_permission_errors_where_they_mean_that(pack, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        loosefs.info(tmp_path / "missing.pack")
    assert isinstance(e.value, loosefs.LoosefsError) and "missing.pack" in e.value.reason
    need_mount()
    with pytest.raises(FileNotFoundError) as e:
        loosefs.mount(tmp_path / "missing.pack")
    assert isinstance(e.value, loosefs.MountError)
    # As another user, a root-only source: PermissionError (and still a LoosefsError).
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    script = ("import loosefs, sys\n"
              "try:\n"
              f"    loosefs.info({str(secret / 'data.pack')!r})\n"
              "except PermissionError as e:\n"
              "    assert isinstance(e, loosefs.LoosefsError); print('PermissionError')\n")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "python"), "LOOSEFS_BIN": loosefs_bin()})
    assert r.stdout.strip() == "PermissionError", (r.stdout, r.stderr)


def test_mount_with_wait_draws_a_tqdm_bar_for_the_warm_and_the_pin(pack, capsys):
    need_mount()
    import tqdm  # noqa: F401  (installed by scripts/python-env.sh)
    with loosefs.mount(pack, warm=True, pin="1M", wait=True, progress=True) as m:
        st = json.loads((m.path / ".loosefs" / "stats").read_text())
        assert st["warm"]["state"] == "done" and st["pin"]["pinned_bytes"] >= st["pin"]["target_bytes"]
    err = capsys.readouterr().err
    assert "loosefs warm" in err and "loosefs pin" in err and "100%" in err, err[-800:]
