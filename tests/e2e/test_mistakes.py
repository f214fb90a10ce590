"""The mistakes docs/TROUBLESHOOTING.md lists, made for real: each row's message (its first
column, up to the first `…`) is what the command prints, and it is printed within 10 s (no
retry for what no retry heals). Rows whose cause needs a remote server or a damaged file are
made in test_remote.py, test_hostile.py, test_video.py and tests/read_path.rs; `MADE_ELSEWHERE` names them, and a
row in neither list fails this test (a new row needs its test)."""
import json
import os
import pathlib
import re
import resource
import socket
import subprocess
import time

import pytest

from conftest import ROOT, loosefs_bin, need_mount

TABLE = ROOT / "docs" / "TROUBLESHOOTING.md"

# Rows made by other tests, by the first code span of their `you see` column.
MADE_ELSEWHERE = {
    "Permission denied": "test_mount_flags.py (mounts as nobody)",
    "Input/output error": "test_hostile.py, test_formats.py",
    "Stale file handle": "test_remote.py::test_s3_object_replaced_gives_estale",
    "the server's TLS certificate is not trusted":
        "test_remote.py::test_https_with_a_private_ca_and_plain_http_only_when_allowed",
    "no such object (404)": "test_remote.py",
    "access denied (403)": "test_remote.py::test_profile_file_credentials, "
                           "test_ways_in.py::test_s3_requester_pays",
    "a Requester Pays bucket: give the Google Cloud project to bill with --billing-project":
        "test_ways_in.py::test_gcs_requester_pays_bills_the_project_given",
    "the credentials' session token has expired":
        "src/storage/object/errors.rs::a_stores_xml_error_is_said_in_words",
    "the bucket is in region …, not …":
        "test_ways_in.py::test_s3_a_bucket_in_another_region_is_read_with_no_region_given",
    "which Azure storage account?":
        "test_object_stores.py::test_without_credentials_a_mount_fails_at_once_naming_where_they_are_given",
    "a video's frame answers EIO": "test_video.py",
    "cannot pin …: only … GiB of memory is available":
        "tests/read_path.rs::pinned_pack_survives_drop_caches_and_oversize_pins_are_refused",
    "a shuffled epoch is slow on a cold mount": "not an error: bench/run.py",
}


def alternatives(column: str) -> list:
    """The messages a `you see` column names: its first code span, and the spans that follow
    it as alternatives (`A` or `B`; `A` (or `B`, `C`)); not spans of context (`… is busy`
    from `umount`: `umount` is no message). The whole column when it has no span."""
    spans = list(re.finditer(r"`([^`]*)`", column))
    if not spans:
        return [column]
    out = [spans[0].group(1)]
    for prev, cur in zip(spans, spans[1:]):
        if not re.fullmatch(r"\s*(\(or|or|,)\s*", column[prev.end():cur.start()]):
            break
        out.append(cur.group(1))
    return out


def rows():
    """The table's rows: {the first code span of its `you see` column: its alternatives}."""
    out = {}
    for line in TABLE.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| you see") or line.startswith("|---"):
            continue
        alts = alternatives(line.split(" | ")[0][2:].strip())
        out[alts[0]] = alts
    return out


def test_a_rows_alternatives_are_its_or_spans_only():
    assert alternatives("`… is busy` from `umount`") == ["… is busy"]
    assert alternatives("`Permission denied` from `mount` as a user") == ["Permission denied"]
    assert alternatives("`A` (or `B`, `C`) on the mountpoint") == ["A", "B", "C"]
    assert alternatives("`A` or `B`, at once") == ["A", "B"]


def pattern(row):
    """The row's message as a regular expression: `…` any text, HOST and PORT any word."""
    parts = [re.escape(p.strip()) for p in row.split("…")]
    return re.compile(".*".join(p for p in parts if p).replace("HOST", r"\S+").replace("PORT", r"\d+"), re.S)


def loosefs(*args, **kw):
    return subprocess.run([loosefs_bin(), *map(str, args)], capture_output=True, text=True, timeout=10, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mounted(pack, tmp_path):
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # No keeper: a daemon killed below must leave the mount stale, as without one.
    r = loosefs("mount", pack, mnt, "--keeper=false")
    assert r.returncode == 0, r.stderr
    yield mnt
    loosefs("umount", "--lazy", mnt)


def made_here(pack, tmp_path, mounted):
    """Each mistake made: {row's message: what the user sees}."""
    seen = {}
    # Nothing at the mountpoint, or something mounted there already.
    r = loosefs("mount", pack, tmp_path / "absent")
    seen["mountpoint … does not exist"] = r.stderr
    r = loosefs("mount", pack, mounted)
    seen["… is already a mount point (…); unmount it first"] = r.stderr
    # A mountpoint holding files: refused, the files left visible.
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    seen["mountpoint … is not empty"] = loosefs("mount", pack, full).stderr
    assert not os.path.ismount(full) and (full / "keep.txt").read_text() == "mine"
    # `umount` of what is not a loosefs mount: a tmpfs, and /proc, stay mounted.
    tmpfs = tmp_path / "tmpfs"
    tmpfs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(tmpfs)], check=True)
    try:
        (tmpfs / "x").write_text("x")
        r = loosefs("umount", tmpfs)
        seen["… is not a loosefs mount"] = r.stderr
        assert r.returncode != 0 and os.path.ismount(tmpfs) and (tmpfs / "x").exists(), r.stderr
        r = loosefs("umount", "--lazy", tmpfs)
        assert r.returncode != 0 and os.path.ismount(tmpfs), r.stderr
        r = loosefs("umount", "/proc")
        assert r.returncode != 0 and "not a loosefs mount" in r.stderr and "--lazy" not in r.stderr, r.stderr
        assert os.path.ismount("/proc")
    finally:
        subprocess.run(["umount", str(tmpfs)], check=True)
    # Writes are refused by the kernel's answer.
    try:
        (mounted / "new").write_bytes(b"x")
        seen["Read-only file system"] = ""
    except OSError as e:
        seen["Read-only file system"] = os.strerror(e.errno)
    # A busy mount: a process with its working directory inside.
    holder = subprocess.Popen(["sleep", "30"], cwd=mounted)
    try:
        seen["… is busy"] = loosefs("umount", mounted).stderr
    finally:
        holder.kill()
        holder.wait()
    # A daemon that died: the mountpoint answers ENOTCONN, and a new mount there names it.
    os.kill(json.loads(loosefs("stats", mounted, "--json").stdout)["daemon"]["pid"], 9)
    try:
        os.stat(mounted / "x")
        seen["Transport endpoint is not connected"] = ""
    except OSError as e:
        seen["Transport endpoint is not connected"] = os.strerror(e.errno)
    seen["mountpoint … is a stale FUSE mount"] = loosefs("mount", pack, mounted).stderr
    r = loosefs("stats", mounted)
    assert r.returncode != 0 and "mountpoint" in r.stderr and "is a stale FUSE mount" in r.stderr \
        and "loosefs umount" in r.stderr and "log" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # Nothing mounted there.
    r = loosefs("stats", tmp_path)
    seen["… is not mounted (mount it with …)"] = r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # A directory mount whose source is deleted: said in the log at once (no poll beyond 10 s).
    src, mnt3, log = tmp_path / "src", tmp_path / "mnt3", tmp_path / "mnt3.log"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.txt").write_text("x")
    mnt3.mkdir()
    r = loosefs("mount", src, mnt3, "--log", log)
    assert r.returncode == 0, r.stderr
    try:
        subprocess.run(["rm", "-rf", str(src)], check=True, timeout=10)
        deadline = time.monotonic() + 10
        while "was deleted" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["the source directory … was deleted while mounted"] = log.read_text()
    finally:
        loosefs("umount", "--lazy", mnt3)
    # Remote sources: nothing listening, plain http, no credentials.
    port = free_port()
    r = loosefs("info", f"https://127.0.0.1:{port}/data.pack")
    seen["nothing listens at HOST:PORT (connection refused …)"] = r.stderr
    # A mount of it: one line, the URL said once, no second line from the launcher.
    (tmp_path / "m4").mkdir()
    url = f"https://127.0.0.1:{port}/data.pack"
    r = loosefs("mount", url, tmp_path / "m4")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.count(url) == 1, r.stderr
    assert pattern("nothing listens at HOST:PORT").search(r.stderr), r.stderr
    # In a network namespace of its own (loopback only): the name is never asked of a resolver
    # beyond this machine.
    r = subprocess.run(["unshare", "--net", loosefs_bin(), "info", "https://no-such-host.invalid/data.pack"],
                       capture_output=True, text=True, timeout=10)
    assert pattern("cannot resolve HOST").search(r.stderr), r.stderr
    r = loosefs("info", f"http://127.0.0.1:{port}/data.pack")
    seen["… needs --allow-http"] = r.stderr
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_EC2_METADATA_DISABLED="true", HOME=str(tmp_path), AWS_CONFIG_FILE=str(tmp_path / "none"),
                   AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
        r = loosefs("info", "s3://bucket/data.pack", "--endpoint-url", f"http://127.0.0.1:{listener.getsockname()[1]}",
                    "--allow-http", env=env)
        seen["no AWS credentials … (tried, in order: …)"] = r.stderr
        # GCS and Azure, every metadata endpoint at a closed port, nothing configured.
        closed = f"127.0.0.1:{free_port()}"
        bare = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GCE_", "AZURE_", "STORAGE_"))}
        bare.update(HOME=str(tmp_path), GCE_METADATA_HOST=closed, GCE_METADATA_IP=closed,
                    AZURE_MSI_ENDPOINT=f"http://{closed}/token",
                    PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                         if not os.path.exists(os.path.join(p, "az"))))
        endpoint = ["--endpoint-url", f"http://127.0.0.1:{listener.getsockname()[1]}/acct", "--allow-http"]
        r = loosefs("info", "gs://bucket/data.pack", *endpoint, env=bare)
        seen["no GCS credentials: … (tried, in order: …)"] = r.stderr
        r = loosefs("info", "gs://bucket/data.pack", *endpoint,
                    env=dict(bare, GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "key.json")))
        seen["GCS credentials: … (from …)"] = r.stderr
        r = loosefs("info", "az://container/data.pack", *endpoint, env=dict(bare, AZURE_STORAGE_ACCOUNT_NAME="acct"))
        seen["no Azure credentials (tried, in order: …)"] = r.stderr
    finally:
        listener.close()
    # Too few descriptors for the threads asked.
    mnt2 = tmp_path / "mnt2"
    mnt2.mkdir()
    low = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))
    r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt2), "--threads", "64"], capture_output=True,
                       text=True, timeout=10, preexec_fn=low)
    if r.returncode == 0:
        loosefs("umount", mnt2)
    seen["too few file descriptors"] = r.stderr
    # Video frames asked of a directory holding no video.
    plain = tmp_path / "plain"
    (plain / "a").mkdir(parents=True)
    (plain / "a" / "x.txt").write_text("x")
    seen["--decode frames needs a LeRobot v3 dataset … or video files"] = loosefs("mount", plain, mnt2, "--decode", "frames").stderr
    return seen


def test_every_row_of_the_troubleshooting_table_is_what_the_user_sees(pack, tmp_path, mounted):
    seen = made_here(pack, tmp_path, mounted)
    table = rows()
    missing = [r for r in table if r not in seen and r not in MADE_ELSEWHERE]
    assert not missing, f"rows no test makes: {missing}"
    assert not [k for k in seen if k not in table], "made here but not in the table"
    wrong = [(r, out[-500:]) for r, out in seen.items() if not any(pattern(a).search(out) for a in table[r])]
    assert not wrong, wrong
