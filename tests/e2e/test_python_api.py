"""The Python package (`python/loosefs`, imported from the source tree with `$LOOSEFS_BIN`):
`mount` as a context manager over real mounts (a temporary mountpoint made and removed, the
mount gone after the block, after an exception in it, and at interpreter exit), the CLI's
options and refusals (`MountError` with the CLI's reason), `pack`, `info`, `stats` as
dataclasses, and `python -m loosefs`."""
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import ROOT, loosefs_bin, need_mount

sys.path.insert(0, str(ROOT / "python"))
import loosefs  # noqa: E402


@pytest.fixture(autouse=True)
def _bin(monkeypatch):
    monkeypatch.setenv("LOOSEFS_BIN", loosefs_bin())


def mounted(path) -> bool:
    p = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == p for line in f)


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
    assert "bad.pack" in e.value.reason and e.value.returncode == 2
    assert made() == before, "the temporary mountpoint of a refused mount is removed"
    with pytest.raises(loosefs.MountError) as e:
        loosefs.mount(pack, tmp_path / "missing")
    assert "missing" in e.value.reason and "does not exist" in e.value.reason


def test_options_reach_the_cli(pack):
    need_mount()
    with loosefs.mount(pack, decode=["npy"], decoded_only=False) as m:
        npy = list(m.path.rglob("*.npy"))
        assert npy, "decode=['npy'] gave .npy views"


def test_pack_info_and_stats_return_dataclasses(source, tmp_path):
    out = tmp_path / "p.pack"
    r = loosefs.pack(source, out, align=512)
    n = sum(1 for p in pathlib.Path(source).rglob("*") if p.is_file())
    assert r.files == n and r.pack_bytes == out.stat().st_size and r.out == out
    i = loosefs.info(out)
    assert (i.format, i.samples) == ("loosefs", n) and i.raw["alignment"] == 512
    with pytest.raises(loosefs.LoosefsError) as e:
        loosefs.pack(source, out)
    assert "p.pack" in e.value.reason, "an existing OUT is refused without force=True"
    assert loosefs.pack(source, out, force=True).files == n


def test_foreign_info(tmp_path):
    mds = ROOT.parent / "shared" / "data" / "formats" / "mds"
    if not mds.is_dir():
        pytest.skip("SKIPPED: ../shared/data/formats is missing")
    i = loosefs.info(mds, index_dir=tmp_path / "ix")
    assert i.format == "mds" and i.samples == 48 and i.jpeg_samples == 48


def test_a_mount_left_open_is_unmounted_at_interpreter_exit(pack, tmp_path):
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'python')!r}); import loosefs; " \
           f"m = loosefs.mount({str(pack)!r}, {str(mnt)!r}); print(len(list(m.path.iterdir())))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and int(r.stdout) > 0, r.stderr
    assert not mounted(mnt)


def test_python_dash_m_runs_the_cli():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    r = subprocess.run([sys.executable, "-m", "loosefs", "--version"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("loosefs "), r.stderr


def test_the_wheel_installs_and_mounts_without_a_toolchain(pack, tmp_path):
    """`maturin build --release` (the venv's maturin, this repository's target directory) makes
    a wheel carrying the stripped CLI; installed into a new venv, with no cargo, rustc or
    loosefs on PATH and no $LOOSEFS_BIN, `python -m loosefs` and `loosefs.mount` work."""
    need_mount()
    maturin = pathlib.Path(sys.executable).parent / "maturin"
    wheels = tmp_path / "wheels"
    r = subprocess.run([str(maturin), "build", "--release", "-o", str(wheels)], cwd=ROOT, capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = wheels.glob("loosefs-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", str(wheel)], check=True,
                   timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("LOOSEFS_BIN", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "loosefs", "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("loosefs "), r.stderr
    exe = venv / "bin" / "loosefs"
    assert exe.stat().st_size < 40 << 20, "the wheel's binary is stripped"
    code = ("import loosefs; assert loosefs.binary() == %r\n"
            "with loosefs.mount(%r) as m:\n    print(sum(1 for p in m.path.rglob('*') if p.is_file()))\n"
            % (str(exe), str(pack)))
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and int(r.stdout) > 0, r.stderr
