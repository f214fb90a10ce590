"""Foreign datasets at URLs (issue 22): the formats' own writers' output (../shared/data/formats)
uploaded to SeaweedFS (S3) and served by nginx (HTTPS with a private CA), mounted by URL and
compared file for file, byte for byte, with the mount of the local copy. Requests are counted
by the fault proxy before SeaweedFS."""
import errno
import os
import json
import pathlib
import random
import shutil
import subprocess
import time

import pytest

from conftest import loosefs_bin, need_mount
import servers
from test_formats import CASES, FORMATS, manifest  # noqa: F401  (manifest: a fixture)
from test_remote import Mount, files_of, s3_env

# name: (s3 URL under the bucket, https path under nginx's root)
URLS = {
    "mds": ("mds/", "mds/"),
    "litdata": ("litdata/", "litdata/"),
    "webdataset": ("webdataset/", "webdataset/shard-{000000..000002}.tar"),
    "tfrecord": ("tfrecord/", "tfrecord/train-00000-of-00001"),
    "zip": ("zip/images.zip", "zip/images.zip"),
    "ffcv": ("ffcv/jpg.beton", "ffcv/jpg.beton"),
    "hf-parquet": ("hf-parquet/", "hf-parquet/train-00000-of-00001.parquet"),
}


@pytest.fixture(scope="module")
def sets(manifest, tmp_path_factory):  # noqa: F811
    """SeaweedFS holding every format under s3://packs/<name>/, nginx serving the same files,
    a proxy before SeaweedFS, and each format's local mount (the reference)."""
    need_mount()
    if shutil.which("nginx") is None:
        pytest.fail("nginx not installed (scripts/setup.sh installs nginx-light)")
    work = tmp_path_factory.mktemp("remote-formats")
    www = work / "www"
    www.mkdir()
    for name in URLS:
        src = FORMATS / CASES[name][0]
        top = src if src.is_dir() else src.parent
        shutil.copytree(top, www / top.name, dirs_exist_ok=True)
    weed = servers.Seaweed(work / "weed")
    nginx = servers.Nginx(work / "nginx", www)
    local = {}
    try:
        weed.start()
        nginx.start()
        for p in sorted(www.rglob("*")):
            if p.is_file():
                weed.put(str(p.relative_to(www)), p)
        proxy = servers.FaultProxy(weed.port).start()
        for name in URLS:
            mnt = work / f"local-{name}"
            mnt.mkdir()
            subprocess.run([loosefs_bin(), "mount", str(FORMATS / CASES[name][0]), str(mnt), "--index-dir",
                            str(work / "local-index"), "--log", str(work / f"local-{name}.log")],
                           check=True, timeout=300)
            local[name] = mnt
        yield dict(work=work, www=www, weed=weed, nginx=nginx, proxy=proxy, local=local)
    finally:
        for mnt in local.values():
            subprocess.run([loosefs_bin(), "umount", str(mnt)], timeout=120)
        weed.stop()
        nginx.stop()


def s3(sets, *extra, cache=None, index=None):
    w = sets["work"]
    return ["--endpoint-url", f"http://127.0.0.1:{sets['proxy'].port}", "--allow-http", "--cache-size", "1G",
            "--cache-dir", str(cache or w / f"cache{random.randrange(1 << 30)}"),
            "--index-dir", str(index or w / f"index{random.randrange(1 << 30)}"), *extra]


def https(sets):
    w = sets["work"]
    return ["--ca-bundle", str(sets["nginx"].ca), "--cache-size", "1G",
            "--cache-dir", str(w / f"cache{random.randrange(1 << 30)}"),
            "--index-dir", str(w / f"index{random.randrange(1 << 30)}")]


def assert_same(mnt, ref):
    a, b = files_of(ref), files_of(mnt)
    assert a == b and len(a) > 0
    for rel in a:
        assert (mnt / rel).read_bytes() == (ref / rel).read_bytes(), rel


@pytest.mark.parametrize("name", sorted(URLS))
def test_each_format_over_s3_and_https_shows_the_local_mounts_tree(sets, name):
    s3_url, http_path = URLS[name]
    with Mount(f"s3://packs/{s3_url}", sets["work"], *s3(sets)) as mnt:
        assert_same(mnt, sets["local"][name])
    url = f"https://127.0.0.1:{sets['nginx'].tls_port}/{http_path}"
    with Mount(url, sets["work"], *https(sets)) as mnt:
        assert_same(mnt, sets["local"][name])


def test_imagefolder_over_s3_equals_the_local_mount(sets):
    import torchvision
    from test_loaders import rel

    with Mount("s3://packs/mds/", sets["work"], *s3(sets)) as mnt:
        ref = sets["local"]["mds"]
        a, b = torchvision.datasets.ImageFolder(str(ref)), torchvision.datasets.ImageFolder(str(mnt))
        assert b.class_to_idx == a.class_to_idx and rel(b.samples, mnt) == rel(a.samples, ref)
        for (pa, _), (pb, _) in zip(a.samples, b.samples):
            assert pathlib.Path(pb).read_bytes() == pathlib.Path(pa).read_bytes()


def test_an_s3_mount_with_the_kept_index_makes_one_request_before_its_first_read(sets):
    proxy, w = sets["proxy"], sets["work"]
    index = w / "index-kept"
    n0 = proxy.requests
    with Mount("s3://packs/mds/", w, *s3(sets, index=index)) as mnt:
        assert_same(mnt, sets["local"]["mds"])
    first = proxy.requests - n0
    # A fresh cache: the kept index spares the scan, and the listing pins every object (size
    # and ETag), so the LIST is the only request before the first read.
    n1 = proxy.requests
    with Mount("s3://packs/mds/", w, *s3(sets, index=index)) as mnt:
        opened = proxy.requests - n1
        assert_same(mnt, sets["local"]["mds"])
    assert opened == 1, (first, opened)
    assert first > 1


def test_a_replaced_shard_answers_estale_for_its_samples_only(sets):
    w, www, weed = sets["work"], sets["www"], sets["weed"]
    tmp = w / "replaced"
    shutil.copytree(www / "webdataset", tmp)
    for p in sorted(tmp.iterdir()):
        weed.put(f"replaced/{p.name}", p)
    index = w / "index-replaced"
    with Mount("s3://packs/replaced/", w, *s3(sets, index=index)) as mnt:
        files = files_of(mnt)
    # Mounted again with a fresh cache (nothing cached), then shard 1 replaced on the server.
    m = Mount("s3://packs/replaced/", w, *s3(sets, "--prefetch-max-mb", "0", "--push-ahead", "0", index=index))
    import tarfile
    with tarfile.open(tmp / "shard-000001.tar") as t:
        in_shard = {pathlib.PurePath(n).name for n in t.getnames()}
    with m as mnt:
        data = bytearray((tmp / "shard-000001.tar").read_bytes())
        data[len(data) // 2] ^= 1
        (tmp / "shard-000001.tar").write_bytes(data)
        weed.put("replaced/shard-000001.tar", tmp / "shard-000001.tar")
        ref = sets["local"]["webdataset"]
        stale, ok = set(), 0
        for rel in files:
            try:
                b = (mnt / rel).read_bytes()
            except OSError as e:
                assert e.errno == errno.ESTALE, (rel, e)
                stale.add(rel)
                continue
            assert b == (ref / rel).read_bytes(), rel
            ok += 1
        # Exactly the replaced shard's samples (its members, by name) answer ESTALE.
        expected = {rel for rel in files if pathlib.PurePath(rel).name in in_shard}
        assert expected and stale == expected, (sorted(stale)[:5], sorted(expected)[:5])
        assert ok == len(files) - len(expected)
    assert "REPLACED" in m.log.read_text()


def test_missing_objects_and_unlistable_https_directories_fail_clearly(sets):
    w = sets["work"]
    r = subprocess.run([loosefs_bin(), "info", "s3://packs/nothing-here/", *s3(sets)], env=s3_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no objects under this prefix" in r.stderr, r.stderr
    url = f"https://127.0.0.1:{sets['nginx'].tls_port}/webdataset/"
    r = subprocess.run([loosefs_bin(), "info", url, *https(sets)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "brace pattern" in r.stderr, r.stderr
    url = f"https://127.0.0.1:{sets['nginx'].tls_port}/webdataset/shard-{{000000..000009}}.tar"
    r = subprocess.run([loosefs_bin(), "info", url, *https(sets)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "shard-000003.tar" in r.stderr and "404" in r.stderr, r.stderr


def test_pack_of_a_remote_dataset_gives_the_local_mounts_tree(sets):
    w = sets["work"]
    out = w / "from-s3.pack"
    r = subprocess.run([loosefs_bin(), "pack", "s3://packs/webdataset/", str(out), *s3(sets)], env=s3_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    mnt = w / "packed-from-s3"
    mnt.mkdir()
    subprocess.run([loosefs_bin(), "mount", str(out), str(mnt)], check=True, timeout=120)
    try:
        assert_same(mnt, sets["local"]["webdataset"])
    finally:
        subprocess.run([loosefs_bin(), "umount", str(mnt)], timeout=120)


def index_cmd(url, *args):
    return subprocess.run([loosefs_bin(), "index", url, *args], env=s3_env(), capture_output=True, text=True,
                          timeout=300)


def test_a_shared_index_on_s3_mounts_a_dataset_in_two_requests_and_a_stale_one_is_refused(sets):
    w, weed, proxy = sets["work"], sets["weed"], sets["proxy"]
    src = sets["www"] / "mds"
    for p in sorted(src.iterdir()):
        weed.put(f"shared-mds/{p.name}", p)
    url = "s3://packs/shared-mds/"
    r = index_cmd(url, *s3(sets))
    assert r.returncode == 0 and f"{url}.loosefs-index" in r.stdout, r.stderr
    # Another node: fresh index directory and cache. The LIST finds the objects and the index,
    # one GET brings the index; nothing else before the first read.
    n0 = proxy.requests
    with Mount(url, w, *s3(sets)) as mnt:
        opened = proxy.requests - n0
        assert_same(mnt, sets["local"]["mds"])
    assert opened == 2, opened
    # A shard replaced on the server: the index is stale and the mount says which shard.
    data = bytearray((src / "shard.00001.mds").read_bytes())
    data[-1] ^= 1
    changed = w / "shard.00001.mds"
    changed.write_bytes(bytes(data))
    weed.put("shared-mds/shard.00001.mds", changed)
    r = subprocess.run([loosefs_bin(), "info", url, *s3(sets)], env=s3_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "is stale" in r.stderr and "shard.00001.mds changed" in r.stderr, r.stderr
    # Indexed again, it serves the new bytes.
    assert index_cmd(url, *s3(sets)).returncode == 0
    with Mount(url, w, *s3(sets)) as mnt:
        assert len(files_of(mnt)) == len(files_of(sets["local"]["mds"]))


def test_a_shared_index_over_https_is_the_only_request_before_the_first_read(sets):
    w, www = sets["work"], sets["www"]
    shutil.copytree(www / "litdata", www / "shared-litdata")
    url = f"https://127.0.0.1:{sets['nginx'].tls_port}/shared-litdata/"
    r = index_cmd(url, *https(sets))
    assert r.returncode != 0 and "--out PATH" in r.stderr, r.stderr
    r = index_cmd(url, "--out", str(www / "shared-litdata" / ".loosefs-index"), *https(sets))
    assert r.returncode == 0, r.stderr
    r = subprocess.run([loosefs_bin(), "info", url, *https(sets)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "requests:      1 GET(s)" in r.stdout, r.stdout + r.stderr
    with Mount(url, w, *https(sets)) as mnt:
        assert_same(mnt, sets["local"]["litdata"])
    # Named with options it was not built with: refused, saying so.
    r = subprocess.run([loosefs_bin(), "info", url, "--verify", "full", "--index", f"{url}.loosefs-index",
                        *https(sets)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "other options" in r.stderr, r.stderr


def test_offline_mounts_a_remote_dataset_from_its_whole_block_caches_without_a_request(sets):
    w, proxy = sets["work"], sets["proxy"]
    cache, index = w / "cache-offline", w / "index-offline"
    # Online once: indexing downloads every shard into its block cache; unmounting closes it.
    with Mount("s3://packs/webdataset/", w, *s3(sets, cache=cache, index=index)):
        pass
    n0 = proxy.requests
    with Mount("s3://packs/webdataset/", w, *s3(sets, "--offline", cache=cache, index=index)) as mnt:
        assert_same(mnt, sets["local"]["webdataset"])
        st = json.loads(subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True, text=True,
                                       check=True, timeout=60).stdout)
        assert st["remote"]["offline"] is True and st["remote"]["gets"] == 0, st["remote"]
    assert proxy.requests == n0
    # A node whose caches do not hold the shards: refused, saying what to do.
    r = subprocess.run([loosefs_bin(), "info", "s3://packs/webdataset/", *s3(sets, "--offline", index=index)],
                       env=s3_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "shard-000000.tar: no block cache" in r.stderr and "warm" in r.stderr, r.stderr
    r = subprocess.run([loosefs_bin(), "info", "s3://packs/litdata/", *s3(sets, "--offline")], env=s3_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "never mounted it online" in r.stderr, r.stderr
    assert proxy.requests == n0


def test_compressed_datasets_over_s3_and_https_show_the_local_mounts_tree(sets):
    """zstd MDS shards, LitData zstd chunks, a deflated zip and Snappy Parquet (write_formats.py,
    the formats' own writers): chunks decompressed from the objects' block caches."""
    import sys

    w, weed, www = sets["work"], sets["weed"], sets["www"]
    out = w / "written"
    from test_formats import SAMPLES
    subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("write_formats.py")), str(SAMPLES), str(out)],
                   check=True, capture_output=True, timeout=600)
    cases = {"mds-zstd": ("mds-zstd/", "mds-zstd/"), "litdata-zstd": ("litdata-zstd/", "litdata-zstd/"),
             "zip-deflated.zip": ("zip-deflated.zip", "zip-deflated.zip"),
             "hf-parquet-snappy": ("hf-parquet-snappy/", "hf-parquet-snappy/train.parquet")}
    for name, (key, http_path) in cases.items():
        src = out / name
        files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
        for p in files:
            rel = p.relative_to(out)
            weed.put(f"written/{rel}", p)
            (www / "written" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, www / "written" / rel)
        ref = w / f"local-written-{name}"
        ref.mkdir()
        subprocess.run([loosefs_bin(), "mount", str(src), str(ref), "--index-dir", str(w / "local-index")],
                       check=True, timeout=300)
        try:
            with Mount(f"s3://packs/written/{key}", w, *s3(sets)) as mnt:
                assert_same(mnt, ref)
            url = f"https://127.0.0.1:{sets['nginx'].tls_port}/written/{http_path}"
            with Mount(url, w, *https(sets)) as mnt:
                assert_same(mnt, ref)
        finally:
            subprocess.run([loosefs_bin(), "umount", str(ref)], timeout=120)


def test_an_outage_during_a_read_of_a_shared_index_mount_then_dali_reads_the_local_tree(sets):
    import numpy as np
    from test_loaders import dali_epoch

    w, weed, proxy = sets["work"], sets["weed"], sets["proxy"]
    for p in sorted((sets["www"] / "webdataset").iterdir()):
        weed.put(f"outage-wds/{p.name}", p)
    url = "s3://packs/outage-wds/"
    assert index_cmd(url, *s3(sets)).returncode == 0
    ref = sets["local"]["webdataset"]
    files = files_of(ref)
    with Mount(url, w, *s3(sets, "--retries", "2", "--retry-timeout", "5", "--request-timeout", "5",
                           "--prefetch-max-mb", "0", "--push-ahead", "0")) as mnt:
        assert (mnt / files[0]).read_bytes() == (ref / files[0]).read_bytes()
        proxy.set(down=True)
        try:
            with pytest.raises(OSError) as e:
                (mnt / files[-1]).read_bytes()
            assert e.value.errno == errno.EIO
        finally:
            proxy.set(down=False)
        # Back: the same file reads right, and DALI's file reader sees the local mount's samples.
        assert (mnt / files[-1]).read_bytes() == (ref / files[-1]).read_bytes()
        ia, la = dali_epoch(ref)
        ib, lb = dali_epoch(mnt)
        assert la == lb and len(la) == len(files)
        assert all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(ia, ib))


def test_datasets_uploaded_by_the_formats_own_writers_mount_like_their_local_copies(sets):
    """MDSWriter's own upload (`out=(local, s3://…)`) and LitData's `optimize` to s3://
    (upload_formats.py): the mount of the uploaded prefix = the local mount of the same files."""
    import sys

    w, weed = sets["work"], sets["weed"]
    from test_formats import SAMPLES
    local = w / "uploaded-local"
    r = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("upload_formats.py")), str(SAMPLES),
                        str(local), f"http://127.0.0.1:{weed.port}", "packs"], env=s3_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    # LitData kept no local copy: the uploaded objects, downloaded, are the reference's files.
    c = weed.client()
    for o in c.list_objects_v2(Bucket="packs", Prefix="litdata-upload/")["Contents"]:
        dst = local / "litdata" / o["Key"].split("/", 1)[1]
        dst.parent.mkdir(parents=True, exist_ok=True)
        c.download_file("packs", o["Key"], str(dst))
    for name in ["mds", "litdata"]:
        ref = w / f"local-uploaded-{name}"
        ref.mkdir()
        subprocess.run([loosefs_bin(), "mount", str(local / name), str(ref), "--index-dir", str(w / "local-index")],
                       check=True, timeout=300)
        try:
            with Mount(f"s3://packs/{name}-upload/", w, *s3(sets)) as mnt:
                assert_same(mnt, ref)
                classes = sorted(p for p in SAMPLES.iterdir() if p.is_dir())[:12]
                assert len(files_of(mnt)) == sum(len(list(d.iterdir())) for d in classes)
        finally:
            subprocess.run([loosefs_bin(), "umount", str(ref)], timeout=120)


def remote_stats(mnt):
    out = subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return json.loads(out)["remote"]


@pytest.mark.parametrize("rel", ["zip/images.zip", "ffcv/jpg.beton", "ffcv/raw.beton"])
def test_a_zip_or_ffcv_file_at_a_url_is_indexed_from_its_tables_alone(sets, rel):
    """Mounting fetches the object's first block and the blocks of its last 64 KiB (where the
    central directory, or the metadata and allocation tables, lie: at most 3 blocks of these
    sets), not its samples; the tree is the local mount's
    all the same (raw FFCV images behind their PPM headers too), every member checked against
    its CRC-32 as it is served. Decoded views need every JPEG's dimensions: such a mount reads
    the whole object first."""
    w, size = sets["work"], (sets["www"] / rel).stat().st_size
    block = 1 << 20
    assert size > 3 * block + (1 << 16), "the set must span more blocks than the tables need"
    ref = w / f"local-tables-{rel.replace('/', '-')}"
    ref.mkdir(exist_ok=True)
    subprocess.run([loosefs_bin(), "mount", str(FORMATS / rel), str(ref), "--index-dir", str(w / "local-index"),
                    "--log", str(w / f"{ref.name}.log")], check=True, timeout=300)
    try:
        with Mount(f"s3://packs/{rel}", w, *s3(sets)) as mnt:
            opened = remote_stats(mnt)["bytes_received"]
            assert 0 < opened <= 3 * block, (opened, size)
            assert_same(mnt, ref)
        with Mount(f"s3://packs/{rel}", w, *s3(sets), "--decode", "npy") as mnt:
            assert remote_stats(mnt)["bytes_received"] >= size
            views = [p for p in files_of(mnt) if p.suffix == ".npy"]
            assert len(views) == len(files_of(ref)) > 0
        with Mount(f"https://127.0.0.1:{sets['nginx'].tls_port}/{rel}", w, *https(sets)) as mnt:
            assert remote_stats(mnt)["bytes_received"] <= 3 * block
            assert_same(mnt, ref)
        # `info` opens a URL as a mount does, and says the JPEG headers were not read.
        r = subprocess.run([loosefs_bin(), "info", f"s3://packs/{rel}", *s3(sets), "--json"], env=s3_env(),
                           capture_output=True, text=True, timeout=120, check=True)
        i = json.loads(r.stdout)
        assert i["verify"] == "table" and i["samples"] == len(files_of(ref)), i
        r = subprocess.run([loosefs_bin(), "info", f"s3://packs/{rel}", *s3(sets)], env=s3_env(),
                           capture_output=True, text=True, timeout=120, check=True)
        assert "JPEG headers not read" in r.stdout, r.stdout
    finally:
        subprocess.run([loosefs_bin(), "umount", str(ref)], timeout=120)


@pytest.mark.parametrize("name", ["../escape.mds", "/etc/escape.mds", "a//b.mds", "../../../../tmp/escape.mds"])
def test_an_index_json_naming_objects_outside_the_dataset_is_refused_and_nothing_written_outside(sets, name):
    """An HTTPS directory whose MDS index.json names a shard outside the dataset: loosefs checks
    the name itself (whatever the object client's path parser accepts) and refuses before any
    GET of it or any file under its name."""
    w = sets["work"]
    evil = sets["www"] / f"evil{random.randrange(1 << 30)}"
    evil.mkdir()
    (evil / "index.json").write_text(json.dumps(
        {"version": 2, "shards": [{"raw_data": {"basename": name, "bytes": 10}, "samples": 1}]}))
    args = https(sets)
    cache, index = pathlib.Path(args[args.index("--cache-dir") + 1]), pathlib.Path(args[args.index("--index-dir") + 1])
    before = set(p for p in w.rglob("*"))
    url = f"https://127.0.0.1:{sets['nginx'].tls_port}/{evil.name}/"
    r = subprocess.run([loosefs_bin(), "info", url, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "outside the dataset" in r.stderr and name in r.stderr, r.stderr
    # Nothing new anywhere under the work directory but the cache and index directories (and
    # the servers' own state, which they write as they please).
    own = (cache, index, w / "weed", w / "nginx")
    new = [p for p in set(w.rglob("*")) - before if not any(o == p or o in p.parents for o in own)]
    assert new == [], new
    assert not pathlib.Path("/tmp/escape.mds").exists() and not pathlib.Path("/etc/escape.mds").exists()


def test_a_first_mount_by_url_reports_its_download_and_indexing_as_progress_lines(sets):
    """`mount s3://… --progress-lines`: the daemon, which opens a URL, reports on the launcher's
    stderr (what the Python package's tqdm bars read) the download of every shard into the
    block cache, then every sample indexed, each step ending at its total; then it serves."""
    w = sets["work"]
    mnt = w / "progress-mnt"
    mnt.mkdir()
    r = subprocess.run([loosefs_bin(), "mount", "s3://packs/webdataset/", str(mnt), "--progress-lines",
                        "--log", str(w / "progress.log"), *s3(sets)],
                       env=s3_env(), capture_output=True, text=True, timeout=300)
    try:
        assert r.returncode == 0, r.stderr
        objs = [json.loads(x) for x in r.stderr.splitlines() if x.startswith("{")]
        ends = {o["progress"]["step"]: o["progress"] for o in objs if o.get("progress", {}).get("end")}
        shards = sum(p.stat().st_size for p in (sets["www"] / "webdataset").glob("*.tar"))
        assert ends["download"]["done"] == ends["download"]["total"] == shards, ends
        assert ends["index"]["done"] == ends["index"]["total"] == 48, ends
        assert any("downloading 3 objects" in o.get("note", "") for o in objs), objs
        assert_same(mnt, sets["local"]["webdataset"])
    finally:
        subprocess.run([loosefs_bin(), "umount", str(mnt)], timeout=120)


def _commands() -> dict:
    """Every process's command line, by pid."""
    out = {}
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                pass
    return out


def test_a_mount_interrupted_before_ready_is_taken_down_by_its_daemon(sets):
    """Ctrl-C of `loosefs mount` while its daemon still opens the source (here: its first
    request held at the proxy): the daemon, finding nobody waiting for `ready` (and its stderr
    a broken pipe), unmounts and exits instead of serving a mount nobody asked for."""
    w, proxy = sets["work"], sets["proxy"]
    mnt = w / "interrupted-mnt"
    mnt.mkdir()
    log = w / "interrupted.log"
    proxy.set(hold=True)
    try:
        launcher = subprocess.Popen([loosefs_bin(), "mount", "s3://packs/mds/", str(mnt), "--progress-lines",
                                     "--log", str(log), *s3(sets)], env=s3_env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while proxy.held == 0 and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.held > 0, "the daemon's first request never reached the proxy"
        daemons = [pid for pid, cmd in _commands().items() if str(mnt) in cmd and "--foreground" in cmd]
        assert len(daemons) == 1, daemons
        launcher.kill()
        launcher.wait(30)
        launcher.stderr.close()
    finally:
        proxy.set(hold=False)
    deadline = time.monotonic() + 120
    while pathlib.Path(f"/proc/{daemons[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pathlib.Path(f"/proc/{daemons[0]}").exists(), "the daemon still runs"
    assert not os.path.ismount(mnt)
    assert "ended before" in log.read_text() and "panicked" not in log.read_text(), log.read_text()[-1500:]
