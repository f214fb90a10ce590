"""A FUSE connection handed over as a descriptor, the pattern of mountpoint-s3's CSI driver v2:
`loosefs fuse-fd MNT -- COMMAND` (root) mounts `/dev/fuse` at MNT and runs COMMAND with the
descriptor as fd 3; the daemon, `loosefs mount PACK /dev/fd/3`, runs as nobody without any
capability in new user and mount namespaces (what a container gives it, made here by
`unshare`), and serves the pack byte-identically to root and to an unprivileged reader.
Unmounting first ends the daemon; the daemon dying first makes the helper unmount: neither
order leaves a stale mount."""
import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import loosefs_bin, missing_prerequisite, need_mount

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
          "--bounding-set=-all", "--"]


def mounted_here(mnt: pathlib.Path) -> bool:
    want = str(mnt).encode()
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split(b" ")[4] == want for line in f)


@contextlib.contextmanager
def shared_dir():
    """A world-readable directory that is a shared mount, so the daemon's mount namespace (a
    slave of ours, as a container's volume with HostToContainer propagation) sees its unmount."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-handover-", dir="/tmp"))
    d.chmod(0o755)
    subprocess.run(["mount", "--bind", str(d), str(d)], check=True, timeout=30)
    subprocess.run(["mount", "--make-shared", str(d)], check=True, timeout=30)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], timeout=30)
        shutil.rmtree(d, ignore_errors=True)


def start(pack: pathlib.Path, mnt: pathlib.Path, log: pathlib.Path, transport: str):
    """The helper, mounting at `mnt` and running the daemon as nobody in its own namespaces;
    returns (helper, daemon pid) once the mount answers."""
    cmd = [loosefs_bin(), "fuse-fd", str(mnt), "--allow-other", "--", *NOBODY,
           "unshare", "--user", "--mount", "--propagation", "slave", "--map-current-user",
           loosefs_bin(), "mount", str(pack), "/dev/fd/3", "--foreground", "--transport", transport,
           "--log", "-"]
    helper = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    deadline = time.monotonic() + 60
    while not mounted_here(mnt):
        assert helper.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the helper did not mount in 60 s"
        time.sleep(0.02)
    os.listdir(mnt)  # answered once the daemon serves (requests wait for its INIT reply)
    children = pathlib.Path(f"/proc/{helper.pid}/task/{helper.pid}/children").read_text().split()
    assert len(children) == 1, children
    return helper, int(children[0])


def hashes(root: pathlib.Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".loosefs" not in p.parts}


def status(pid: int) -> dict:
    out = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


@pytest.fixture()
def setting(pack, source):
    need_mount()
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.fail("setpriv and unshare (util-linux) are needed")
    with shared_dir() as d:
        p = d / "data.pack"
        shutil.copyfile(pack, p)
        p.chmod(0o644)
        mnt = d / "mnt"
        mnt.mkdir()
        yield p, mnt, d / "daemon.log", hashes(source)


@pytest.mark.parametrize("transport", ["classic", "uring"])
def test_a_daemon_without_privileges_serves_a_handed_over_connection(setting, transport):
    pack, mnt, log, want = setting
    if transport == "uring" and not pathlib.Path("/sys/module/fuse/parameters/enable_uring").exists():
        missing_prerequisite("the kernel has no FUSE over io_uring (/sys/module/fuse/parameters/enable_uring)")
    helper, daemon = start(pack, mnt, log, transport)
    try:
        st = status(daemon)
        assert st["Uid"].split()[0] == "65534" and st["CapEff"] == "0000000000000000", st
        assert st["CapPrm"] == "0000000000000000", st
        for ns in ("user", "mnt"):
            assert os.readlink(f"/proc/{daemon}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
        # Root reads every file; so does an unprivileged user (the mount is --allow-other).
        assert hashes(mnt) == want
        script = ("import hashlib,json,pathlib,sys; r=pathlib.Path(sys.argv[1]); print(json.dumps({str(p.relative_to(r)):"
                  " hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(r.rglob('*'))"
                  " if p.is_file() and '.loosefs' not in p.parts}))")
        r = subprocess.run([*NOBODY, sys.executable, "-c", script, str(mnt)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == want
        stats = subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True, text=True,
                               timeout=60)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["daemon"]["transport"]["kind"] == transport
        # Unmounted first: the daemon's session ends, it exits, and so does the helper.
        subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, timeout=60)
        assert helper.wait(timeout=60) == 0, log.read_text()
        assert not pathlib.Path(f"/proc/{daemon}").exists()
        assert not mounted_here(mnt)
    finally:
        if helper.poll() is None:
            helper.kill()
            subprocess.run(["umount", "-l", str(mnt)], timeout=30)


def test_a_daemon_that_dies_leaves_no_stale_mount(setting):
    pack, mnt, log, want = setting
    helper, daemon = start(pack, mnt, log, "auto")
    try:
        name = next(iter(want))
        assert hashlib.sha256((mnt / name).read_bytes()).hexdigest() == want[name]
        os.kill(daemon, signal.SIGKILL)
        helper.wait(timeout=60)
        assert not mounted_here(mnt), "the helper left the mount of a dead daemon"
        assert not (mnt / name).exists()
    finally:
        if helper.poll() is None:
            helper.kill()
            subprocess.run(["umount", "-l", str(mnt)], timeout=30)


def test_a_descriptor_that_is_not_a_fuse_connection_is_refused(tmp_path):
    need_mount()
    with open(tmp_path / "f", "w") as f:
        r = subprocess.run([loosefs_bin(), "mount", str(tmp_path), f"/dev/fd/{f.fileno()}", "--foreground"],
                           pass_fds=(f.fileno(),), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "is not a /dev/fuse descriptor" in r.stderr, r.stderr
    r = subprocess.run([loosefs_bin(), "mount", str(tmp_path), "/dev/fd/97"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "no such descriptor" in r.stderr, r.stderr


def test_an_unmounted_descriptor_and_one_another_daemon_serves_are_refused_saying_which(setting, tmp_path):
    """/dev/fuse opened but never mounted: "not mounted yet", not EPERM. A connection whose
    FUSE_INIT a first daemon took: a second daemon refuses it at once, not hangs or splits
    its requests."""
    pack, mnt, log, want = setting
    fd = os.open("/dev/fuse", os.O_RDWR)
    try:
        r = subprocess.run([loosefs_bin(), "mount", str(pack), f"/dev/fd/{fd}", "--foreground"], pass_fds=(fd,),
                           capture_output=True, text=True, timeout=60)
    finally:
        os.close(fd)
    assert r.returncode != 0 and "not mounted yet" in r.stderr, r.stderr
    err, rc = tmp_path / "second.err", tmp_path / "second.rc"
    b = loosefs_bin()
    script = (f"{b} mount {pack} /dev/fd/3 --log {tmp_path / 'first.log'} && "
              f"{b} mount {pack} /dev/fd/3 --foreground --log - 2>{err}; echo $? >{rc}; "
              f"{b} umount {mnt}")
    r = subprocess.run([b, "fuse-fd", str(mnt), "--", "sh", "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert rc.read_text().strip() not in ("", "0"), (rc.read_text(), err.read_text(), r.stderr)
    assert "another daemon already serves this FUSE connection" in err.read_text(), err.read_text()
    assert not mounted_here(mnt)


def test_a_descriptor_sent_over_a_unix_socket_serves_the_daemon_of_another_container(setting):
    """The Kubernetes pattern: the receiver (`fuse-fd --receive`, as nobody in its own
    namespaces: the workload's sidecar) listens first; the privileged side mounts and sends the
    descriptor over the socket (SCM_RIGHTS); the daemon serves every file; unmounting ends the
    daemon, the receiver, and then the sender."""
    pack, mnt, log, want = setting
    sock_dir = mnt.parent / "sock"
    sock_dir.mkdir()
    os.chown(sock_dir, 65534, 65534)
    sock = sock_dir / "fuse.sock"
    receiver = subprocess.Popen(
        [*NOBODY, "unshare", "--user", "--mount", "--propagation", "slave", "--map-current-user",
         loosefs_bin(), "fuse-fd", "--receive", str(sock), "--",
         loosefs_bin(), "mount", str(pack), "/dev/fd/3", "--foreground", "--log", "-"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    sender = subprocess.Popen([loosefs_bin(), "fuse-fd", str(mnt), "--allow-other", "--send", str(sock)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not mounted_here(mnt):
            assert sender.poll() is None, sender.stderr.read()
            assert time.monotonic() < deadline, "the sender did not mount in 60 s"
            time.sleep(0.02)
        assert hashes(mnt) == want
        subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, timeout=60)
        assert receiver.wait(timeout=60) == 0, log.read_text()
        assert sender.wait(timeout=60) == 0, sender.stderr.read()
        assert not mounted_here(mnt)
    finally:
        for p in (sender, receiver):
            if p.poll() is None:
                p.kill()
        subprocess.run(["umount", "-l", str(mnt)], timeout=30, capture_output=True)


def test_signals_to_fuse_fd_leave_no_stale_mount_and_nothing_is_mounted_before_a_receiver(setting, tmp_path):
    """`fuse-fd --send` with no receiver yet mounts nothing (a mount nobody serves would hang
    `statfs`, which node agents run on every mount); SIGTERM then ends it with nothing
    mounted. SIGTERM to a `fuse-fd` whose daemon serves unmounts MNT, and the daemon and the
    helper end."""
    pack, mnt, log, want = setting
    sock = tmp_path / "nobody-listens.sock"
    sender = subprocess.Popen([loosefs_bin(), "fuse-fd", str(mnt), "--send", str(sock)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # Until it gives up (60 s) the sender retries the socket; meanwhile MNT is no mount and
        # statfs answers at once.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            assert not mounted_here(mnt)
            os.statvfs(mnt)
            time.sleep(0.05)
        assert sender.poll() is None, sender.stderr.read()
        sender.send_signal(signal.SIGTERM)
        assert sender.wait(timeout=30) != 0
        assert not mounted_here(mnt)
    finally:
        if sender.poll() is None:
            sender.kill()
    helper, daemon = start(pack, mnt, log, "classic")
    try:
        assert hashes(mnt) == want
        helper.send_signal(signal.SIGTERM)
        helper.wait(timeout=60)
        assert not mounted_here(mnt)
        deadline = time.monotonic() + 60
        def alive():
            try:
                return status(daemon).get("State", "Z").split()[0] != "Z"
            except OSError:
                return False
        while alive():
            assert time.monotonic() < deadline, "the daemon outlived its mount"
            time.sleep(0.05)
    finally:
        if helper.poll() is None:
            helper.kill()
        subprocess.run(["umount", "-l", str(mnt)], timeout=30, capture_output=True)
