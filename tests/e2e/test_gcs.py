"""Google Cloud Storage (`gs://BUCKET/KEY`) against fake-gcs-server on 127.0.0.1, reached as
Google's client libraries reach an emulator (`STORAGE_EMULATOR_HOST`): a pack, a prefix of loose
objects (non-ASCII and URL-special names) and a packed format's shards mount byte-identical to
their local copies; an object replaced while mounted answers ESTALE for itself; without
credentials the mount fails at once saying which were looked for (the metadata server pointed
at a closed local port: no request leaves the machine)."""
import errno
import os
import random
import pathlib
import shutil
import subprocess

import pytest

from conftest import DATA, loosefs_bin, need_mount
import servers
from test_remote import Mount, epoch_through_outage

NAMES = ["café.txt", "数据.txt", "50%off.txt", "a%20b.txt", "a b.txt", "x#y.txt", "sub dir/é.txt"]


def content(name: str) -> bytes:
    return (name.encode() * 64)[:64] + b"|" + name.encode().ljust(64, b".")[:64]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory, pack, source):
    need_mount()
    work = tmp_path_factory.mktemp("gcs")
    bucket = work / "data" / "bkt"
    bucket.mkdir(parents=True)
    shutil.copyfile(pack, bucket / "data.pack")
    for n in NAMES:
        (bucket / "names" / n).parent.mkdir(parents=True, exist_ok=True)
        (bucket / "names" / n).write_bytes(content(n))
    wds = DATA / "formats" / "webdataset"
    shutil.copytree(wds, bucket / "wds")
    for rel in sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file()):
        (bucket / "loose" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, bucket / "loose" / rel)
    # Clients come through a fault proxy; the XML API answers its Host only.
    proxy_port = servers.free_port()
    server = servers.FakeGcs(work, work / "data", f"127.0.0.1:{proxy_port}").start()
    proxy = servers.FaultProxy(server.port, port=proxy_port).start()
    try:
        yield dict(work=work, server=server, proxy=proxy, source=source, wds=wds)
    finally:
        proxy.stop()
        server.stop()


def gcs_env(server, proxy) -> dict:
    """The environment of a user of this emulator, through `proxy` (the XML API answers the
    proxy's Host only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR"))}
    env["STORAGE_EMULATOR_HOST"] = f"127.0.0.1:{proxy.port}"
    return env


def cache(work: pathlib.Path) -> list:
    """A block cache of the mount's own (`test_remote.Mount` leaves the default)."""
    return ["--cache-dir", str(work / f"cache{random.randrange(1 << 30)}")]


def tree(root: pathlib.Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_pack_on_gcs_mounts_byte_identical_and_info_names_it(gcs):
    env = gcs_env(gcs["server"], gcs["proxy"])
    # gs:// and the console's public URL form, both to the emulator.
    for url in ["gs://bkt/data.pack", "https://storage.googleapis.com/bkt/data.pack"]:
        with Mount(url, gcs["work"], *cache(gcs["work"]), env=env) as mnt:
            got, want = tree(mnt), tree(gcs["source"])
            assert got.keys() == want.keys() and all(got[k] == want[k] for k in want), url
    r = subprocess.run([loosefs_bin(), "info", "gs://bkt/data.pack"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "gs://bkt/data.pack" in r.stdout, r.stderr


def test_loose_objects_on_gcs_read_their_own_bytes(gcs):
    with Mount("gs://bkt/names/", gcs["work"], *cache(gcs["work"]), env=gcs_env(gcs["server"], gcs["proxy"])) as mnt:
        assert sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*") if p.is_file()) == sorted(NAMES)
        for n in NAMES:
            assert (mnt / n).read_bytes() == content(n), n


def test_a_packed_format_on_gcs_shows_the_local_mounts_tree(gcs):
    env = gcs_env(gcs["server"], gcs["proxy"])
    local = gcs["work"] / "local-wds"
    local.mkdir()
    subprocess.run([loosefs_bin(), "mount", str(gcs["wds"]), str(local)], check=True, timeout=300)
    try:
        with Mount("gs://bkt/wds/", gcs["work"], *cache(gcs["work"]), env=env) as mnt:
            got, want = tree(mnt), tree(local)
            assert got.keys() == want.keys() and all(got[k] == want[k] for k in want)
    finally:
        subprocess.run([loosefs_bin(), "umount", str(local)], check=True, timeout=60)


def test_an_object_replaced_on_gcs_answers_estale_for_itself_only(gcs):
    server = gcs["server"]
    server.put("bkt", "swap/a.txt", b"first a")
    server.put("bkt", "swap/b.txt", b"first b")
    with Mount("gs://bkt/swap/", gcs["work"], *cache(gcs["work"]), env=gcs_env(server, gcs["proxy"])) as mnt:
        server.put("bkt", "swap/a.txt", b"second!")
        with pytest.raises(OSError) as e:
            (mnt / "a.txt").read_bytes()
        assert e.value.errno == errno.ESTALE
        assert (mnt / "b.txt").read_bytes() == b"first b"


def replaced_while_read(work, env, url, put, pack, source):
    """A pack replaced after part of it was read and cached, and a 24 MiB object replaced in
    the middle of its read, under the prefix `url` that `put` (name below it, bytes) writes
    to: every read answers the mounted version's bytes or ESTALE, never a mix and never the
    new version's."""
    import hashlib
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    data = pack.read_bytes()
    put("replaced.pack", data)
    quiet = ("--prefetch-max-mb", "0", "--push-ahead", "0", "--read-ahead-kb", "0")
    with Mount(url + "replaced.pack", work, *cache(work), *quiet, env=env) as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        other = bytearray(data)
        other[len(other) // 2] ^= 1
        put("replaced.pack", bytes(other))
        stale = 0
        for rel in files:
            try:
                got = (mnt / rel).read_bytes()
            except OSError as e:
                assert e.errno == errno.ESTALE, (rel, e)
                stale += 1
                continue
            assert got == (source / rel).read_bytes(), f"{rel}: mixed or new bytes"
        assert stale >= 1, "nothing answered ESTALE: the new version was never seen"
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes(), "the cached part"
    old, new = os.urandom(24 << 20), os.urandom(24 << 20)
    put("big/big.bin", old)
    with Mount(url + "big/", work, *cache(work), *quiet, env=env) as mnt:
        got = bytearray()
        try:
            with open(mnt / "big.bin", "rb", buffering=0) as f:
                got += f.read(4 << 20)
                put("big/big.bin", new)
                while chunk := f.read(1 << 20):
                    got += chunk
            assert hashlib.sha256(got).digest() == hashlib.sha256(old).digest(), "mixed or new bytes"
        except OSError as e:
            assert e.errno == errno.ESTALE, e
            assert got == old[:len(got)], "bytes before the ESTALE were not the mounted version's"


def test_an_object_replaced_on_gcs_while_read_and_cached_answers_its_old_bytes_or_estale(gcs):
    """fake-gcs-server ignores If-Match and generation preconditions: what holds the pin here is
    each answer's ETag (the object's MD5) and size compared with the mounted version's, as for
    a server that ignores If-Match (test_remote's `ignored` case)."""
    server = gcs["server"]
    pack = gcs["work"] / "data" / "bkt" / "data.pack"
    replaced_while_read(gcs["work"], gcs_env(server, gcs["proxy"]), "gs://bkt/swap2/",
                        lambda name, data: server.put("bkt", "swap2/" + name, data), pack, gcs["source"])


def test_without_credentials_a_gcs_mount_fails_at_once_naming_what_was_looked_for(gcs, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR"))}
    # The metadata server at a closed local port (by name and by address); no ADC file here.
    env.update(GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9", HOME=str(tmp_path))
    m = Mount("gs://bkt/data.pack", tmp_path, *cache(tmp_path), "--retries", "0", env=env, check=False)
    assert m.r.returncode != 0, m.r.stdout
    assert "no GCS credentials" in m.r.stderr and "STORAGE_EMULATOR_HOST" in m.r.stderr, m.r.stderr


def test_an_outage_on_gcs_shorter_than_the_retry_timeout_costs_no_read(gcs):
    # Connections refused and open ones dropped for 10 s mid-epoch (the outage under test, not a
    # wait for something to happen): readers wait through the retries and get every byte.
    source, proxy = gcs["source"], gcs["proxy"]
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    with Mount("gs://bkt/loose/", gcs["work"], *cache(gcs["work"]), "--retry-timeout", "60",
               env=gcs_env(gcs["server"], proxy)) as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        errors = epoch_through_outage(mnt, source, files[1:200], proxy, 10)
        assert errors == [], errors[:5]


def test_object_names_no_path_can_hold_are_left_out_and_the_rest_served(gcs):
    # GCS stores these names verbatim; they are left out of the listing (GCS's XML listing
    # is ListObjectsV2's), each said once. (A control character is not tried here:
    # fake-gcs-server stores it as U+FFFD.)
    server = gcs["server"]
    for k in ["hostile/a//b.txt", "hostile/d//e.txt"]:
        server.put("bkt", k, b"x")
    server.put("bkt", "hostile/ok é.txt", b"fine")
    m = Mount("gs://bkt/hostile/", gcs["work"], *cache(gcs["work"]), env=gcs_env(server, gcs["proxy"]))
    with m as mnt:
        assert sorted(p.name for p in mnt.rglob("*")) == ["ok é.txt"]
        assert (mnt / "ok é.txt").read_bytes() == b"fine"
    said = [line for line in m.r.stderr.splitlines() if "left out of the listing" in line]
    for k in ['"hostile/a//', '"hostile/d//']:  # the object, or its common prefix
        assert sum(f"key {k}" in line for line in said) == 1, m.r.stderr
