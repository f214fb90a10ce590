"""Datasets in other packed formats, written by each format's own writer
(../shared/data/formats, see its README and manifest.json: class i has label i), mounted by
loosefs and read by unmodified loaders: ImageFolder gets the manifest's classes and labels, every
file is byte-identical to its source where the writer kept the original bytes, and equals an
independent parse of the format (and the format's own reader, for GulpIO) where it re-encoded;
DALI reads every sample; `.npy` views equal Pillow; the second mount reuses the kept index;
`pack` gives the same tree; damaged inputs give a clear error or EIO, never wrong bytes."""
import hashlib
import json
import os
import pathlib
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torchvision
from PIL import Image

from conftest import DATA, ROOT, loosefs_bin, need_mount

FORMATS = DATA / "formats"
SAMPLES = DATA / "imagenet-sample"

# name: (source inside FORMATS, class directory naming, writer kept the original bytes)
CASES = {
    "webdataset": ("webdataset", "wnid", True),
    "zip": ("zip/images.zip", "wnid", True),
    "tfrecord": ("tfrecord", "wnid", True),
    "mds": ("mds", "wnid", True),
    "litdata": ("litdata", "number", True),
    "gulpio": ("gulpio", "wnid", False),
    "ffcv": ("ffcv/jpg.beton", "number", False),
    "hf-parquet": ("hf-parquet", "wnid", True),
}


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


@pytest.fixture(scope="module")
def manifest():
    if not (FORMATS / "manifest.json").is_file() or not SAMPLES.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {FORMATS} is missing: the format tests cannot run")
        pytest.skip(f"SKIPPED: {FORMATS} is missing")
    m = json.loads((FORMATS / "manifest.json").read_text())
    m["by_md5"] = {md5((SAMPLES / f).read_bytes()): f for f in m["files"]}
    return m


def run(*args, check=True, **kw):
    return subprocess.run([loosefs_bin(), *map(str, args)], check=check, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("formats")


@pytest.fixture(scope="module")
def mounts(manifest, work):
    need_mount()
    out = {}
    try:
        for name, (src, _, _) in CASES.items():
            mnt = work / f"mnt-{name}"
            mnt.mkdir()
            run("mount", FORMATS / src, mnt, "--index-dir", work / "index", "--log", work / f"{name}.log")
            out[name] = mnt
        yield out
    finally:
        for mnt in out.values():
            run("umount", mnt, check=False)


def image_root(name, mnt):
    # The zip holds `train/<wnid>/<file>`: its tree is shown as is.
    return mnt / "train" if name == "zip" else mnt


def gulpio_reference():
    """label index by md5 of each frame, from the .gmeta files parsed here (formats.md §2)."""
    d = FORMATS / "gulpio"
    l2i = json.loads((d / "label2idx.json").read_text())
    ref = {}
    for meta in sorted(d.glob("meta_*.gmeta")):
        data = (d / meta.name.replace("meta_", "data_").replace(".gmeta", ".gulp")).read_bytes()
        for item in json.loads(meta.read_text()).values():
            for loc, pad, length in item["frame_info"]:
                ref[md5(data[loc:loc + length - pad])] = l2i[item["meta_data"][0]["label"]]
    return ref


def ffcv_reference(path):
    """label by md5 of each JPEG, from the .beton parsed here with struct (formats.md §1)."""
    b = path.read_bytes()
    version, nf, _page, n, alloc = struct.unpack_from("<HHIQQ", b, 0)
    assert version == 2 and nf == 2
    types = [b[24 + i * 1041] for i in range(nf)]
    assert types == [2, 1], types  # RGBImageField, IntField
    meta = 24 + 1041 * nf
    sizes = {}
    for k in range(alloc, len(b) - 23, 24):
        _sid, ptr, size = struct.unpack_from("<QQQ", b, k)
        sizes[ptr] = size
    ref = {}
    for i in range(n):
        row = meta + 24 * i  # image metadata at 0 (13 bytes, packed), label at 16, row of 24
        mode, _w, _h, ptr = struct.unpack_from("<BHHQ", b, row)
        (label,) = struct.unpack_from("<q", b, row + 16)
        assert mode == 0
        ref[md5(b[ptr:ptr + sizes[ptr]])] = label
    return ref


@pytest.mark.parametrize("name", list(CASES))
def test_imagefolder_gets_the_formats_classes_labels_and_bytes(name, manifest, mounts):
    _src, naming, original = CASES[name]
    root = image_root(name, mounts[name])
    ds = torchvision.datasets.ImageFolder(str(root))
    if naming == "wnid":
        assert ds.classes == manifest["classes"]
    else:
        assert ds.classes == [f"{i:04d}" for i in range(48)]
    assert len(ds) == 48
    if name == "gulpio":
        ref = gulpio_reference()
    elif name == "ffcv":
        ref = ffcv_reference(FORMATS / CASES[name][0])
    for path, y in ds.samples:
        data = pathlib.Path(path).read_bytes()
        h = md5(data)
        if original:
            assert h in manifest["by_md5"], f"{path} is not byte-identical to any source file"
            want = manifest["classes"].index(manifest["by_md5"][h].split("/")[0])
        else:
            assert h in ref, f"{path} differs from the format's stored frame"
            want = ref[h]
        assert y == want, path
        with Image.open(path) as im:
            im.load()
            assert im.size[0] > 0


def test_gulpio_frames_equal_the_formats_own_reader(mounts):
    """gulpio2's GulpDirectory decodes each item with its own settings (simplejpeg, fast DCT and
    upsampling); the served file, decoded the same way, gives the same pixels."""
    import gulpio2  # python-env.sh installs it
    from gulpio2.utils import jpeg_bytes_to_img

    gd = gulpio2.GulpDirectory(str(FORMATS / "gulpio"))
    seen = 0
    for chunk in gd:
        for frames, meta in chunk:
            p = mounts["gulpio"] / meta["label"] / meta["id"]
            assert len(frames) == 1
            assert np.array_equal(jpeg_bytes_to_img(p.read_bytes()), frames[0]), p
            seen += 1
    assert seen == 48


@pytest.mark.parametrize("name", list(CASES))
def test_dali_reads_every_sample(name, mounts):
    from nvidia.dali import fn, pipeline_def, types

    root = image_root(name, mounts[name])

    @pipeline_def(batch_size=16, num_threads=2, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(root), random_shuffle=False, name="r")
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), labels

    p = pipe()
    p.build()
    assert p.epoch_size("r") == 48
    ds = torchvision.datasets.ImageFolder(str(root))
    labels = []
    while len(labels) < 48:
        im, lb = p.run()
        labels += [int(np.array(lb.at(k)).item()) for k in range(len(lb))]
        for k in range(len(im)):
            assert np.array(im.at(k)).shape[2] == 3
    assert labels[:48] == [y for _, y in ds.samples]


def test_npy_views_of_a_foreign_format_equal_pillow(manifest, work):
    need_mount()
    mnt = work / "mnt-npy"
    mnt.mkdir()
    run("mount", FORMATS / "tfrecord", mnt, "--decode", "npy", "--index-dir", work / "index")
    try:
        n = 0
        for c in sorted(os.listdir(mnt)):
            for f in sorted(os.listdir(mnt / c)):
                if not f.endswith(".npy"):
                    continue
                jpg = mnt / c / (f[:-4] + ".JPEG")
                with Image.open(jpg) as im:
                    want = np.asarray(im.convert("RGB"))
                got = np.load(mnt / c / f)
                assert got.shape == want.shape and np.array_equal(got, want), f
                n += 1
        assert n == 48
    finally:
        run("umount", mnt)


def test_second_mount_reuses_the_index_and_pack_gives_the_same_tree(manifest, mounts, work):
    for name, (src, _, _) in CASES.items():
        i = json.loads(run("info", FORMATS / src, "--json", "--index-dir", work / "index").stdout)
        assert i["index_built_now"] is False, name
        assert i["samples"] == 48 and i["zero_copy"] is True
        out = work / f"{name}.pack"
        run("pack", FORMATS / src, out)
        # Every file of the pack equals the mounted file of the same path, and nothing is
        # missing on either side.
        v = run("verify", out, "--against", mounts[name], check=False)
        assert v.returncode == 0, v.stdout + v.stderr


def test_a_shared_index_mounts_every_format_elsewhere_without_a_scan(manifest, mounts, work, tmp_path):
    """`loosefs index` on one node; another node sees the same files (mtimes kept) under
    another path: its mount uses the index beside the dataset, scans nothing, keeps no local
    index, and serves the same tree; a touched file makes the index stale (refused, named)."""
    need_mount()
    for name, (src, _, _) in CASES.items():
        a = copy(FORMATS / src, tmp_path / "node1" / name / pathlib.Path(src).name)
        r = run("index", a, "--index-dir", tmp_path / "ix1")
        assert "shared index" in r.stdout, r.stdout
        shared = pathlib.Path(str(a) + ".loosefs-index")
        assert shared.is_file() and (shared.stat().st_mode & 0o777) == 0o644
        b = copy(a, tmp_path / "node2" / name / a.name)
        shutil.copy2(shared, str(b) + ".loosefs-index")
        mnt = tmp_path / f"mnt-{name}"
        mnt.mkdir()
        empty = tmp_path / f"ix-{name}"
        r = run("mount", b, mnt, "--index-dir", empty)
        assert "indexing" not in r.stderr, r.stderr
        try:
            got = {p.relative_to(mnt): md5(p.read_bytes()) for p in mnt.rglob("*") if p.is_file()}
            want = {p.relative_to(mounts[name]): md5(p.read_bytes()) for p in mounts[name].rglob("*") if p.is_file()}
            assert got == want, name
        finally:
            run("umount", mnt)
        assert not empty.exists(), name
        # A shard (the largest file; metadata such as MDS's index.json is not keyed).
        victim = max((p for p in (b.rglob("*") if b.is_dir() else [b]) if p.is_file()), key=lambda p: p.stat().st_size)
        os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 1))
        r = run("mount", b, mnt, "--index-dir", empty, check=False)
        if r.returncode == 0:
            run("umount", mnt)
        assert r.returncode == 75 and "stale" in r.stderr and victim.name in r.stderr, r.stderr


def copy(src, dst):
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return dst


def mount_fails(src, work, *words):
    mnt = work / "mnt-bad"
    mnt.mkdir(exist_ok=True)
    r = run("mount", src, mnt, "--index-dir", work / "index-bad", check=False)
    if r.returncode == 0:
        run("umount", mnt)
    assert r.returncode == 65, r.stderr  # damaged (docs/CONFIGURATION.md, exit codes)
    for w in words:
        assert w in r.stderr, r.stderr
    assert "panicked" not in r.stderr


def test_damaged_sources_fail_clearly(manifest, work, tmp_path):
    need_mount()
    # A truncated WebDataset shard.
    wds = copy(FORMATS / "webdataset", tmp_path / "wds")
    shard = wds / "shard-000001.tar"
    os.truncate(shard, shard.stat().st_size // 2)
    mount_fails(wds, work, str(shard), "truncated")
    # A TFRecord with one flipped byte: the format's CRC-32C catches it.
    tfr = copy(FORMATS / "tfrecord" / "train-00000-of-00001", tmp_path / "tfr" / "train")
    b = bytearray(tfr.read_bytes())
    b[len(b) // 2] ^= 0x40
    tfr.write_bytes(bytes(b))
    mount_fails(tfr, work, str(tfr), "CRC-32C")
    # A LitData chunk that is missing.
    lit = copy(FORMATS / "litdata", tmp_path / "lit")
    (lit / "chunk-0-1.bin").unlink()
    mount_fails(lit, work, "chunk-0-1.bin", "missing")
    # An MDS shard whose offset table points past its end.
    mds = copy(FORMATS / "mds", tmp_path / "mds")
    s = mds / "shard.00000.mds"
    b = bytearray(s.read_bytes())
    b[8:12] = struct.pack("<I", len(b) + 4096)  # offsets[1]: sample 0 ends past the shard
    s.write_bytes(bytes(b))
    mount_fails(mds, work, str(s), "past the end")
    # A GulpIO meta file pointing past the end of its data file.
    gulp = copy(FORMATS / "gulpio", tmp_path / "gulp")
    meta = gulp / "meta_0.gmeta"
    m = json.loads(meta.read_text())
    first = next(iter(m.values()))
    first["frame_info"][0][0] = 10**9
    meta.write_text(json.dumps(m))
    mount_fails(gulp, work, "past the end")
    # A tar member named with `..`.
    import tarfile

    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as t:
        for n, data in [("../x.jpg", (SAMPLES / manifest["files"][0]).read_bytes()), ("../x.cls", b"0")]:
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            import io

            t.addfile(ti, io.BytesIO(data))
    mount_fails(evil, work, "../x.jpg", "climbs out")
    # Not any known format: the error lists what was tried.
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x01" * 4096)
    mount_fails(junk, work, "tried", "tfrecord", "ffcv")


def test_bytes_changed_after_indexing_give_eio_not_wrong_bytes(manifest, work, tmp_path):
    """LitData carries no checksum: with `--verify full` the index's CRC-32 (computed when it
    was built) is what catches a byte flipped afterwards (mtime kept, so the index is reused)."""
    need_mount()
    lit = copy(FORMATS / "litdata", tmp_path / "lit")
    idx = tmp_path / "index"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("mount", lit, mnt, "--index-dir", idx, "--verify", "full")
    files = sorted(p for p in mnt.rglob("*") if p.is_file())
    victim = files[0].read_bytes()
    run("umount", mnt)
    chunk = lit / "chunk-0-0.bin"
    st = chunk.stat()
    b = bytearray(chunk.read_bytes())
    at = b.find(victim[:4096])
    assert at > 0
    b[at + 2000] ^= 0x01
    chunk.write_bytes(bytes(b))
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    log = tmp_path / "daemon.log"
    run("mount", lit, mnt, "--index-dir", idx, "--log", log, "--verify", "full")
    try:
        with pytest.raises(OSError) as e:
            files[0].read_bytes()
        assert e.value.errno == 5  # EIO
        assert files[1].read_bytes() != b""  # the others are served
    finally:
        run("umount", mnt)
    assert "CRC-32" in log.read_text() and files[0].name in log.read_text()


def test_lazy_verify_checks_each_sample_against_its_format_checksum_when_first_read(
    manifest, work, tmp_path
):
    """`--verify lazy` (the default) indexes without reading the samples, so a zip member
    damaged in place still mounts; its CRC-32 from the central directory fails it at its first
    read (EIO, logged) while the others are served. `--verify full` refuses the mount, naming
    the member."""
    need_mount()
    z = copy(FORMATS / "zip", tmp_path / "zip") / "images.zip"
    first = (SAMPLES / manifest["files"][0]).read_bytes()
    b = bytearray(z.read_bytes())
    at = b.find(first)
    assert at > 0, "stored in place"
    b[at + len(first) // 2] ^= 0x01
    z.write_bytes(bytes(b))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    run("mount", z, mnt, "--index-dir", tmp_path / "index", "--log", log)
    name = pathlib.Path(manifest["files"][0]).name
    try:
        files = sorted(p for p in mnt.rglob("*") if p.is_file())
        victim = [p for p in files if p.name == name]
        assert len(victim) == 1, name
        with pytest.raises(OSError) as e:
            victim[0].read_bytes()
        assert e.value.errno == 5  # EIO
        others = [p for p in files if p.name != name]
        assert len(others) == len(manifest["files"]) - 1
        for p in others[:5]:
            assert p.read_bytes() == (SAMPLES / next(f for f in manifest["files"] if f.endswith("/" + p.name))).read_bytes()
    finally:
        run("umount", mnt)
    assert "CRC-32" in log.read_text() and name in log.read_text()
    r = run("mount", z, mnt, "--index-dir", tmp_path / "index-full", "--verify", "full", check=False)
    if r.returncode == 0:
        run("umount", mnt)
    assert r.returncode == 65 and "fails its CRC-32" in r.stderr and name in r.stderr, r.stderr


def test_fields_all_shows_every_member_of_a_webdataset_sample(manifest, work, tmp_path):
    """`--fields all`: beside each image, its other members, byte-identical to the tar's (read
    here with Python's tarfile), named `<key>.<ext>` as WebDataset names them."""
    need_mount()
    import tarfile

    members = {}
    for shard in sorted((FORMATS / "webdataset").glob("*.tar")):
        with tarfile.open(shard) as t:
            for m in t.getmembers():
                if m.isfile():
                    members[m.name.split("/")[-1]] = t.extractfile(m).read()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("mount", FORMATS / "webdataset", mnt, "--fields", "all", "--index-dir", work / "index")
    try:
        shown = {p.name: p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
        assert shown == members
        # ImageFolder still sees one image per sample (it filters by extension).
        assert len(torchvision.datasets.ImageFolder(str(mnt))) == 48
    finally:
        run("umount", mnt)


def test_ffcv_raw_pixels_are_served_as_ppm_and_npy(manifest, mounts, work, tmp_path):
    """FFCV `raw` images: RGB bytes served in place behind a PPM header (`.npy` view beside it
    with --decode npy). Oracle: the bytes parsed here from the .beton with struct, and the same
    sample of jpg.beton (FFCV's JPEG at quality 90 of the same resized image) decoding to
    nearly the same pixels: a swapped width and height would not even have the same shape."""
    need_mount()
    b = (FORMATS / "ffcv" / "raw.beton").read_bytes()
    version, nf, _page, n, alloc = struct.unpack_from("<HHIQQ", b, 0)
    sizes = {}
    for k in range(alloc, len(b) - 23, 24):
        _sid, ptr, size = struct.unpack_from("<QQQ", b, k)
        sizes[ptr] = size
    meta = 24 + 1041 * nf
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("mount", FORMATS / "ffcv" / "raw.beton", mnt, "--decode", "npy", "--index-dir", work / "index")
    try:
        ds = torchvision.datasets.ImageFolder(str(mnt))
        assert ds.classes == [f"{i:04d}" for i in range(48)] and len(ds) == 48
        jpg_root = mounts["ffcv"]
        for i in range(n):
            mode, w, h, ptr = struct.unpack_from("<BHHQ", b, meta + 24 * i)
            (label,) = struct.unpack_from("<q", b, meta + 24 * i + 16)
            assert mode == 1 and sizes[ptr] == w * h * 3
            want = np.frombuffer(b[ptr:ptr + w * h * 3], np.uint8).reshape(h, w, 3)
            p = mnt / f"{label:04d}" / f"{i:08d}.ppm"
            with Image.open(p) as im:
                assert np.array_equal(np.asarray(im), want), p
            assert np.array_equal(np.load(p.with_suffix(".npy")), want)
            with Image.open(jpg_root / f"{label:04d}" / f"{i:08d}.jpg") as im:
                jpg = np.asarray(im.convert("RGB"))
            assert jpg.shape == want.shape
            # JPEG at quality 90 of a detailed image is a few levels off on average; another
            # image, or the pixels misplaced, is tens of levels off and uncorrelated.
            assert np.abs(jpg.astype(int) - want.astype(int)).mean() < 16, p
            pool = lambda a: a[: h // 8 * 8, : w // 8 * 8].reshape(h // 8, 8, w // 8, 8, 3).mean(axis=(1, 3))
            assert np.corrcoef(pool(jpg).ravel(), pool(want).ravel())[0, 1] > 0.98, p
    finally:
        run("umount", mnt)


def _pack_shows_the_source_mounts_tree(src, idx, tmp_path):
    """Packs `src`, mounts `src` and the pack, and checks the pack's tree byte for byte against
    the source's mount (every file, each image opened by Pillow) and `verify --against` that
    mount. Returns the tree shown: {relative path: bytes}."""
    pack = tmp_path / "out.pack"
    run("pack", src, pack, "--index-dir", idx)
    src_mnt, pack_mnt = tmp_path / "src-mnt", tmp_path / "pack-mnt"
    src_mnt.mkdir()
    pack_mnt.mkdir()
    run("mount", src, src_mnt, "--index-dir", idx)
    try:
        shown = {p.relative_to(src_mnt): p.read_bytes() for p in src_mnt.rglob("*") if p.is_file()}
        run("mount", pack, pack_mnt)
        try:
            packed = {p.relative_to(pack_mnt): p.read_bytes() for p in pack_mnt.rglob("*") if p.is_file()}
            assert packed == shown
            for rel in shown:
                with Image.open(pack_mnt / rel) as im:
                    im.load()
                    assert im.mode == "RGB", rel
        finally:
            run("umount", pack_mnt)
        r = run("verify", pack, "--against", src_mnt, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        run("umount", src_mnt)
    return shown


def test_a_pack_of_ffcv_raw_pixels_holds_the_ppm_files_the_mount_shows(manifest, work, tmp_path):
    """`loosefs pack` of raw.beton writes the tree its mount shows: each `.ppm` with its header,
    readable by Pillow; `verify --against` the source's mount passes byte for byte."""
    need_mount()
    shown = _pack_shows_the_source_mounts_tree(FORMATS / "ffcv" / "raw.beton", work / "index", tmp_path)
    assert len(shown) == 48 and all(p.suffix == ".ppm" for p in shown)


def _beton_samples(b):
    """(metadata table offset, n, {ptr: (allocation-table offset, size)}) of a `.beton` with
    fields [RGBImage, Int] (formats.md §1: rows of 24 bytes after 1041-byte field descriptors)."""
    _version, nf, _page, n, alloc = struct.unpack_from("<HHIQQ", b, 0)
    sizes = {}
    for k in range(alloc, len(b) - 23, 24):
        _sid, ptr, size = struct.unpack_from("<QQQ", b, k)
        sizes[ptr] = (k, size)
    return 24 + 1041 * nf, n, sizes


def test_a_pack_of_mixed_jpeg_and_raw_ffcv_mounts_to_the_source_mounts_bytes(manifest, work, tmp_path):
    """An FFCV file mixing JPEG and raw samples (what ffcv's `write_mode='smart'` writes), made
    here from raw.beton by putting jpg.beton's JPEG of every even sample into that sample's slot
    (mode byte 0, allocation size the JPEG's): its pack holds both halves, `.jpg` and `.ppm`,
    byte-identical to the source's mount, and `verify --against` that mount passes."""
    need_mount()
    raw = bytearray((FORMATS / "ffcv" / "raw.beton").read_bytes())
    jpg = (FORMATS / "ffcv" / "jpg.beton").read_bytes()
    meta, n, raw_sizes = _beton_samples(raw)
    jmeta, jn, jpg_sizes = _beton_samples(jpg)
    assert n == jn == 48
    for i in range(0, n, 2):
        _m, w, h, ptr = struct.unpack_from("<BHHQ", raw, meta + 24 * i)
        jm, jw, jh, jptr = struct.unpack_from("<BHHQ", jpg, jmeta + 24 * i)
        assert jm == 0 and (jw, jh) == (w, h)
        data = jpg[jptr:jptr + jpg_sizes[jptr][1]]
        k, size = raw_sizes[ptr]
        assert len(data) <= size
        raw[ptr:ptr + len(data)] = data
        raw[meta + 24 * i] = 0
        struct.pack_into("<Q", raw, k + 16, len(data))
    src = tmp_path / "mixed.beton"
    src.write_bytes(bytes(raw))
    shown = _pack_shows_the_source_mounts_tree(src, tmp_path / "index", tmp_path)
    suffixes = sorted(p.suffix for p in shown)
    assert suffixes.count(".jpg") == 24 and suffixes.count(".ppm") == 24


def test_gzipped_webdataset_is_inflated_once_and_served_like_the_tar(manifest, mounts, work, tmp_path):
    need_mount()
    import gzip

    src = tmp_path / "tgz"
    src.mkdir()
    for shard in sorted((FORMATS / "webdataset").glob("*.tar")):
        (src / (shard.name + ".gz")).write_bytes(gzip.compress(shard.read_bytes()))
    idx = tmp_path / "index"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run("mount", src, mnt, "--index-dir", idx)
    assert r.stderr.count("inflating") == 3, r.stderr
    try:
        got = {p.relative_to(mnt): p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
        want = {p.relative_to(mounts["webdataset"]): p.read_bytes() for p in mounts["webdataset"].rglob("*") if p.is_file()}
        assert got == want and len(got) == 48
    finally:
        run("umount", mnt)
    # Second time: nothing inflated, the index is reused.
    i = run("info", src, "--json", "--index-dir", idx)
    assert "inflating" not in i.stderr and json.loads(i.stdout)["index_built_now"] is False
