"""Mounts that outlive their daemon (src/mount/keeper.rs): a reader pass over the 1,000-file
sample while the daemon is `kill -9`ed at random moments and once with a READ held inside it
(the test hook LOOSEFS_TEST_HOLD_READ) ends with no error and every file identical; without
resend only the read in flight fails; `loosefs restart` swaps in a second binary under a
reader; a daemon that keeps dying ends the mount with an error, not a hang; a source changed
since the mount is never served under the old inode numbers; io_uring is not kept, and says
why; a handed-over connection (`fuse-fd`) is kept by the process fuse-fd waits for."""
import errno
import json
import mmap
import os
import pathlib
import random
import re
import shutil
import subprocess
import threading
import time
import zlib

import pytest

from conftest import loosefs_bin, need_mount

# Errors a reader may see when a request dies with its daemon (no resend) or the mount ends.
GONE = {errno.EIO, errno.ECONNABORTED, errno.ENOTCONN}


def run(*args, env=None, check=True, b=None):
    return subprocess.run([b or loosefs_bin(), *map(str, args)], check=check, capture_output=True, text=True,
                          env=env, timeout=300)


def stats(mnt) -> dict:
    return json.loads(run("stats", mnt, "--json").stdout)


def wait_for(pred, timeout, what):
    """Polls `pred` (an observable condition, not a timed guess) every 10 ms until true."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"not within {timeout} s: {what}")


def files_of(root: pathlib.Path):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def mounted(pack, tmp_path):
    """Mounts with a fresh mountpoint; unmounts (waiting for daemon and keeper) at the end."""
    need_mount()
    made = []

    def mount(src, *args, env=None, b=None):
        mnt = tmp_path / f"mnt{len(made)}"
        mnt.mkdir()
        log = tmp_path / f"mnt{len(made)}.log"
        r = run("mount", src, mnt, "--log", log, "--push-ahead", "0", *args, env=env, check=False, b=b)
        assert r.returncode == 0, r.stderr
        made.append(mnt)
        return mnt, log

    yield mount
    for mnt in made:
        keeper = None
        if os.path.ismount(mnt):
            r = run("stats", mnt, "--json", check=False)
            if r.returncode == 0:
                keeper = (json.loads(r.stdout)["daemon"].get("keeper") or {}).get("pid")
            run("umount", "--lazy", mnt, check=False)
        # A test that failed with a READ still held leaves a daemon serving a detached mount:
        # its keeper and the keeper's daemons go too.
        try:
            ours = keeper and str(mnt).encode() in pathlib.Path(f"/proc/{keeper}/cmdline").read_bytes()
            children = pathlib.Path(f"/proc/{keeper}/task/{keeper}/children").read_text().split() if ours else []
        except OSError:
            ours, children = False, []
        if ours:
            for pid in [keeper, *map(int, children)]:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass


class Reader:
    """Reads every file of `files` under `mnt` on a thread and compares it with `want`
    (CRC-32 by path): `done` counts files read; `errors` lists (path, errno) and `wrong` the
    files whose bytes differed. With `evict`, each file's pages are dropped after its read, so
    a later pass reads through the daemon again."""

    def __init__(self, mnt, files, want, passes=1, evict=False, before=None, direct=False):
        self.mnt, self.files, self.want, self.passes, self.evict = mnt, files, want, passes, evict
        # O_DIRECT: each read(2) is one READ the caller waits for, with no page-cache retry.
        self.direct = direct
        self.buf = mmap.mmap(-1, 8 << 20)
        # {file index: callable}: run on the reader's thread before that file of the first pass
        # is read (a kill between two reads that is sure to fall inside the pass).
        self.before = before or {}
        self.done, self.errors, self.wrong = 0, [], []
        self.progress = threading.Condition()
        self.stop = threading.Event()
        self.read_at = []  # monotonic time of each completed read
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        p = 0
        while p < self.passes or (self.passes == 0 and not self.stop.is_set()):
            for i, rel in enumerate(self.files):
                if p == 0 and i in self.before:
                    self.before[i]()
                try:
                    fd = os.open(self.mnt / rel, os.O_RDONLY | (os.O_DIRECT if self.direct else 0))
                    try:
                        data = b""
                        if self.direct:
                            while n := os.readv(fd, [self.buf]):
                                data += self.buf[:n]
                        else:
                            while chunk := os.read(fd, 1 << 20):
                                data += chunk
                        if self.evict:
                            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)
                    if zlib.crc32(data) != self.want[rel]:
                        self.wrong.append(rel)
                except OSError as e:
                    self.errors.append((rel, e.errno))
                self.read_at.append(time.monotonic())
                with self.progress:
                    self.done += 1
                    self.progress.notify_all()
            p += 1
            if self.passes == 0 and self.stop.is_set():
                break

    def start(self):
        self.thread.start()
        return self

    def wait_done(self, n, timeout=120):
        with self.progress:
            assert self.progress.wait_for(lambda: self.done >= n or not self.thread.is_alive(), timeout), \
                f"the reader is stuck at file {self.done}"

    def join(self, timeout=300):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the reader hung at file {self.done} of {len(self.files)}"


def crcs(source, files):
    return {rel: zlib.crc32((source / rel).read_bytes()) for rel in files}


def hold_then_kill(mnt, tmp_path, killed):
    """Arms the test hook so that the next READ is held inside the daemon, and starts a thread
    that kills the daemon (SIGKILL) once that READ is held: a READ in flight at its death.
    Appends the killed pid to `killed`."""
    pid = stats(mnt)["daemon"]["pid"]
    hold = tmp_path / "hold"
    hold.touch()

    def kill():
        wait_for(lambda: pathlib.Path(f"{hold}.held").exists(), 60, "a READ held in the daemon")
        os.kill(pid, 9)
        killed.append(pid)

    threading.Thread(target=kill, daemon=True).start()


def kill_daemon(mnt):
    pid = stats(mnt)["daemon"]["pid"]
    os.kill(pid, 9)
    return pid


def pause_after(reader, t):
    """Seconds from `t` to the first read completed after it."""
    return min((x for x in reader.read_at if x >= t), default=float("inf")) - t


@pytest.mark.parametrize("direct", [True, False], ids=["O_DIRECT", "buffered"])
def test_a_reader_pass_survives_its_daemon_killed_three_times_and_once_mid_read(pack, source, tmp_path, mounted,
                                                                                  direct):
    """O_DIRECT: every read(2) is a READ with no page-cache retry, so the held one comes back
    only because the kernel resent it to the next daemon (FUSE_NOTIFY_RESEND)."""
    files = files_of(source)
    assert len(files) >= 1000
    want = crcs(source, files)
    env = dict(os.environ, LOOSEFS_TEST_HOLD_READ=str(tmp_path / "hold"))
    mnt, log = mounted(pack, env=env)
    first = stats(mnt)["daemon"]
    assert first["keeper"] and first["transport"]["kind"] == "classic", first
    # Three kills between reads at random files, and one with the next READ held inside the
    # daemon; every one of them falls inside the pass.
    rng = random.Random(os.environ.get("LOOSEFS_TEST_SEED", "69"))
    moments = sorted(rng.sample(range(50, len(files) - 50), 4))
    held = moments.pop(rng.randrange(4))
    killed, at = [], {}

    def kill():
        at[len(at)] = time.monotonic()
        killed.append(kill_daemon(mnt))

    def hold():
        at[len(at)] = time.monotonic()
        hold_then_kill(mnt, tmp_path, killed)

    before = {m: kill for m in moments}
    before[held] = hold
    reader = Reader(mnt, files, want, before=before, direct=direct).start()
    reader.join()
    pauses = [pause_after(reader, t) for t in at.values()]
    assert reader.errors == [] and reader.wrong == [], (reader.errors[:5], reader.wrong[:5])
    assert reader.done == len(files)
    now = stats(mnt)["daemon"]
    assert len(killed) == 4 and now["pid"] not in killed and now["keeper"]["pid"] == first["keeper"]["pid"], now
    assert now["keeper"]["restarts"] == 4 and now["keeper"]["last_end"] == "killed by signal 9", now
    text = run("stats", mnt).stdout
    assert f"kept        by keeper pid {now['keeper']['pid']}, 4 restarts (the last daemon: killed by signal 9)" \
        in text, text
    metrics = run("stats", mnt, "--format", "prometheus").stdout
    assert re.search(r"^loosefs_daemon_keeper_restarts_total\{[^}]*\} 4(\.0)?$", metrics, re.M), metrics
    print(f"pauses after each kill ({'O_DIRECT' if direct else 'buffered'}, s): {[round(p, 3) for p in pauses]}")
    text = log.read_text()
    assert text.count("died (") == 4 and "test hook: holding a READ" in text, text[-2000:]


@pytest.mark.parametrize("direct", [True, False], ids=["O_DIRECT", "buffered"])
def test_without_resend_only_the_read_in_flight_fails(pack, source, tmp_path, mounted, direct):
    """The daemon reads from a clone of the device of its own, so the READ it holds ends with
    it (ECONNABORTED). An O_DIRECT reader sees that error, for that file only; a buffered one
    does not: the page cache reads the page again (`filemap_read_folio`), from the next
    daemon."""
    files = files_of(source)
    want = crcs(source, files)
    env = dict(os.environ, LOOSEFS_TEST_HOLD_READ=str(tmp_path / "hold"))
    mnt, _ = mounted(pack, "--resend=false", env=env)
    killed = []
    half = len(files) // 2
    reader = Reader(mnt, files, want, direct=direct, before={half: lambda: hold_then_kill(mnt, tmp_path, killed)})
    reader.start().join()
    print(f"reads failed with the daemon ({'O_DIRECT' if direct else 'buffered'}): {reader.errors}")
    if direct:
        assert reader.errors == [(files[half], errno.ECONNABORTED)], reader.errors
    else:
        assert reader.errors == [], reader.errors
    assert reader.wrong == [] and reader.done == len(files)
    assert stats(mnt)["daemon"]["keeper"]["restarts"] == 1


def test_restart_swaps_in_a_second_binary_under_a_reader(pack, source, tmp_path, mounted):
    files = files_of(source)
    want = crcs(source, files)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    b = bindir / "loosefs"
    shutil.copy(loosefs_bin(), b)
    mnt, _ = mounted(pack, b=str(b))
    old = stats(mnt)["daemon"]
    # Every pass reads through the daemon (pages dropped after each read) until stopped.
    reader = Reader(mnt, files, want, passes=0, evict=True).start()
    reader.wait_done(200)
    # The upgrade: a second build (the same code, other bytes) installed over the first.
    new = bindir / "loosefs.new"
    shutil.copy(b, new)
    with open(new, "ab") as f:
        f.write(b"a second build of loosefs")
    os.replace(new, b)
    t = time.monotonic()
    r = run("restart", mnt, b=str(b))
    took = time.monotonic() - t
    n = reader.done
    reader.wait_done(n + len(files))
    reader.stop.set()
    reader.join()
    assert reader.errors == [] and reader.wrong == [], (reader.errors[:5], reader.wrong[:5])
    now = stats(mnt)["daemon"]
    assert now["pid"] != old["pid"] and now["version"] != old["version"], (old, now)
    assert now["version"] in r.stdout and now["keeper"]["last_end"] == "replaced by loosefs restart", (r.stdout, now)
    print(f"restart took {took:.3f} s; longest gap between reads: "
          f"{max(b - a for a, b in zip(reader.read_at, reader.read_at[1:])):.3f} s")


def test_a_daemon_that_keeps_dying_ends_the_mount_with_an_error_not_a_hang(pack, source, tmp_path, mounted):
    files = files_of(source)
    fail = tmp_path / "fail"
    env = dict(os.environ, LOOSEFS_TEST_FAIL_START_IF=str(fail))
    mnt, log = mounted(pack, env=env)
    keeper = stats(mnt)["daemon"]["keeper"]["pid"]
    fail.touch()
    t0 = time.monotonic()
    kill_daemon(mnt)
    # A file never read: its READ waits for a daemon that never comes, until the keeper gives up.
    result = {}

    def read():
        try:
            (mnt / files[-1]).read_bytes()
            result["r"] = "read"
        except OSError as e:
            result["r"] = e.errno

    th = threading.Thread(target=read, daemon=True)
    th.start()
    th.join(120)
    assert not th.is_alive(), "the read hung"
    took = time.monotonic() - t0
    assert result["r"] in GONE, result
    wait_for(lambda: not os.path.exists(f"/proc/{keeper}") or
             pathlib.Path(f"/proc/{keeper}/stat").read_text().split(") ")[1].startswith("Z"), 60, "the keeper's end")
    text = log.read_text()
    assert "died 5 times within 60 s" in text and "test hook: LOOSEFS_TEST_FAIL_START_IF" in text, text[-3000:]
    assert not os.path.ismount(mnt)
    print(f"the mount ended {took:.2f} s after the first death")


def test_a_directory_changed_since_the_mount_is_not_taken_over(source, tmp_path, mounted):
    src = tmp_path / "src"
    shutil.copytree(source / sorted(os.listdir(source))[0], src / "a")
    mnt, log = mounted(src)
    names = sorted(os.listdir(mnt / "a"))
    assert (mnt / "a" / names[0]).read_bytes() == (src / "a" / names[0]).read_bytes()
    # A file added before the others (in name order): every later record's number would move.
    (src / "a" / "0000-added.JPEG").write_bytes(b"new")
    kill_daemon(mnt)
    with pytest.raises(OSError) as e:
        (mnt / "a" / names[-1]).read_bytes()
    assert e.value.errno in GONE
    text = log.read_text()
    assert "the source's files are not the ones the mount was made with" in text, text[-3000:]


def test_io_uring_is_not_kept_and_says_why(pack, tmp_path, mounted):
    if not pathlib.Path("/sys/module/fuse/parameters/enable_uring").exists():
        from conftest import missing_prerequisite
        missing_prerequisite("the kernel has no FUSE over io_uring")
    mnt = tmp_path / "m"
    mnt.mkdir()
    r = run("mount", pack, mnt, "--transport", "uring", "--keeper", check=False)
    assert r.returncode != 0 and "--transport uring cannot be kept" in r.stderr, r.stderr
    assert not os.path.ismount(mnt)
    ring, _ = mounted(pack, "--transport", "uring")
    assert stats(ring)["daemon"]["keeper"] is None and stats(ring)["daemon"]["transport"]["kind"] == "uring"
    auto, _ = mounted(pack)
    d = stats(auto)["daemon"]
    assert d["keeper"] is not None and d["transport"]["kind"] == "classic", d


def test_a_handed_over_connection_is_kept_by_the_process_fuse_fd_waits_for(pack, source, tmp_path):
    need_mount()
    files = files_of(source)
    want = crcs(source, files)
    mnt = tmp_path / "handed"
    mnt.mkdir()
    b = loosefs_bin()
    helper = subprocess.Popen([b, "fuse-fd", str(mnt), "--", b, "mount", str(pack), "/dev/fd/3", "--foreground",
                               "--keeper", "--push-ahead", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: os.path.ismount(mnt) and run("stats", mnt, check=False).returncode == 0, 60,
                 "the handed-over mount serving")
        first = stats(mnt)["daemon"]
        reader = Reader(mnt, files, want).start()
        reader.wait_done(300)
        os.kill(first["pid"], 9)
        reader.join()
        assert reader.errors == [] and reader.wrong == [], reader.errors[:5]
        now = stats(mnt)["daemon"]
        assert now["keeper"]["restarts"] == 1 and now["keeper"]["pid"] == first["keeper"]["pid"], now
        assert helper.poll() is None, "fuse-fd ended with the first daemon"
    finally:
        helper.terminate()
        _, err = helper.communicate(timeout=60)
    assert helper.returncode == 0, err
    assert not os.path.ismount(mnt)
