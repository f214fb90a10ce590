//! The remote openers, served as composed here, over the in-memory [`FakeStore`], in plain
//! `cargo test` (no server): a pack's tail and index GETs, the kept index, a damaged or foreign object, a replaced object
//! (ESTALE) against an outage (EIO), `--offline` from a complete cache, the cache budget; a
//! dataset under a prefix listed once, its kept and shared indexes, hostile names, a brace
//! pattern, an outage of the listing. Every tree served is compared byte for byte with the
//! files it was made from. The same cases run end to end over SeaweedFS and nginx in
//! `tests/e2e/test_remote*.py`.

use super::served;
use crate::catalog::{FsError, Kind};
use crate::fs::{Fs, FsOptions};
use crate::open::remote_dataset::RemoteDataset;
use crate::open::remote_pack::RemotePack;
use crate::open::*;
use crate::storage::object::fake::FakeStore;
use crate::storage::object::remote_config::RemoteConfig;
use crate::testutil::noise;
use crate::view::Views;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

/// The files of a test tree: `n` files of `size` bytes in three class directories, names
/// padded to `name_len` characters (long names make a large index).
fn tree(dir: &Path, n: usize, size: usize, name_len: usize) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for k in 0..n {
        let name = format!("c{}/f{k:0>width$}.bin", k % 3, width = name_len);
        let data = noise(k as u64 + 1, size + k % 7);
        let p = dir.join(&name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &data).unwrap();
        files.insert(name, data);
    }
    files
}

/// A pack of `files` written under `tmp` (the packer's own bytes).
fn pack_bytes(
    tmp: &Path,
    n: usize,
    size: usize,
    name_len: usize,
) -> (Vec<u8>, BTreeMap<String, Vec<u8>>) {
    let src = tmp.join("src");
    let files = tree(&src, n, size, name_len);
    let out = tmp.join("p.pack");
    let opts = crate::packer::PackOptions {
        jobs: 1,
        align: 1,
        follow_links: false,
        force: true,
        progress: crate::progress::Progress::None,
        source: OpenOptions::default(),
    };
    crate::packer::pack_dir(&src, &out, &opts).unwrap();
    (std::fs::read(&out).unwrap(), files)
}

/// Open options whose caches and indexes live under `tmp/node` (another node: another name).
fn options(tmp: &Path, node: &str) -> OpenOptions {
    OpenOptions {
        index_dir: Some(tmp.join(node).join("index")),
        remote: RemoteConfig {
            cache_dir: Some(tmp.join(node).join("cache")),
            cache_size: Some(1 << 30),
            ..RemoteConfig::default()
        },
        ..OpenOptions::default()
    }
}

/// Options of an in-process filesystem: no push, small caches, one thread.
fn fs_options() -> FsOptions {
    FsOptions::in_process()
}

fn open(src: &str, opts: &OpenOptions, store: &Arc<FakeStore>) -> Result<Dataset> {
    Dataset::open_on(
        Path::new(src),
        opts,
        crate::progress::Progress::None,
        store.clone(),
    )
}

/// The whole message of the error opening `src` fails with.
fn open_err(src: &str, opts: &OpenOptions, store: &Arc<FakeStore>) -> String {
    format!("{:#}", open(src, opts, store).unwrap_err())
}

fn serve(ds: Dataset) -> Fs {
    served(ds, Views::default(), fs_options(), 64 << 20).unwrap()
}

/// The inode of `path` (`/`-separated, relative to the root).
fn ino_of(fs: &Fs, path: &str) -> Result<u64, FsError> {
    let mut ino = 1;
    for c in path.split('/') {
        ino = fs.lookup(ino, c.as_bytes())?.attr.ino;
    }
    Ok(ino)
}

/// The whole file at `path`, read in 64 KiB READs.
fn read(fs: &Fs, path: &str) -> Result<Vec<u8>, FsError> {
    let ino = ino_of(fs, path)?;
    let size = fs.getattr(ino)?.attr.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let (tx, rx) = std::sync::mpsc::channel();
        fs.read(ino, out.len() as u64, 64 << 10, move |r| {
            let _ = tx.send(r.map(<[u8]>::to_vec));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap()?;
        assert!(!got.is_empty(), "{path}: short read at {}", out.len());
        out.extend(got);
    }
    Ok(out)
}

/// Every file of the tree with its bytes.
fn walk(fs: &Fs) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![(1u64, String::new())];
    while let Some((ino, dir)) = dirs.pop() {
        let mut entries = Vec::new();
        fs.readdir(ino, 0, |e| {
            entries.push((e.ino, e.kind, String::from_utf8_lossy(&e.name).into_owned()));
            false // not full: go on
        })
        .unwrap();
        for (ino, kind, name) in entries {
            if name == "." || name == ".." || name == ".loosefs" {
                continue;
            }
            let path = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            match kind {
                Kind::Dir => dirs.push((ino, path)),
                _ => {
                    let data = read(fs, &path).unwrap();
                    out.insert(path, data);
                }
            }
        }
    }
    out
}

fn remote_pack(ds: &Dataset) -> &RemotePack {
    match ds {
        Dataset::Remote(r) => r,
        other => panic!("a remote pack, not {other:?}"),
    }
}

fn remote_set(ds: &Dataset) -> &RemoteDataset {
    match ds {
        Dataset::RemoteSet(r) => r,
        other => panic!("a remote dataset, not {other:?}"),
    }
}

#[test]
fn a_remote_pack_opens_with_one_get_and_serves_the_packed_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (pack, files) = pack_bytes(tmp.path(), 40, 3000, 1);
    let store = FakeStore::new();
    store.put("s3://b/p.pack", pack);
    let ds = open("s3://b/p.pack", &options(tmp.path(), "n1"), &store).unwrap();
    assert_eq!(remote_pack(&ds).open_requests, 1);
    assert_eq!(
        store.gets(),
        1,
        "one suffix GET: the tail holds the trailer and the index"
    );
    assert_eq!(walk(&serve(ds)), files);
}

#[test]
fn a_large_index_is_fetched_in_parts_then_kept_so_a_remount_makes_one_get() {
    let tmp = tempfile::tempdir().unwrap();
    // ~4,000 names of ~200 bytes: an index larger than the 1 MiB tail.
    let (pack, files) = pack_bytes(tmp.path(), 4000, 10, 200);
    let store = FakeStore::new();
    store.put("s3://b/big.pack", pack);
    let opts = options(tmp.path(), "n1");
    let mut first = open("s3://b/big.pack", &opts, &store).unwrap();
    let n = remote_pack(&first).open_requests;
    assert!(n >= 2, "the tail, then the index in parts: {n}");
    assert_eq!(store.gets(), n);
    if let Dataset::Remote(r) = &mut first {
        r.finish();
    }
    drop(first);
    let again = open("s3://b/big.pack", &opts, &store).unwrap();
    assert_eq!(remote_pack(&again).open_requests, 1, "the kept index");
    assert_eq!(store.gets(), n + 1);
    let fs = serve(again);
    for name in files.keys().step_by(397) {
        assert_eq!(&read(&fs, name).unwrap(), &files[name], "{name}");
    }
}

#[test]
fn an_object_without_a_pack_trailer_is_the_typed_not_a_pack_error() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    store.put("s3://b/x.bin", noise(3, 100_000));
    let r = RemotePack::open("s3://b/x.bin", &*store, &options(tmp.path(), "n1").remote);
    assert!(matches!(r, Err(OpenError::NotAPack { .. })), "{r:?}");
    // Through the dispatch: tried as a dataset too, both reasons given.
    let e = open("s3://b/x.bin", &options(tmp.path(), "n1"), &store).unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("not a loosefs pack"), "{e}");
}

#[test]
fn a_missing_object_is_refused_naming_the_url() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let r = RemotePack::open(
        "s3://b/none.pack",
        &*store,
        &options(tmp.path(), "n1").remote,
    );
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("s3://b/none.pack") && e.contains("404"), "{e}");
    // A prefix given without its trailing `/`: the 404 says what to give (one LIST after it).
    loose(&store, "s3://b/train/", 3, 100);
    let e = open_err("s3://b/train", &options(tmp.path(), "n1"), &store);
    assert!(
        e.contains("404") && e.contains("give s3://b/train/, with its trailing `/`"),
        "{e}"
    );
    let e = open_err("s3://b/none.pack", &options(tmp.path(), "n1"), &store);
    assert!(e.contains("404") && !e.contains("trailing"), "{e}");
}

#[test]
fn a_damaged_index_is_refused_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut pack, _) = pack_bytes(tmp.path(), 40, 3000, 1);
    let trailer = crate::pack::trailer::Trailer::parse_tail(&pack).unwrap();
    let r = trailer.index_range(pack.len() as u64).unwrap();
    let at = (r.start + (r.end - r.start) / 2) as usize;
    pack[at] ^= 0x5a;
    let store = FakeStore::new();
    store.put("s3://b/p.pack", pack);
    let e = open_err("s3://b/p.pack", &options(tmp.path(), "n1"), &store);
    assert!(e.contains("damaged index"), "{e}");
}

#[test]
fn an_outage_during_open_fails_with_the_network_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let (pack, _) = pack_bytes(tmp.path(), 10, 3000, 1);
    let store = FakeStore::new();
    store.put("s3://b/p.pack", pack).down.store(true, SeqCst);
    let e = open_err("s3://b/p.pack", &options(tmp.path(), "n1"), &store);
    assert!(e.contains("connection refused"), "{e}");
}

#[test]
fn a_pack_replaced_while_served_answers_estale_and_an_outage_eio() {
    let tmp = tempfile::tempdir().unwrap();
    // 6 MB: the last file lies blocks away from the first.
    let (pack, files) = pack_bytes(tmp.path(), 60, 100_000, 1);
    let store = FakeStore::new();
    let obj = store.put("s3://b/p.pack", pack.clone());
    let fs = serve(open("s3://b/p.pack", &options(tmp.path(), "n1"), &store).unwrap());
    let (a, b) = {
        let mut names = files.keys();
        (names.next().unwrap().clone(), names.last().unwrap().clone())
    };
    assert_eq!(read(&fs, &a).unwrap(), files[&a]);
    obj.down.store(true, SeqCst);
    let e = read(&fs, &b).unwrap_err();
    assert!(matches!(e, FsError::Io(_)), "an outage is EIO: {e:?}");
    obj.down.store(false, SeqCst);
    let mut v2 = pack;
    let last = v2.len() - 100;
    v2[last] ^= 1;
    store.put("s3://b/p.pack", v2);
    let e = read(&fs, &b).unwrap_err();
    assert!(
        matches!(e, FsError::Stale(_)),
        "a replaced object is ESTALE: {e:?}"
    );
    assert!(fs.stats.stale.load(Relaxed) >= 1);
    // Cached bytes are still the pinned version's.
    assert_eq!(read(&fs, &a).unwrap(), files[&a]);
}

#[test]
fn offline_serves_a_complete_cache_with_no_request() {
    let tmp = tempfile::tempdir().unwrap();
    let (pack, files) = pack_bytes(tmp.path(), 40, 3000, 1);
    let store = FakeStore::new();
    store.put("s3://b/p.pack", pack);
    let opts = options(tmp.path(), "n1");
    let mut ds = open("s3://b/p.pack", &opts, &store).unwrap();
    if let Dataset::Remote(r) = &mut ds {
        r.download().unwrap();
        r.finish();
    }
    // Unmounted: the block cache closed cleanly.
    serve(ds).close();
    let offline = OpenOptions {
        remote: RemoteConfig {
            offline: true,
            ..opts.remote.clone()
        },
        ..opts
    };
    let nowhere = FakeStore::new();
    let ds = open("s3://b/p.pack", &offline, &nowhere).unwrap();
    assert_eq!(remote_pack(&ds).open_requests, 0);
    assert_eq!(walk(&serve(ds)), files);
    assert_eq!(nowhere.gets(), 0);
}

#[test]
fn offline_refuses_an_incomplete_cache_or_none_saying_why() {
    let tmp = tempfile::tempdir().unwrap();
    let (pack, _) = pack_bytes(tmp.path(), 40, 3000, 1);
    let store = FakeStore::new();
    store.put("s3://b/p.pack", pack);
    let opts = options(tmp.path(), "n1");
    let offline = |o: &OpenOptions| OpenOptions {
        remote: RemoteConfig {
            offline: true,
            ..o.remote.clone()
        },
        ..o.clone()
    };
    std::fs::create_dir_all(opts.remote.cache_dir.as_ref().unwrap()).unwrap();
    let e = open_err("s3://b/p.pack", &offline(&opts), &store);
    assert!(e.contains("mount it online first"), "{e}");
    let mut ds = open("s3://b/p.pack", &opts, &store).unwrap();
    if let Dataset::Remote(r) = &mut ds {
        r.finish();
    }
    drop(ds);
    let e = open_err("s3://b/p.pack", &offline(&opts), &store);
    assert!(e.contains("not complete"), "{e}");
}

#[test]
fn a_cache_smaller_than_the_pack_bounds_its_blocks_and_refuses_a_download() {
    let tmp = tempfile::tempdir().unwrap();
    let (pack, files) = pack_bytes(tmp.path(), 60, 700_000, 1);
    let size = pack.len() as u64;
    let store = FakeStore::new();
    store.put("s3://b/p.pack", pack);
    let mut opts = options(tmp.path(), "n1");
    opts.remote.cache_size = Some(crate::storage::block_cache::MIN_CACHE);
    let ds = open("s3://b/p.pack", &opts, &store).unwrap();
    let r = remote_pack(&ds);
    assert!(
        r.storage().limit() < size,
        "{} of {size}",
        r.storage().limit()
    );
    let e = format!("{:#}", r.download().unwrap_err());
    assert!(e.contains("less than the pack"), "{e}");
    // Still served whole, byte for byte, fetching again what it could not keep.
    assert_eq!(walk(&serve(ds)), files);
}

/// A WebDataset shard of samples `first..first + n` (`.jpg` noise and `.cls`).
fn shard(first: usize, n: usize) -> Vec<u8> {
    crate::testutil::wds_shard(first..first + n, |i| 20_000 + i, 3)
}

/// Two shards under `prefix` in `store`, and the same shards in a local directory, opened
/// locally: the tree a remote mount must match.
fn shards(tmp: &Path, store: &FakeStore, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let local = tmp.join("local-wds");
    std::fs::create_dir_all(&local).unwrap();
    for (k, data) in [shard(0, 12), shard(12, 9)].into_iter().enumerate() {
        let name = format!("shard-{k}.tar");
        std::fs::write(local.join(&name), &data).unwrap();
        store.put(&format!("{prefix}{name}"), data);
    }
    let ds = Dataset::open(
        &local,
        &options(tmp, "local"),
        crate::progress::Progress::None,
    )
    .unwrap();
    walk(&serve(ds))
}

#[test]
fn a_prefix_of_shards_is_listed_once_and_served_as_the_local_scan() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let want = shards(tmp.path(), &store, "s3://b/wds/");
    assert_eq!(want.len(), 21);
    let ds = open("s3://b/wds/", &options(tmp.path(), "n1"), &store).unwrap();
    assert_eq!(store.lists.load(SeqCst), 1);
    assert_eq!(remote_set(&ds).objects.len(), 2);
    assert_eq!(walk(&serve(ds)), want);
}

#[test]
fn a_remount_of_an_unchanged_prefix_reads_no_sample_and_a_changed_one_indexes_again() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let want = shards(tmp.path(), &store, "s3://b/wds/");
    let opts = options(tmp.path(), "n1");
    drop(open("s3://b/wds/", &opts, &store).unwrap());
    let gets = store.gets();
    let ds = open("s3://b/wds/", &opts, &store).unwrap();
    assert_eq!(
        store.gets(),
        gets,
        "the listing pins; the kept index names the samples"
    );
    assert_eq!(remote_set(&ds).open_requests, 0);
    drop(ds);
    store.put(
        "s3://b/wds/shard-1.tar",
        shard(12, 9).into_iter().rev().collect(),
    );
    store.put("s3://b/wds/shard-1.tar", shard(12, 9));
    let ds = open("s3://b/wds/", &opts, &store).unwrap();
    assert!(store.gets() > gets, "a new ETag: indexed again");
    assert_eq!(walk(&serve(ds)), want);
}

#[test]
fn a_shared_index_spares_another_node_the_download() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let want = shards(tmp.path(), &store, "s3://b/wds/");
    let line = crate::open::index_url(
        "s3://b/wds/",
        None,
        &options(tmp.path(), "n1"),
        store.clone(),
        crate::progress::Progress::None,
    )
    .unwrap();
    assert!(line.starts_with("s3://b/wds/.loosefs-index"), "{line}");
    assert_eq!(store.uploads.load(SeqCst), 1);
    let gets = store.gets();
    let ds = open("s3://b/wds/", &options(tmp.path(), "n2"), &store).unwrap();
    assert_eq!(store.gets(), gets + 1, "one GET: the shared index");
    assert_eq!(walk(&serve(ds)), want);
}

#[test]
fn a_listing_naming_a_path_outside_the_prefix_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    // An empty segment: `a//x.tar` would be written outside the object's cache name.
    store.put("s3://b/bad/a//x.tar", shard(0, 2));
    let e = open_err("s3://b/bad/", &options(tmp.path(), "n1"), &store);
    assert!(e.contains("outside the dataset"), "{e}");
    assert_eq!(store.gets(), 0, "refused before any GET");
}

#[test]
fn an_empty_prefix_and_a_listing_outage_are_refused_naming_the_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let e = open_err("s3://b/empty/", &options(tmp.path(), "n1"), &store);
    assert!(e.contains("no objects under this prefix"), "{e}");
    store.put("s3://b/wds/shard-0.tar", shard(0, 2));
    store.list_down.store(true, SeqCst);
    let e = open_err("s3://b/wds/", &options(tmp.path(), "n1"), &store);
    assert!(
        e.contains("s3://b/wds/") && e.contains("connection refused"),
        "{e}"
    );
}

#[test]
fn a_brace_pattern_pins_each_object_by_one_get_and_serves_the_local_scan() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let want = shards(tmp.path(), &store, "https://h/d/");
    let ds = open(
        "https://h/d/shard-{0..1}.tar",
        &options(tmp.path(), "n1"),
        &store,
    )
    .unwrap();
    assert_eq!(store.lists.load(SeqCst), 0, "HTTP has no listing");
    // A 1-byte GET pins each, then each is downloaded once to be indexed.
    assert_eq!(store.gets(), 4);
    assert_eq!(walk(&serve(ds)), want);
}

#[test]
fn an_offline_dataset_is_served_from_its_complete_caches_with_no_request() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let want = shards(tmp.path(), &store, "s3://b/wds/");
    let opts = options(tmp.path(), "n1");
    // Indexing downloads every object; unmounted, their caches close cleanly.
    serve(open("s3://b/wds/", &opts, &store).unwrap()).close();
    let offline = OpenOptions {
        remote: RemoteConfig {
            offline: true,
            ..opts.remote.clone()
        },
        ..opts
    };
    let nowhere = FakeStore::new();
    let ds = open("s3://b/wds/", &offline, &nowhere).unwrap();
    assert_eq!(walk(&serve(ds)), want);
    assert_eq!(nowhere.gets() + nowhere.lists.load(SeqCst), 0);
}

/// Loose objects: `n` files of about `size` bytes in three class directories under `prefix`.
fn loose(store: &FakeStore, prefix: &str, n: usize, size: usize) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for k in 0..n {
        let name = format!("n0{}/img_{k:04}.JPEG", k % 3);
        let data = noise(k as u64 + 11, size + k * 13);
        store.put(&format!("{prefix}{name}"), data.clone());
        files.insert(name, data);
    }
    files
}

#[test]
fn loose_objects_under_a_prefix_mount_from_one_list_and_no_get_and_serve_every_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let files = loose(&store, "s3://b/train/", 60, 5000);
    let ds = open("s3://b/train/", &options(tmp.path(), "n1"), &store).unwrap();
    assert!(matches!(ds, Dataset::RemoteDir(_)), "{ds:?}");
    assert_eq!(
        (store.lists.load(Relaxed), store.gets()),
        (2, 0),
        "LISTs only (the first level, then the first 1000 keys: all of them), no GET to mount"
    );
    let fs = serve(ds);
    // Each file shows its listed LastModified; a directory the newest of what it holds.
    let ino = ino_of(&fs, "n00/img_0000.JPEG").unwrap();
    let listed = crate::storage::object::fake::FAKE_MODIFIED;
    assert_eq!(fs.getattr(ino).unwrap().attr.mtime_sec, listed);
    let dir = ino_of(&fs, "n00").unwrap();
    assert_eq!(fs.getattr(dir).unwrap().attr.mtime_sec, listed);
    assert_eq!(walk(&fs), files);
    // Each object fetched whole once (it fits one block): one GET per object.
    assert_eq!(store.gets(), files.len() as u64);
    assert_eq!(walk(&fs), files, "served again from the block caches");
    assert_eq!(store.gets(), files.len() as u64);
}

/// `loosefs index s3://b/train/` over `store`; the line it prints.
fn index_prefix(tmp: &Path, store: &Arc<FakeStore>) -> String {
    crate::open::index_url(
        "s3://b/train/",
        None,
        &options(tmp, "n1"),
        store.clone(),
        crate::progress::Progress::None,
    )
    .unwrap()
}

#[test]
fn a_shared_listing_mounts_loose_objects_with_two_requests_and_the_same_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let files = loose(&store, "s3://b/train/", 60, 5000);
    let line = index_prefix(tmp.path(), &store);
    assert!(
        line.starts_with(
            "s3://b/train/.loosefs-index: shared listing of s3://b/train/ (60 objects"
        ),
        "{line}"
    );
    assert_eq!(store.uploads.load(SeqCst), 1);
    let (lists, gets) = (store.lists.load(SeqCst), store.gets());
    let ds = open("s3://b/train/", &options(tmp.path(), "n2"), &store).unwrap();
    assert_eq!(
        (store.lists.load(SeqCst) - lists, store.gets() - gets),
        (1, 1),
        "a LIST of the first level and a GET of the index"
    );
    let Dataset::RemoteDir(r) = &ds else {
        panic!("loose objects, not {ds:?}")
    };
    assert_eq!(r.shared.as_deref(), Some("s3://b/train/.loosefs-index"));
    let fs = serve(ds);
    assert_eq!(walk(&fs), files, "the index itself is no file of the tree");
    // An index named with --index must exist (it is not looked for, it is asked for).
    drop(fs);
    let named = open(
        "s3://b/train/",
        &OpenOptions {
            shared_index: Some(tmp.path().join("none")),
            ..options(tmp.path(), "n3")
        },
        &store,
    );
    let e = format!("{:#}", named.unwrap_err());
    assert!(e.contains("cannot read the shared index"), "{e}");
}

#[test]
fn a_stale_shared_listing_is_refused_naming_what_changed_and_a_deeper_change_answers_estale() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let files = loose(&store, "s3://b/train/", 30, 3000);
    index_prefix(tmp.path(), &store);
    store.put("s3://b/train/n09/new.JPEG", noise(5, 100));
    let e = open_err("s3://b/train/", &options(tmp.path(), "n2"), &store);
    assert!(
        e.contains(
            "the shared index s3://b/train/.loosefs-index is stale: s3://b/train/n09/ was added"
        ) && e.contains("run `loosefs index s3://b/train/` again, or mount with --refresh"),
        "{e}"
    );
    store.remove("s3://b/train/n09/new.JPEG");
    // Below the first level the index is a snapshot: a replaced object answers ESTALE for
    // itself at its first read, the others are served.
    let first = files.keys().next().unwrap();
    store.put(&format!("s3://b/train/{first}"), noise(999, 3000));
    let fs = serve(open("s3://b/train/", &options(tmp.path(), "n2"), &store).unwrap());
    assert!(matches!(read(&fs, first), Err(FsError::Stale(_))));
    let second = files.keys().nth(1).unwrap();
    assert_eq!(&read(&fs, second).unwrap(), &files[second]);
    drop(fs);
    // Indexed again, the new bytes are served.
    index_prefix(tmp.path(), &store);
    let fs = serve(open("s3://b/train/", &options(tmp.path(), "n3"), &store).unwrap());
    assert_eq!(read(&fs, first).unwrap(), noise(999, 3000));
}

#[test]
fn refresh_lists_a_stale_shared_listing_again_and_writes_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let mut files = loose(&store, "s3://b/train/", 30, 3000);
    index_prefix(tmp.path(), &store);
    store.put("s3://b/train/n09/new.JPEG", noise(5, 100));
    files.insert("n09/new.JPEG".into(), noise(5, 100));
    let refresh = |node| OpenOptions {
        refresh_index: true,
        ..options(tmp.path(), node)
    };
    let uploads = store.uploads.load(SeqCst);
    let fs = serve(open("s3://b/train/", &refresh("n2"), &store).unwrap());
    assert_eq!(walk(&fs), files, "the added object is served");
    assert_eq!(
        store.uploads.load(SeqCst),
        uploads + 1,
        "the listing written back"
    );
    drop(fs);
    // Another node now mounts from the rewritten listing with two requests, --refresh or not.
    let (lists, gets) = (store.lists.load(SeqCst), store.gets());
    let ds = open("s3://b/train/", &options(tmp.path(), "n3"), &store).unwrap();
    assert_eq!(
        (store.lists.load(SeqCst) - lists, store.gets() - gets),
        (1, 1)
    );
    assert_eq!(walk(&serve(ds)), files);
}

#[test]
fn a_replaced_loose_object_answers_estale_for_itself_only() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let files = loose(&store, "s3://b/train/", 12, 3000);
    let fs = serve(open("s3://b/train/", &options(tmp.path(), "n1"), &store).unwrap());
    let (first, second) = (files.keys().next().unwrap(), files.keys().nth(1).unwrap());
    store.put(&format!("s3://b/train/{first}"), noise(999, 3000));
    assert!(matches!(read(&fs, first), Err(FsError::Stale(_))));
    assert_eq!(&read(&fs, second).unwrap(), &files[second]);
    // The objects share one block with the gone one: that block is served from memory and
    // never stored (its gap must not pass for the object's bytes at a later mount of the
    // same listing); read again, it costs no GET.
    let gets = store.gets();
    assert_eq!(&read(&fs, second).unwrap(), &files[second]);
    assert_eq!(store.gets(), gets);
    let remote = fs.report().remote.expect("a remote report");
    assert_eq!(remote.blocks_fetched, 0, "the block was stored: {remote:?}");
}

#[test]
fn keys_a_file_system_cannot_show_are_left_out_and_a_prefix_of_shards_stays_a_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    for (k, name) in [
        "ok/a.txt", "x", "x/y", "a//b", "folder/", ".hidden", "sub/./c", "sub/d",
    ]
    .iter()
    .enumerate()
    {
        store.put(&format!("s3://b/odd/{name}"), noise(k as u64, 100 + k));
    }
    let ds = open("s3://b/odd/", &options(tmp.path(), "n1"), &store).unwrap();
    let Dataset::RemoteDir(r) = &ds else {
        panic!("loose objects, not {ds:?}")
    };
    let mut skipped: Vec<&str> = r.skipped.iter().map(|(k, _)| k.as_str()).collect();
    skipped.sort();
    assert_eq!(skipped, [".hidden", "a//b", "folder/", "sub/./c", "x"]);
    let served: Vec<String> = walk(&serve(ds)).into_keys().collect();
    assert_eq!(served, ["ok/a.txt", "sub/d", "x/y"]);
    // Shards of one format keep today's behaviour: a dataset, indexed.
    let files = shards(tmp.path(), &store, "s3://b/wds/");
    let ds = open("s3://b/wds/", &options(tmp.path(), "n2"), &store).unwrap();
    assert!(matches!(ds, Dataset::RemoteSet(_)), "{ds:?}");
    assert_eq!(walk(&serve(ds)), files);
}

#[test]
fn formats_are_told_from_loose_files_by_their_listing() {
    let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(remote_dir::holds_a_format(&k(&[
        "index.json",
        "shard.00000.mds"
    ])));
    assert!(remote_dir::holds_a_format(&k(&[
        "a-000.tar",
        "a-001.tar",
        ".loosefs-index"
    ])));
    assert!(remote_dir::holds_a_format(&k(&["x.parquet"])));
    assert!(remote_dir::holds_a_format(&k(&[
        "train-00000-of-00002",
        "train-00001-of-00002"
    ])));
    assert!(remote_dir::holds_a_format(&k(&[
        "data_1.gulp",
        "meta_1.gmeta",
        "label2idx.json"
    ])));
    assert!(!remote_dir::holds_a_format(&k(&["a.tar", "b.parquet"])));
    assert!(!remote_dir::holds_a_format(&k(&[
        "n01/a.JPEG",
        "n02/b.JPEG"
    ])));
    // A LeRobot dataset: metadata, Parquet and MP4 together are loose files.
    assert!(!remote_dir::holds_a_format(&k(&[
        "meta/info.json",
        "data/chunk-000/file-000.parquet",
        "videos/cam/chunk-000/file-000.mp4"
    ])));
}

/// What discovery found, in a word and whether a listing or a probe came with it.
fn holds(h: &crate::open::discover::Holds) -> String {
    use crate::open::discover::Holds;
    match h {
        Holds::Pack(_) => "pack".into(),
        Holds::Loose { listed, .. } => format!("loose ({} objects)", listed.len()),
        Holds::Stale { stale, .. } => format!("stale ({})", stale.name),
        Holds::Dataset(l) => format!(
            "dataset ({}, tried {:?})",
            l.listed
                .as_ref()
                .map_or("not listed".into(), |l| format!("{} listed", l.len())),
            l.tried.iter().map(|t| t.way).collect::<Vec<_>>()
        ),
    }
}

#[test]
fn mount_and_index_discover_the_same_for_each_kind_of_url() {
    use crate::open::discover::{Purpose, discover};
    use crate::open::url::SourceUrl;
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let (pack, _) = pack_bytes(tmp.path(), 20, 500, 4);
    store.put("s3://b/one.pack", pack.clone());
    store.put("gs://b/one.pack", pack);
    store.put("s3://b/a.zip", b"PK\x05\x06 not a pack".to_vec());
    loose(&store, "s3://b/train/", 9, 100);
    loose(&store, "gs://b/train/", 9, 100);
    loose(&store, "https://h/train/", 9, 100);
    shards(tmp.path(), &store, "s3://b/wds/");
    shards(tmp.path(), &store, "https://h/wds/");
    let as_store: Arc<dyn crate::storage::object::source::ObjectStore> = store.clone();
    let answer = |url: &str, purpose| {
        let src = SourceUrl::parse(url).unwrap();
        let opts = options(tmp.path(), "n1");
        discover(
            &src,
            &opts,
            purpose,
            crate::progress::Progress::None,
            &as_store,
        )
        .map(|h| holds(&h))
        .unwrap_or_else(|e| format!("error: {e:#}"))
    };
    let cases = [
        ("s3://b/one.pack", "pack"),
        ("gs://b/one.pack", "pack"),
        (
            "s3://b/a.zip",
            "dataset (not listed, tried [\"as a loosefs pack\"])",
        ),
        ("s3://b/train/", "loose (9 objects)"),
        ("gs://b/train/", "loose (9 objects)"),
        ("https://h/train/", "loose (9 objects)"),
        ("s3://b/wds/", "dataset (2 listed, tried [])"),
        ("https://h/wds/", "dataset (2 listed, tried [])"),
        (
            "https://h/wds/shard-{0..1}.tar",
            "dataset (not listed, tried [])",
        ),
        (
            "s3://b/none/",
            "error: cannot open s3://b/none/: no objects under this prefix",
        ),
    ];
    for (url, want) in &cases {
        assert_eq!(answer(url, Purpose::Mount), *want, "mount {url}");
        assert_eq!(answer(url, Purpose::Index), *want, "index {url}");
    }
    // A server that lists nothing: a dataset read from its `index.json`. A mount has also
    // asked for the shared index the listing would hide, and says so if the dataset fails.
    store.list_down.store(true, SeqCst);
    let url = "https://h/wds/";
    assert!(
        answer(url, Purpose::Mount).starts_with(
            "dataset (not listed, tried [\"as loose files\", \"as a shared listing\"])"
        ),
        "{}",
        answer(url, Purpose::Mount)
    );
    assert!(
        answer(url, Purpose::Index).starts_with("dataset (not listed, tried [\"as loose files\"])"),
        "{}",
        answer(url, Purpose::Index)
    );
    store.list_down.store(false, SeqCst);
    // The same answer taken by both commands: a pack needs no index (bad usage), loose
    // objects get a shared listing, shards a shared index.
    let index = |url: &str| {
        crate::open::index_url(
            url,
            None,
            &options(tmp.path(), "n1"),
            store.clone(),
            crate::progress::Progress::None,
        )
    };
    let e = index("s3://b/one.pack").unwrap_err();
    assert_eq!(
        crate::exit_code::ExitKind::of(&e),
        crate::exit_code::ExitKind::Usage
    );
    assert!(format!("{e:#}").contains("it is a loosefs pack"), "{e:#}");
    assert!(
        index("s3://b/train/")
            .unwrap()
            .contains("shared listing of s3://b/train/")
    );
    assert!(
        index("s3://b/wds/")
            .unwrap()
            .contains("shared index of s3://b/wds/")
    );
    // A zip that is no zip: refused naming both ways, of the dataset's kind.
    let e = open_err("s3://b/a.zip", &options(tmp.path(), "n1"), &store);
    assert!(
        e.starts_with("cannot open s3://b/a.zip\n  as a loosefs pack: ")
            && e.contains("\n  as a dataset: "),
        "{e}"
    );
}

#[test]
fn an_https_directory_with_a_stale_shared_listing_is_refused_and_refresh_serves_its_listing() {
    use crate::exit_code::ExitKind;
    let tmp = tempfile::tempdir().unwrap();
    let store = FakeStore::new();
    let mut files = loose(&store, "https://h/train/", 12, 800);
    // Written with --out (an HTTP server takes no upload) and published beside the files.
    let out = tmp.path().join("listing");
    let line = crate::open::index_url(
        "https://h/train/",
        Some(&out),
        &options(tmp.path(), "n1"),
        store.clone(),
        crate::progress::Progress::None,
    )
    .unwrap();
    assert!(
        line.contains("shared listing of https://h/train/"),
        "{line}"
    );
    store.put(
        "https://h/train/.loosefs-index",
        std::fs::read(&out).unwrap(),
    );
    let ds = open("https://h/train/", &options(tmp.path(), "n2"), &store).unwrap();
    let Dataset::RemoteDir(r) = &ds else {
        panic!("loose objects, not {ds:?}")
    };
    assert_eq!(r.shared.as_deref(), Some("https://h/train/.loosefs-index"));
    drop(ds);
    // A file added at the first level: the listing is stale, refused as changed (75).
    store.put("https://h/train/new.JPEG", noise(7, 100));
    let e = open("https://h/train/", &options(tmp.path(), "n3"), &store).unwrap_err();
    assert_eq!(ExitKind::of(&e), ExitKind::Changed, "{e:#}");
    assert!(
        format!("{e:#}").contains("is stale: https://h/train/new.JPEG was added"),
        "{e:#}"
    );
    // --refresh serves the directory's own listing; the shared one is left to its publisher.
    let refresh = OpenOptions {
        refresh_index: true,
        ..options(tmp.path(), "n4")
    };
    let ds = open("https://h/train/", &refresh, &store).unwrap();
    let Dataset::RemoteDir(r) = &ds else {
        panic!("loose objects, not {ds:?}")
    };
    assert_eq!(r.shared, None);
    assert_eq!(store.uploads.load(SeqCst), 0, "nothing uploaded over HTTP");
    files.insert("new.JPEG".into(), noise(7, 100));
    assert_eq!(walk(&serve(ds)), files);
}
