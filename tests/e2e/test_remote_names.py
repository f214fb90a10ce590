"""Names and versions of remote objects against real servers on 127.0.0.1: keys with non-ASCII
and URL-special characters on SeaweedFS (S3) and files with such names in a directory nginx
lists each read their own bytes (never another object's); a file an HTTP server rewrites with
the same size within the same second answers ESTALE, never bytes of two versions (a server
whose ETag follows the content: servers.ListingServer); a listing naming `.`, `..` or a link
loop is walked a bounded number of times. On moto (keys stored verbatim): the same names read
right, and keys no path can hold (`a//b`, `..`, a control character) are left out and logged
while the rest mounts; an S3 server repeating its continuation token is refused, not listed
forever."""
import errno
import os
import pathlib
import random
import subprocess
import time

import pytest

from conftest import loosefs_bin, need_mount
import servers
from test_remote import s3_env

# Every name holds bytes of one length, so a name read as another's would pass a size check.
NAMES = ["café.txt", "数据.txt", "50%off.txt", "a%20b.txt", "a b.txt", "a%41.txt", "aA.txt", "x%ff.txt",
         "a*b.txt", "x#y.txt", "q?x=1.txt", "a+b.txt", "données/x.txt", "sub dir/é%2Fz.txt"]


def content(name: str) -> bytes:
    return (name.encode() * 64)[:64] + b"|" + name.encode().ljust(64, b".")[:64]


@pytest.fixture(scope="module")
def servers_up(tmp_path_factory):
    need_mount()
    work = tmp_path_factory.mktemp("names")
    www = work / "www"
    tree = www / "listed" / "names"
    for n in NAMES:
        (tree / n).parent.mkdir(parents=True, exist_ok=True)
        (tree / n).write_bytes(content(n))
    weed = servers.Seaweed(work / "weed")
    nginx = servers.Nginx(work / "nginx", www)
    try:
        weed.start()
        nginx.start()
        c = weed.client()
        for n in NAMES:
            c.put_object(Bucket=weed.bucket, Key=f"names/{n}", Body=content(n))
        yield dict(work=work, weed=weed, nginx=nginx, tree=tree)
    finally:
        weed.stop()
        nginx.stop()


def mount(url, work, *args, env=None, timeout=120):
    mnt = work / f"mnt{random.randrange(1 << 30)}"
    mnt.mkdir()
    cache = work / f"cache{random.randrange(1 << 30)}"
    r = subprocess.run([loosefs_bin(), "mount", url, str(mnt), "--log", str(mnt) + ".log", "--allow-http",
                        "--cache-size", "1G", "--cache-dir", str(cache), *args],
                       env=env or s3_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return mnt


def umount(mnt):
    subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, timeout=60)


def assert_each_name_reads_its_own_bytes(mnt):
    for n in NAMES:
        assert (mnt / n).read_bytes() == content(n), n


def test_s3_keys_with_non_ascii_and_url_special_characters_read_their_own_bytes(servers_up, pack):
    """Listed and read: every key's own bytes (the GET asks for the key encoded once); a pack
    under a non-ASCII key mounts and reads as the local pack."""
    w = servers_up
    weed = w["weed"]
    mnt = mount(f"s3://{weed.bucket}/names/", w["work"], "--endpoint-url", weed.endpoint)
    try:
        assert_each_name_reads_its_own_bytes(mnt)
    finally:
        umount(mnt)
    weed.put("données/50% off/data.pack", pack)
    mnt = mount(f"s3://{weed.bucket}/données/50% off/data.pack", w["work"], "--endpoint-url", weed.endpoint)
    try:
        local = w["work"] / "local"
        local.mkdir(exist_ok=True)
        subprocess.run([loosefs_bin(), "mount", str(pack), str(local)], check=True, timeout=60)
        try:
            files = sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file())
            assert files
            for rel in files:
                assert (mnt / rel).read_bytes() == (local / rel).read_bytes(), rel
        finally:
            umount(local)
    finally:
        umount(mnt)


def test_https_names_with_percent_and_non_ascii_read_their_own_bytes(servers_up):
    """nginx lists the raw names; `a%20b.txt` is fetched as itself, not as `a b.txt`."""
    w = servers_up
    nginx = w["nginx"]
    mnt = mount(nginx.url("listed/names/", tls=True), w["work"], "--ca-bundle", str(nginx.ca))
    try:
        assert_each_name_reads_its_own_bytes(mnt)
    finally:
        umount(mnt)


def test_a_file_rewritten_with_the_same_size_in_the_same_second_answers_estale_never_mixed(tmp_path):
    """A server whose ETag follows the content: bytes read before the rewrite and after it are
    never served as one file; the first answer's ETag pins the file."""
    need_mount()
    root = tmp_path / "www"
    (root / "d").mkdir(parents=True)
    f = root / "d" / "big.bin"
    size = 64 << 20
    old = random.randbytes(size)
    f.write_bytes(old)
    stamp = int(time.time()) - 100
    os.utime(f, (stamp, stamp))
    srv = servers.ListingServer(root).start()
    try:
        mnt = mount(srv.url("d/"), tmp_path)
        try:
            with open(mnt / "big.bin", "rb") as h:
                at = size - (1 << 20)
                assert os.pread(h.fileno(), 4096, at) == old[at:at + 4096]
                f.write_bytes(bytes(size))
                os.utime(f, (stamp, stamp))
                try:
                    got = os.pread(h.fileno(), 4096, 0)
                except OSError as e:
                    assert e.errno == errno.ESTALE, e
                else:
                    pytest.fail(f"served after the rewrite: {'old' if got == old[:4096] else 'new'} bytes")
        finally:
            umount(mnt)
    finally:
        srv.stop()


def test_a_listing_naming_dot_dot_or_a_link_loop_is_walked_a_bounded_number_of_times(tmp_path):
    """`..` and `.` entries are left out (they name the directory itself); a server-side link
    loop (`loop -> .`) is listed to a bounded depth; the mount returns and serves the file."""
    need_mount()
    root = tmp_path / "www"
    (root / "d").mkdir(parents=True)
    (root / "d" / "ok.txt").write_bytes(b"ok")
    dots = [{"name": n, "type": "directory", "mtime": "Wed, 25 Nov 2026 10:00:00 GMT"} for n in (".", "..", "")]
    srv = servers.ListingServer(root, extra={"/d/": dots}, loops=("loop",)).start()
    try:
        mnt = mount(srv.url("d/"), tmp_path, timeout=60)
        try:
            assert (mnt / "ok.txt").read_bytes() == b"ok"
            assert srv.requests < 200, srv.requests
        finally:
            umount(mnt)
    finally:
        srv.stop()


# Keys moto stores as given, which no mount can show as a path: each is left out and logged.
UNSHOWABLE = ["names/a//b.txt", "names/../x.txt", "names/./d.txt", "names/c\x01.txt", "names/e\x7f/f.txt"]


def test_on_moto_names_read_their_own_bytes_and_unshowable_keys_are_left_out_and_logged(tmp_path):
    need_mount()
    moto = servers.Moto(tmp_path / "moto").start()
    try:
        c = moto.client()
        for n in NAMES:
            c.put_object(Bucket=moto.bucket, Key=f"names/{n}", Body=content(n))
        for k in UNSHOWABLE:
            c.put_object(Bucket=moto.bucket, Key=k, Body=b"never served")
        listed = {o["Key"] for o in c.list_objects_v2(Bucket=moto.bucket, Prefix="names/")["Contents"]}
        assert set(UNSHOWABLE) <= listed, listed  # stored verbatim: the test tests something
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        r = subprocess.run([loosefs_bin(), "mount", f"s3://{moto.bucket}/names/", str(mnt), "--allow-http",
                            "--endpoint-url", moto.endpoint, "--log", str(tmp_path / "log"),
                            "--cache-dir", str(tmp_path / "cache")],
                           env=s3_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        try:
            assert_each_name_reads_its_own_bytes(mnt)
            shown = sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*") if p.is_file())
            assert shown == sorted(NAMES), shown
            # Said once each where the listing runs (the mount command), with what is wrong (also
            # the common prefixes `../`, `./` and `e\x7f/` the first level's LIST gives).
            left_out = [line for line in r.stderr.splitlines() if "left out of the listing" in line]
            for k in UNSHOWABLE:  # as Rust's Debug writes it
                said = '"' + k.replace("\x01", "\\u{1}").replace("\x7f", "\\u{7f}") + '"'
                assert sum(said in line for line in left_out) == 1, (said, r.stderr)
            for why in ["empty path segment", "`.` or `..`", "control character"]:
                assert any(why in line for line in left_out), (why, r.stderr)
        finally:
            umount(mnt)
    finally:
        moto.stop()


def test_an_s3_server_repeating_its_continuation_token_is_refused_not_listed_forever(tmp_path):
    """A stand-in S3 (no real server misbehaves on cue) answers every page of a listing with the
    token it was asked with: the mount fails within its timeout, naming the token."""
    need_mount()
    import http.server
    import threading

    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            asked.append(self.path)
            body = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><Prefix>d/</Prefix>'
                    '<KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>'
                    '<Contents><Key>d/a.txt</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>'
                    '<ETag>"x"</ETag><Size>3</Size></Contents>'
                    '<NextContinuationToken>same</NextContinuationToken></ListBucketResult>').encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        r = subprocess.run([loosefs_bin(), "mount", "s3://b/d/", str(mnt), "--allow-http", "--endpoint-url",
                            f"http://127.0.0.1:{srv.server_address[1]}", "--retries", "0"],
                           env=s3_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode != 0, r.stdout
        assert "continuation token" in r.stderr and "same" in r.stderr, r.stderr
        assert len(asked) < 10, asked
    finally:
        srv.shutdown()


def test_a_listed_size_no_object_can_have_is_left_out_naming_that_file(tmp_path):
    """An HTTP listing that says 2^64-1 bytes (or 2^62) for one file: that file is left out,
    said by its own name; its neighbours mount and read whole."""
    need_mount()
    root = tmp_path / "www"
    (root / "d").mkdir(parents=True)
    (root / "d" / "a.txt").write_bytes(b"a" * 5000)
    (root / "d" / "z.txt").write_bytes(b"z" * 7000)
    huge = [{"name": f"huge{i}.bin", "type": "file", "mtime": "Wed, 25 Nov 2026 10:00:00 GMT", "size": n}
            for i, n in enumerate([2**64 - 1, 2**62])]
    srv = servers.ListingServer(root, extra={"/d/": huge}).start()
    try:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        r = subprocess.run([loosefs_bin(), "mount", srv.url("d/"), str(mnt), "--allow-http", "--log",
                            str(tmp_path / "log"), "--cache-dir", str(tmp_path / "cache")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        try:
            assert sorted(p.name for p in mnt.iterdir()) == ["a.txt", "z.txt"]
            assert (mnt / "a.txt").read_bytes() == b"a" * 5000 and (mnt / "z.txt").read_bytes() == b"z" * 7000
            for i in range(2):
                line = [ln for ln in r.stderr.splitlines() if f"huge{i}.bin" in ln]
                assert line and "larger than any object store holds" in line[0], r.stderr
            assert "a.txt" not in r.stderr and "z.txt" not in r.stderr, r.stderr
        finally:
            umount(mnt)
    finally:
        srv.stop()
