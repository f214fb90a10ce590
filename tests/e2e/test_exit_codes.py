"""Exit codes by kind of failure (docs/CONFIGURATION.md, "Exit codes"; sysexits.h): one real
failure per code, each also naming what failed on one line of stderr. The CSI plugin's statuses
for the same kinds are tested in test_csi.py; Python's error classes in test_python_api.py."""
import io
import os
import shutil
import subprocess
import tarfile
import tempfile

import pytest

import servers
from conftest import loosefs_bin, missing_prerequisite, need_mount

FAILED, USAGE, DAMAGED, NOT_FOUND, UNAVAILABLE, CHANGED, DENIED = 1, 2, 65, 66, 69, 75, 77


def run(*args, env=None, user=None):
    cmd = [loosefs_bin(), *map(str, args)]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def exits(code, r, *words):
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "panicked" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for w in words:
        assert str(w) in r.stderr, (w, r.stderr)


def webdataset(path, n=3):
    """A small WebDataset tar: `n` samples of a JPEG-looking `.jpg` and a `.cls`."""
    with tarfile.open(path, "w") as t:
        for i in range(n):
            for ext, data in (("jpg", b"\xff\xd8\xff" + os.urandom(200)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return path


def test_a_difference_found_or_a_failure_of_no_kind_exits_1(pack, source, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(source, changed)
    victim = sorted(p for p in changed.rglob("*") if p.is_file())[0]
    victim.write_bytes(victim.read_bytes() + b"x")
    exits(FAILED, run("verify", pack, "--against", changed))


def test_bad_usage_exits_2(pack, tmp_path):
    exits(USAGE, run("info", pack, "--no-such-flag"), "--no-such-flag")
    exits(USAGE, run("info", pack, "--format", "nope"), "nope")
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    exits(USAGE, run("mount", pack, mnt, env={"LOOSEFS_THREADS": "many"}), "LOOSEFS_THREADS")
    # Refused by the daemon, after the command line parsed: a view the source cannot show.
    exits(USAGE, run("mount", pack, mnt, "--decode", "frames"), "--decode frames", pack)
    assert not os.path.ismount(mnt)


def test_a_damaged_source_exits_65(pack, tmp_path):
    noise = tmp_path / "noise.bin"
    noise.write_bytes(os.urandom(4096))
    exits(DAMAGED, run("info", noise), noise)
    cut = tmp_path / "cut.pack"
    cut.write_bytes(pack.read_bytes()[: pack.stat().st_size // 2])
    exits(DAMAGED, run("info", cut), cut)
    tar = webdataset(tmp_path / "a.tar")
    short = tmp_path / "short.tar"
    short.write_bytes(tar.read_bytes()[:700])
    exits(DAMAGED, run("info", short, "--format", "webdataset", "--index-dir", tmp_path / "ix"), short)


def test_a_missing_source_exits_66(pack, tmp_path):
    exits(NOT_FOUND, run("info", tmp_path / "missing.pack"), tmp_path / "missing.pack")
    if shutil.which("nginx") is None:
        pytest.fail("nginx not installed (scripts/setup.sh installs nginx-light)")
    www = tmp_path / "www"
    www.mkdir()
    shutil.copy(pack, www / "data.pack")
    nginx = servers.Nginx(tmp_path / "nginx", www).start()
    try:
        assert run("info", nginx.url("data.pack"), "--allow-http").returncode == 0
        url = nginx.url("gone.pack")
        exits(NOT_FOUND, run("info", url, "--allow-http"), url)
    finally:
        nginx.stop()


def test_a_server_out_of_reach_exits_69():
    url = f"http://127.0.0.1:{servers.free_port()}/data.pack"
    exits(UNAVAILABLE, run("info", url, "--allow-http"), "nothing listens", url)


def test_a_source_changed_since_its_shared_index_exits_75(tmp_path):
    tar = webdataset(tmp_path / "a.tar")
    assert run("index", tar, "--index-dir", tmp_path / "ix1").returncode == 0
    st = tar.stat()
    os.utime(tar, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    exits(CHANGED, run("info", tar, "--index-dir", tmp_path / "ix2"), "stale", tar)


def test_permission_denied_exits_77(pack):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        missing_prerequisite("root and setpriv (util-linux), to read as another user")
    # A directory every user may enter (pytest's are private), holding a file only root reads.
    d = tempfile.mkdtemp(prefix="loosefs-exit-", dir="/tmp")
    try:
        os.chmod(d, 0o755)
        secret = os.path.join(d, "secret.pack")
        shutil.copy(pack, secret)
        os.chmod(secret, 0o600)
        exits(DENIED, run("info", secret, user=65534), secret, "ermission denied")
    finally:
        shutil.rmtree(d, ignore_errors=True)
