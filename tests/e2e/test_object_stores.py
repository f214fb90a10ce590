"""The cloud object stores, each against its own real emulator on 127.0.0.1 and reached as its own
tools reach that emulator, every case run on every store (`store` is parametrized: a new store is
one fixture in `STORES`):

- Google Cloud Storage (`gs://BUCKET/KEY`) on fake-gcs-server, through `STORAGE_EMULATOR_HOST`;
- Azure Blob Storage (`az://CONTAINER/KEY`, `abfs://…`, `https://ACCOUNT.blob.core.windows.net/…`)
  on Azurite (Microsoft's emulator, from npm: scripts/azurite.sh), through
  `AZURE_STORAGE_CONNECTION_STRING` only.

A pack in each URL form, a prefix of loose objects (non-ASCII and URL-special names) and a packed
format's shards mount byte-identical to their local copies; an object replaced while mounted
answers ESTALE for itself; one replaced while read and cached answers its old bytes or ESTALE;
an outage shorter than `--retry-timeout` costs no read; the shared listing mounts a second node
in two requests; a pack written by `loosefs pack` mounts byte-identical; names no path can hold
are left out; without credentials the mount fails at once saying where they are given (GCS: the
metadata server pointed at a closed local port, so no request leaves the machine). S3 has its
own, larger file (test_remote.py, on SeaweedFS and moto)."""
import dataclasses
import errno
import hashlib
import os
import pathlib
import random
import shutil
import subprocess
from typing import Callable

import pytest

from conftest import DATA, loosefs_bin, missing_prerequisite, need_mount
import servers
from test_remote import Mount, epoch_through_outage

NAMES = ["café.txt", "数据.txt", "50%off.txt", "a%20b.txt", "a b.txt", "x#y.txt", "sub dir/é.txt"]


def content(name: str) -> bytes:
    return (name.encode() * 64)[:64] + b"|" + name.encode().ljust(64, b".")[:64]


@dataclasses.dataclass
class Store:
    """One object store under test, seeded with `data.pack`, `names/` (NAMES), `wds/` (a
    WebDataset's shards) and `loose/` (the source tree)."""
    name: str
    #: The URL of `key` in the test bucket or container, in the store's own scheme.
    url: Callable[[str], str]
    #: Every URL form of `data.pack`.
    pack_urls: list
    #: Writes `data` at `key`.
    put: Callable[[str, bytes], None]
    #: The environment of a user of this emulator, through the fault proxy.
    env: dict
    #: The environment of a user with no credentials at all (`HOME` given), and what the
    #: refusal must say.
    no_credentials: Callable[[pathlib.Path], dict]
    says_without: tuple
    #: Whether the emulator takes loosefs's uploads (fake-gcs-server has no XML API upload,
    #: which object_store's GCS client uses: fsouza/fake-gcs-server#331, open).
    uploads: bool
    #: Whether an object is at `key`.
    has: Callable[[str], bool]
    proxy: object
    work: pathlib.Path
    source: pathlib.Path
    wds: pathlib.Path


def without(prefixes: tuple) -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def gcs(work: pathlib.Path, pack: pathlib.Path, source: pathlib.Path, wds: pathlib.Path):
    """fake-gcs-server started with its defaults (no `-public-host`: its XML API answers no
    one here), seeded from a directory before it starts; clients come through a fault proxy."""
    bucket = work / "data" / "bkt"
    bucket.mkdir(parents=True)
    shutil.copyfile(pack, bucket / "data.pack")
    for n in NAMES:
        (bucket / "names" / n).parent.mkdir(parents=True, exist_ok=True)
        (bucket / "names" / n).write_bytes(content(n))
    shutil.copytree(wds, bucket / "wds")
    shutil.copytree(source, bucket / "loose")
    server = servers.FakeGcs(work, work / "data").start()
    proxy = servers.FaultProxy(server.port).start()
    env = without(("GOOGLE_", "STORAGE_EMULATOR"))
    env["STORAGE_EMULATOR_HOST"] = f"127.0.0.1:{proxy.port}"

    def no_credentials(home: pathlib.Path) -> dict:
        # The metadata server at a closed local port (by name and by address); no ADC file.
        return {**without(("GOOGLE_", "STORAGE_EMULATOR")), "GCE_METADATA_HOST": "127.0.0.1:9",
                "GCE_METADATA_IP": "127.0.0.1:9", "HOME": str(home)}

    store = Store(
        name="gcs", url=lambda key: f"gs://bkt/{key}",
        # gs:// and the console's public URL form, both to the emulator.
        pack_urls=["gs://bkt/data.pack", "https://storage.googleapis.com/bkt/data.pack"],
        put=lambda key, data: server.put("bkt", key, data), env=env,
        no_credentials=no_credentials, says_without=("no GCS credentials", "STORAGE_EMULATOR_HOST"),
        uploads=False, has=lambda key: server.exists("bkt", key), proxy=proxy, work=work, source=source, wds=wds)
    return store, [proxy, server]


def azure(work: pathlib.Path, pack: pathlib.Path, source: pathlib.Path, wds: pathlib.Path):
    """Azurite, seeded with Microsoft's own blob client; clients come through a fault proxy
    named in the connection string."""
    binary = os.environ.get("LOOSEFS_AZURITE")
    if not binary or not os.access(binary, os.X_OK):
        missing_prerequisite("Azurite is not installed (scripts/azurite.sh; LOOSEFS_AZURITE unset)")
    server = servers.Azurite(work, binary).start()
    proxy = servers.FaultProxy(server.port).start()
    with open(pack, "rb") as f:
        server.container("data").upload_blob("data.pack", f, overwrite=True)
    for n in NAMES:
        server.put("data", "names/" + n, content(n))
    server.put_tree("data", "wds/", wds)
    server.put_tree("data", "loose/", source)
    env = without(("AZURE",))
    env["AZURE_STORAGE_CONNECTION_STRING"] = server.connection_string.replace(
        f":{server.port}/", f":{proxy.port}/")
    account = servers.Azurite.ACCOUNT
    store = Store(
        name="azure", url=lambda key: f"az://data/{key}",
        # az:// (fsspec's form), abfs:// with the account (Hadoop's), https:// (the portal's), the
        # last two naming the account the connection string also names.
        pack_urls=["az://data/data.pack", f"abfs://data@{account}.dfs.core.windows.net/data.pack",
                   f"https://{account}.blob.core.windows.net/data/data.pack"],
        put=lambda key, data: server.put("data", key, data), env=env,
        no_credentials=lambda home: {**without(("AZURE",)), "HOME": str(home)},
        says_without=("which Azure storage account", "AZURE_STORAGE_CONNECTION_STRING"),
        uploads=True, has=lambda key: server.container("data").get_blob_client(key).exists(), proxy=proxy, work=work, source=source, wds=wds)
    return store, [proxy, server]


#: Every store these tests run on: name -> a function of (work, pack, source, wds) giving the
#: seeded `Store` and what to stop afterwards.
STORES = {"gcs": gcs, "azure": azure}


@pytest.fixture(scope="module", params=sorted(STORES))
def store(request, tmp_path_factory, pack, source):
    need_mount()
    work = tmp_path_factory.mktemp(request.param)
    s, running = STORES[request.param](work, pack, source, DATA / "formats" / "webdataset")
    try:
        yield s
    finally:
        for r in running:
            r.stop()


def cache(work: pathlib.Path) -> list:
    """A block cache of the mount's own (`test_remote.Mount` leaves the default)."""
    return ["--cache-dir", str(work / f"cache{random.randrange(1 << 30)}")]


def tree(root: pathlib.Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def same_tree(got: pathlib.Path, want: pathlib.Path) -> bool:
    a, b = tree(got), tree(want)
    return a.keys() == b.keys() and all(a[k] == b[k] for k in b)


def test_a_pack_mounts_byte_identical_in_each_url_form_and_info_names_it(store):
    for url in store.pack_urls:
        with Mount(url, store.work, *cache(store.work), env=store.env) as mnt:
            assert same_tree(mnt, store.source), url
    url = store.url("data.pack")
    r = subprocess.run([loosefs_bin(), "info", url], env=store.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and url in r.stdout, r.stderr


def test_loose_objects_read_their_own_bytes(store):
    with Mount(store.url("names/"), store.work, *cache(store.work), env=store.env) as mnt:
        assert sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*") if p.is_file()) == sorted(NAMES)
        for n in NAMES:
            assert (mnt / n).read_bytes() == content(n), n


def test_a_packed_format_shows_the_local_mounts_tree(store):
    local = store.work / "local-wds"
    local.mkdir()
    subprocess.run([loosefs_bin(), "mount", str(store.wds), str(local)], check=True, timeout=300)
    try:
        with Mount(store.url("wds/"), store.work, *cache(store.work), env=store.env) as mnt:
            assert same_tree(mnt, local)
    finally:
        subprocess.run([loosefs_bin(), "umount", str(local)], check=True, timeout=60)


def test_an_object_replaced_answers_estale_for_itself_only(store):
    store.put("swap/a.txt", b"first a")
    store.put("swap/b.txt", b"first b")
    with Mount(store.url("swap/"), store.work, *cache(store.work), env=store.env) as mnt:
        store.put("swap/a.txt", b"second!")
        with pytest.raises(OSError) as e:
            (mnt / "a.txt").read_bytes()
        assert e.value.errno == errno.ESTALE
        assert (mnt / "b.txt").read_bytes() == b"first b"


def test_an_object_replaced_while_read_and_cached_answers_its_old_bytes_or_estale(store, pack):
    """A pack replaced after part of it was read and cached, and a 24 MiB object replaced in the
    middle of its read: every read answers the mounted version's bytes or ESTALE, never a mix and
    never the new version's. (Azurite honours If-Match, 412 for another ETag; fake-gcs-server
    ignores If-Match and generation preconditions, so there what holds the pin is each answer's
    ETag and size compared with the mounted version's, as for a server that ignores If-Match:
    test_remote's `ignored` case.)"""
    source = store.source
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    data = pack.read_bytes()
    store.put("swap2/replaced.pack", data)
    quiet = ("--prefetch-max-mb", "0", "--push-ahead", "0", "--read-ahead-kb", "0")
    with Mount(store.url("swap2/replaced.pack"), store.work, *cache(store.work), *quiet, env=store.env) as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        other = bytearray(data)
        other[len(other) // 2] ^= 1
        store.put("swap2/replaced.pack", bytes(other))
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
    store.put("swap2/big/big.bin", old)
    with Mount(store.url("swap2/big/"), store.work, *cache(store.work), *quiet, env=store.env) as mnt:
        got = bytearray()
        try:
            with open(mnt / "big.bin", "rb", buffering=0) as f:
                got += f.read(4 << 20)
                store.put("swap2/big/big.bin", new)
                while chunk := f.read(1 << 20):
                    got += chunk
            assert hashlib.sha256(got).digest() == hashlib.sha256(old).digest(), "mixed or new bytes"
        except OSError as e:
            assert e.errno == errno.ESTALE, e
            assert got == old[:len(got)], "bytes before the ESTALE were not the mounted version's"


def test_an_outage_shorter_than_the_retry_timeout_costs_no_read(store):
    # Connections refused and open ones dropped for 10 s mid-epoch (the outage under test, not a
    # wait for something to happen): readers wait through the retries and get every byte.
    source = store.source
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    with Mount(store.url("loose/"), store.work, *cache(store.work), "--retry-timeout", "60",
               env=store.env) as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        errors = epoch_through_outage(mnt, source, files[1:200], store.proxy, 10)
        assert errors == [], errors[:5]


def test_a_shared_listing_mounts_a_second_node_in_two_requests(store, tmp_path):
    url = store.url("loose/")
    # Uploaded by `loosefs index`, or written with --out and put there as a publisher would.
    out = [] if store.uploads else ["--out", str(tmp_path / "index")]
    done = subprocess.run([loosefs_bin(), "index", url, *out], env=store.env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    at = f"{url}.loosefs-index" if store.uploads else out[1]
    assert done.stdout.startswith(f"{at}: shared listing of {url}"), done.stdout
    if not store.uploads:
        store.put("loose/.loosefs-index", pathlib.Path(out[1]).read_bytes())
    r0 = store.proxy.requests
    with Mount(url, store.work, *cache(store.work), env=store.env) as mnt:
        assert store.proxy.requests - r0 <= 2, f"{store.proxy.requests - r0} requests to mount"
        assert same_tree(mnt, store.source)


def test_without_credentials_a_mount_fails_at_once_naming_where_they_are_given(store, tmp_path):
    m = Mount(store.url("data.pack"), tmp_path, *cache(tmp_path), "--retries", "0",
              env=store.no_credentials(tmp_path), check=False)
    assert m.r.returncode != 0, m.r.stdout
    assert all(s in m.r.stderr for s in store.says_without), m.r.stderr


def test_a_pack_written_by_loosefs_pack_mounts_byte_identical(store):
    """Where the emulator takes no upload, the refusal is said and nothing is left there."""
    url = store.url("written/train.pack")
    r = subprocess.run([loosefs_bin(), "pack", str(store.source), url], env=store.env,
                       capture_output=True, text=True, timeout=600)
    if not store.uploads:
        assert r.returncode != 0 and "the upload" in r.stderr, (r.returncode, r.stderr)
        assert not store.has("written/train.pack")
        return
    assert r.returncode == 0, r.stderr
    with Mount(url, store.work, *cache(store.work), env=store.env) as mnt:
        assert same_tree(mnt, store.source)


def test_names_no_path_can_hold_are_left_out_and_the_rest_served(store):
    # Both stores keep these names verbatim; one of them used to fail the listing of the whole
    # prefix (object_store refuses the page). Each is left out, said once in the log where the
    # listing runs (the mount command). (No control character: fake-gcs-server stores it as
    # U+FFFD, Azurite answers such a listing 500.)
    for k in ["hostile/a//b.txt", "hostile/d//e.txt"]:
        store.put(k, b"x")
    store.put("hostile/ok é.txt", b"fine")
    m = Mount(store.url("hostile/"), store.work, *cache(store.work), env=store.env)
    with m as mnt:
        assert sorted(p.name for p in mnt.rglob("*")) == ["ok é.txt"]
        assert (mnt / "ok é.txt").read_bytes() == b"fine"
    said = [line for line in m.r.stderr.splitlines() if "left out of the listing" in line]
    for k in ['"hostile/a//', '"hostile/d//']:  # the object, or its common prefix
        assert sum(f"key {k}" in line for line in said) == 1, m.r.stderr
