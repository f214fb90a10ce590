//! The router driven directly, with no mount (no root, no /dev/fuse): lookups, listings and
//! byte-identical reads over the real ImageNet sample pack (a synthetic tree of ~70 KB files
//! when `../shared` is absent), push-ahead on in-order and shuffled walks, drop-cache
//! invalidation, the control directory and decoded views.

mod common;

use loosefs::catalog::{FsError, Kind};
use loosefs::fs::Fs;
use loosefs::ino::ROOT_INO;
use loosefs::pack::reader::Pack;
use loosefs::report::{DropCacheReport, Report, WarmCommandReport, WarmState};
use loosefs::view::Views;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The ImageNet sample when present, else 1000 files of ~100 KB in 10 directories: the same
/// count and size, so a shuffled order lands near an earlier read as often as it does there.
fn dataset(tmp: &Path) -> PathBuf {
    if let Some(p) = common::shared_sample() {
        return p;
    }
    let d = tmp.join("synthetic");
    for k in 0..1000u32 {
        let dir = d.join(format!("class_{}", k % 10));
        std::fs::create_dir_all(&dir).unwrap();
        let mut x = k.wrapping_mul(2654435761).max(1);
        let bytes: Vec<u8> = (0..90_000 + k * 29)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        std::fs::write(dir.join(format!("s{k:04}.bin")), bytes).unwrap();
    }
    d
}

/// Packs the dataset with the library's packer; returns (source, pack).
fn packed(tmp: &Path) -> (PathBuf, Pack) {
    let src = dataset(tmp);
    let out = tmp.join("s.pack");
    let opts = loosefs::packer::PackOptions {
        jobs: 2,
        align: loosefs::pack::DEFAULT_ALIGN,
        follow_links: false,
        force: true,
        progress: loosefs::progress::Progress::None,
        source: Default::default(),
    };
    loosefs::packer::pack_dir(&src, &out, &opts).unwrap();
    (src, Pack::open(&out).unwrap())
}

fn server(pack: Pack, views: Views, push_ahead: usize) -> Arc<Fs> {
    Arc::new(Fs::local(pack, views, common::server_options(push_ahead)).unwrap())
}

/// Reads `[offset, offset+size)` of `ino` through the router (waiting for a decode thread).
fn read(s: &Fs, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
    let (tx, rx) = std::sync::mpsc::channel();
    s.read(ino, offset, size, move |r| {
        let _ = tx.send(r.map(<[u8]>::to_vec));
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

/// The whole content of `ino`, read in 128 KiB requests as the kernel sends them.
fn read_all(s: &Fs, ino: u64) -> Vec<u8> {
    let size = s.getattr(ino).unwrap().attr.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let b = read(s, ino, out.len() as u64, 128 << 10).unwrap();
        assert!(!b.is_empty(), "short read at {} of {size}", out.len());
        out.extend_from_slice(&b);
    }
    assert!(
        read(s, ino, size, 4096).unwrap().is_empty(),
        "data past the end"
    );
    out
}

/// Every file under `dir`: (relative path, inode), in listing order (= pack order).
fn walk(s: &Fs, dir: u64, prefix: &str, out: &mut Vec<(String, u64)>) {
    let mut entries = Vec::new();
    s.readdir(dir, 0, |e| {
        entries.push((String::from_utf8_lossy(&e.name).into_owned(), e.ino, e.kind));
        false
    })
    .unwrap();
    for (name, ino, kind) in entries {
        if name == "." || name == ".." {
            continue;
        }
        let path = format!("{prefix}{name}");
        assert_eq!(
            s.lookup(dir, name.as_bytes()).unwrap().attr.ino,
            ino,
            "{path}"
        );
        match kind {
            Kind::Dir => walk(s, ino, &format!("{path}/"), out),
            Kind::File => out.push((path, ino)),
        }
    }
}

/// A permutation of `0..n` from a fixed seed.
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    common::shuffle(&mut order, 0x9e37_79b9_7f4a_7c15);
    order
}

fn control<T: serde::de::DeserializeOwned>(s: &Fs, name: &str) -> T {
    let dir = s.lookup(ROOT_INO, b".loosefs").unwrap().attr.ino;
    let e = s.lookup(dir, name.as_bytes()).unwrap();
    assert_eq!(e.ttl, Duration::ZERO, "control files are never cached");
    serde_json::from_slice(&read(s, e.attr.ino, 0, 1 << 20).unwrap()).unwrap()
}

#[test]
fn every_file_is_listed_looked_up_and_read_byte_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let s = server(pack, Views::default(), 0);
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    let want = common::files(&src);
    assert_eq!(
        files.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
        want,
        "listings show every source file, in pack order"
    );
    let mut bytes = 0;
    for (path, ino) in &files {
        let got = read_all(&s, *ino);
        assert!(
            got == std::fs::read(src.join(path)).unwrap(),
            "{path}: bytes differ"
        );
        bytes += got.len() as u64;
    }
    // Every byte served once per read, counted in the typed report.
    let r: Report = control(&s, "stats");
    assert_eq!(r.bytes_served, bytes);
    assert_eq!(r.pack.samples, files.len() as u64);
    assert_eq!(r.errors, 0);
    assert!(r.requests["read"] >= files.len() as u64);
    assert!(r.decode.is_none());
    // Errors by kind.
    assert_eq!(
        s.lookup(ROOT_INO, b"no-such").unwrap_err(),
        FsError::NotFound
    );
    assert_eq!(s.lookup(files[0].1, b"x").unwrap_err(), FsError::NotDir);
    assert_eq!(read(&s, ROOT_INO, 0, 10).unwrap_err(), FsError::IsDir);
    assert_eq!(s.getattr(0).unwrap_err(), FsError::NotFound);
    assert_eq!(s.getattr(u64::MAX >> 3).unwrap_err(), FsError::NotFound);
}

#[test]
fn push_ahead_follows_an_in_order_walk_and_seldom_a_shuffled_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let pack_path = pack.path().to_path_buf();
    type Stored = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
    let recorder = |s: &Fs| -> Stored {
        let stored: Stored = Arc::default();
        let st = stored.clone();
        s.start_push(Box::new(move |ino, data| {
            st.lock().unwrap().push((ino, data.to_vec()));
            Ok(())
        }));
        stored
    };
    let s = server(pack, Views::default(), 64);
    let stored = recorder(&s);
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    // Push-ahead goes as far as the stream's look-ahead, which grows with the run: a reader
    // that has read n files in order gets about n more pushed. Pushing never reads the device
    // itself, so the pack is brought into the page cache first (the pack was written with its
    // pages dropped, and read-ahead completes at the disk's pace). Files pushed are not read
    // (the kernel would serve them).
    std::fs::read(&pack_path).unwrap();
    let mut reads = 0;
    for (_, ino) in &files[..200] {
        if stored.lock().unwrap().len() >= 8 {
            break;
        }
        if !stored.lock().unwrap().iter().any(|(i, _)| i == ino) {
            read_all(&s, *ino);
            reads += 1;
            // A training step between samples, long enough for the push thread to do what
            // this read asked of it (a completion signal, not a sleep).
            s.settle_push();
        }
    }
    assert!(
        reads < 200,
        "some files were pushed before the reader reached them: {:?} {:?}",
        s.report().push_ahead,
        s.report().prefetch
    );
    common::wait_until("push-ahead", 20, || stored.lock().unwrap().len() >= 8);
    let pushed = stored.lock().unwrap().clone();
    let pos = |ino: u64| files.iter().position(|f| f.1 == ino).unwrap();
    assert!(pos(pushed[0].0) >= 3, "pushed from the third file on");
    // A file pushed between the check above and its READ resets the marks (as a dropped copy
    // does) and may be pushed again; without that race each is pushed once, in pack order.
    if s.report().push_ahead.resets == 0 {
        for w in pushed.windows(2) {
            assert!(pos(w[1].0) > pos(w[0].0), "pushed once each, in pack order");
        }
    }
    for (ino, data) in &pushed {
        let path = &files[pos(*ino)].0;
        assert!(
            *data == std::fs::read(src.join(path)).unwrap(),
            "{path}: pushed bytes differ"
        );
    }
    // The push thread may still be running: the counter is at least what was stored then.
    assert!(s.report().push_ahead.samples >= pushed.len() as u64);
    // A shuffled walk is no stream: a rare pair of adjacent samples starts one, but the runs
    // seen (one sample long) give it no look-ahead, so nothing is pushed. Reads of samples the
    // kernel holds (pushed) are skipped, as the kernel itself would serve them.
    let s = server(Pack::open(&pack_path).unwrap(), Views::default(), 64);
    let stored = recorder(&s);
    let mut reads = 0;
    for k in shuffled(files.len()) {
        let ino = files[k].1;
        if !stored.lock().unwrap().iter().any(|(i, _)| *i == ino) {
            read_all(&s, ino);
            reads += 1;
        }
    }
    // Every push the walk asked for is done before counting.
    s.settle_push();
    let pushed = stored.lock().unwrap().len();
    assert!(
        pushed * 100 < files.len(),
        "{pushed} of {} samples pushed for a shuffled walk ({reads} READs)",
        files.len()
    );
}

#[test]
fn read_ahead_serves_what_it_reads_in_pack_order_and_reads_nothing_for_a_shuffled_walk() {
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let pack_path = pack.path().to_path_buf();
    let pack_bytes: u64 = {
        let s = server(Pack::open(&pack_path).unwrap(), Views::default(), 0);
        s.report().pack.bytes
    };
    // In pack order: (almost) every byte is read ahead before its READ, each once, and what
    // is read ahead is served.
    let s = server(pack, Views::default(), 0);
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    let _: DropCacheReport = control(&s, "drop-cache");
    for (_, ino) in &files {
        read_all(&s, *ino);
    }
    let p = s.report().prefetch;
    assert!(
        p.bytes >= pack_bytes * 9 / 10 && p.bytes <= pack_bytes * 11 / 10,
        "{p:?} for {pack_bytes}-byte pack"
    );
    assert!(p.served_bytes >= p.bytes * 98 / 100, "{p:?}");
    // Shuffled: no read-ahead to speak of. A shuffled walk makes a pair of neighbours now and
    // then; until 8 such runs have been seen, each gets as many samples of look-ahead as it
    // has read (2), then none: on 1000 samples that is under 3% of the pack.
    let s = server(Pack::open(&pack_path).unwrap(), Views::default(), 0);
    let _: DropCacheReport = control(&s, "drop-cache");
    for k in shuffled(files.len()) {
        read_all(&s, files[k].1);
    }
    let p = s.report().prefetch;
    assert!(
        p.bytes * 100 <= pack_bytes * 3,
        "{p:?} for {pack_bytes}-byte pack"
    );
}

#[test]
fn drop_cache_invalidates_every_served_inode_and_reads_go_back_to_storage() {
    // On the disk: a tmpfs `/tmp` (Debian 13) cannot evict the pack's pages.
    let tmp = common::disk_tempdir();
    let (_src, pack) = packed(tmp.path());
    let pack_path = pack.path().to_path_buf();
    let s = server(pack, Views::default(), 0);
    let invalidated: Arc<Mutex<Vec<u64>>> = Arc::default();
    let inv = invalidated.clone();
    s.set_invalidate(Box::new(move |ino| inv.lock().unwrap().push(ino)));
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    let served: Vec<u64> = files.iter().step_by(7).map(|f| f.1).collect();
    for ino in &served {
        read_all(&s, *ino);
    }
    // Bring the whole pack into the page cache, so eviction has something to do.
    let pack_len = std::fs::read(&pack_path).unwrap().len() as u64;
    let d: DropCacheReport = control(&s, "drop-cache");
    assert_eq!(d.error, None);
    assert_eq!(d.inodes_invalidated, served.len() as u64);
    let mut got = invalidated.lock().unwrap().clone();
    got.sort();
    let mut want = served.clone();
    want.sort();
    assert_eq!(got, want, "exactly the inodes served are invalidated");
    assert!(d.pack_resident_bytes_before >= pack_len * 9 / 10, "{d:?}");
    assert!(
        d.pack_resident_bytes_after < pack_len / 20,
        "the pack was not evicted: {d:?}"
    );
    // The next reads are served (and counted) again.
    let before = s.report().bytes_served;
    let again = read_all(&s, served[0]);
    assert_eq!(s.report().bytes_served, before + again.len() as u64);
}

#[test]
fn control_directory_is_hidden_reachable_and_runs_commands_once_per_lookup() {
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let s = server(pack, Views::default(), 0);
    let mut root = Vec::new();
    s.readdir(ROOT_INO, 0, |e| {
        root.push(e.name.to_vec());
        false
    })
    .unwrap();
    assert!(
        !root.contains(&b".loosefs".to_vec()),
        "not listed in the root"
    );
    let dir = s.lookup(ROOT_INO, b".loosefs").unwrap();
    assert_eq!(dir.attr.kind, Kind::Dir);
    let mut listed = Vec::new();
    s.readdirplus(dir.attr.ino, 0, |e, entry| {
        assert_eq!(entry.ttl, Duration::ZERO, "control listings are not cached");
        listed.push(String::from_utf8_lossy(&e.name).into_owned());
        false
    })
    .unwrap();
    assert_eq!(
        listed,
        [".", "..", "stats", "metrics", "order"],
        "commands are reachable by name only"
    );
    assert_eq!(
        s.lookup(dir.attr.ino, b"no-such").unwrap_err(),
        FsError::NotFound
    );
    // Each lookup is a fresh snapshot; forgetting it frees it.
    let a = s.lookup(dir.attr.ino, b"stats").unwrap();
    let b = s.lookup(dir.attr.ino, b"stats").unwrap();
    assert_ne!(a.attr.ino, b.attr.ino);
    assert_eq!(s.lookup(a.attr.ino, b"x").unwrap_err(), FsError::NotDir);
    assert_eq!(
        read(&s, a.attr.ino, 0, 1 << 20).unwrap().len() as u64,
        a.attr.size
    );
    s.forget(a.attr.ino);
    assert_eq!(read(&s, a.attr.ino, 0, 10).unwrap_err(), FsError::NotFound);
    // warm runs once per lookup and reaches done; stats counts control reads.
    let w: WarmCommandReport = control(&s, "warm");
    assert!(w.started);
    common::wait_until("warm", 20, || s.report().warm.state == WarmState::Done);
    let r: Report = control(&s, "stats");
    assert_eq!(r.warm.bytes_done, r.warm.bytes_total);
    assert!(r.requests["control"] >= 3);
    // Commands are the owner's (uid 1000 here) and root's; stats is anyone's.
    let d = dir.attr.ino;
    assert_eq!(
        s.lookup_as(1234, d, b"drop-cache").unwrap_err(),
        FsError::Denied
    );
    assert_eq!(s.lookup_as(1234, d, b"warm").unwrap_err(), FsError::Denied);
    assert!(s.lookup_as(1234, d, b"stats").is_ok());
    assert!(s.lookup_as(0, d, b"drop-cache").is_ok());
    assert!(s.lookup_as(1000, d, b"warm").is_ok());
}

/// The generated JPEG tree packed under `tmp` by the CLI, and `.npy` views of it.
fn npy_pack(tmp: &Path) -> (PathBuf, Views) {
    let src = tmp.join("jpegs");
    common::make_tree(&src);
    let out = tmp.join("j.pack");
    let o = common::loosefs(&[&"pack", &src, &out]);
    assert!(o.status.success());
    let views = Views {
        npy: true,
        ..Views::default()
    };
    (out, views)
}

#[test]
fn decoded_views_are_listed_sized_and_served_through_the_decoder() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, views) = npy_pack(tmp.path());
    let s = server(Pack::open(&out).unwrap(), views, 0);
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    let npys: Vec<&(String, u64)> = files.iter().filter(|(p, _)| p.ends_with(".npy")).collect();
    let jpegs = files.iter().filter(|(p, _)| p.ends_with(".JPEG")).count();
    assert_eq!(npys.len(), jpegs, "one .npy beside every JPEG");
    for (path, ino) in npys {
        let bytes = read_all(&s, *ino);
        assert!(bytes.starts_with(b"\x93NUMPY\x01\x00"), "{path}");
        let header = String::from_utf8_lossy(&bytes[10..128]);
        let shape = header.split("'shape': (").nth(1).unwrap();
        let dims: Vec<u64> = shape
            .split(')')
            .next()
            .unwrap()
            .split(", ")
            .filter_map(|d| d.parse().ok())
            .collect();
        assert_eq!(dims.len(), 3, "{header}");
        assert_eq!(
            bytes.len() as u64,
            128 + dims[0] * dims[1] * dims[2],
            "{path}"
        );
    }
    let d = s.report().decode.expect("decode section");
    assert_eq!(d.decodes, jpegs as u64);
    assert_eq!(d.failures, 0);
}

#[test]
fn a_top_level_loosefs_in_a_foreign_pack_is_never_listed_and_the_control_directory_wins() {
    use loosefs::pack::writer::{EntryMeta, PackWriter, ROOT};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("foreign.pack");
    let meta = |mode| EntryMeta {
        mode,
        mtime_sec: 1_700_000_000,
        mtime_nsec: 0,
    };
    let mut w =
        PackWriter::new(std::fs::File::create(&path).unwrap(), 4096, meta(0o40755)).unwrap();
    let d = w.add_dir(ROOT, ".loosefs", meta(0o40755)).unwrap();
    w.add_file(
        d,
        "stats",
        meta(0o100644),
        b"mine",
        crc32fast::hash(b"mine"),
        None,
    )
    .unwrap();
    w.add_file(
        ROOT,
        "x.bin",
        meta(0o100644),
        b"x",
        crc32fast::hash(b"x"),
        None,
    )
    .unwrap();
    w.finish().unwrap();
    let s = server(Pack::open(&path).unwrap(), Views::default(), 0);
    let mut names = Vec::new();
    s.readdir(ROOT_INO, 0, |e| {
        names.push(String::from_utf8_lossy(&e.name).into_owned());
        false
    })
    .unwrap();
    assert_eq!(names, [".", "..", "x.bin"]);
    // Every lookup of the name reaches the control directory, listed or not.
    let r: Report = control(&s, "stats");
    assert_eq!(r.pack.samples, 2);
}

/// The local pack storage under observation: its generation moves on demand (as a remote
/// block cache's does when it evicts: cached bytes may have been fetched again, so samples are
/// checked again), and it records read-ahead's requests and every release.
struct Observed {
    inner: loosefs::storage::local::LocalStorage,
    generation: std::sync::atomic::AtomicU64,
    asked: Mutex<Vec<std::ops::Range<u64>>>,
    released: Mutex<Vec<std::ops::Range<u64>>>,
}

impl Observed {
    fn new(pack: &Pack) -> Arc<Observed> {
        Arc::new(Observed {
            inner: pack.storage().unwrap(),
            generation: Default::default(),
            asked: Mutex::default(),
            released: Mutex::default(),
        })
    }
}

impl loosefs::storage::Storage for Observed {
    fn len(&self, obj: u32) -> u64 {
        self.inner.len(obj)
    }
    fn read_at(&self, obj: u32, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(obj, off, buf)
    }
    fn will_need(&self, obj: u32, r: &std::ops::Range<u64>) {
        // Only read-ahead's requests (the order's, and the stream detector's, which claims
        // from the same ledger): a READ that misses (pages another process's drop_caches
        // took) asks again from the reader's thread.
        let name = std::thread::current().name().map(str::to_owned);
        if matches!(name.as_deref(), Some("loosefs-order" | "loosefs-prefetch")) {
            self.asked.lock().unwrap().push(r.clone());
        }
        self.inner.will_need(obj, r)
    }
    fn resident_bytes(&self, obj: u32, r: &std::ops::Range<u64>) -> u64 {
        self.inner.resident_bytes(obj, r)
    }
    fn resident(&self, obj: u32, r: &std::ops::Range<u64>) -> bool {
        self.inner.resident(obj, r)
    }
    fn release(&self, obj: u32, r: &std::ops::Range<u64>) -> std::io::Result<()> {
        self.released.lock().unwrap().push(r.clone());
        self.inner.release(obj, r)
    }
    fn evict(&self, obj: u32, r: &std::ops::Range<u64>) -> std::io::Result<()> {
        self.inner.evict(obj, r)
    }
    fn pin(&self, obj: u32, r: &std::ops::Range<u64>) -> std::io::Result<()> {
        self.inner.pin(obj, r)
    }
    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn drop_cache_invalidates_every_file_served_even_after_the_storage_generation_moved() {
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let storage = Observed::new(&pack);
    let catalog = Arc::new(loosefs::catalog::native::NativeCatalog::new(
        pack,
        Views::default(),
    ));
    let s = Fs::new(catalog, storage.clone(), common::server_options(0));
    let invalidated = Arc::new(Mutex::new(Vec::new()));
    let inv = invalidated.clone();
    s.set_invalidate(Box::new(move |ino| inv.lock().unwrap().push(ino)));
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    for (_, ino) in &files[..10] {
        read_all(&s, *ino);
    }
    // An eviction elsewhere in the cache: every sample is checked again on its next read.
    storage
        .generation
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    read_all(&s, files[10].1);
    let r = s.drop_cache();
    let mut got = invalidated.lock().unwrap().clone();
    got.sort();
    let mut want: Vec<u64> = files[..11].iter().map(|f| f.1).collect();
    want.sort();
    assert_eq!(got, want, "{r:?}");
}

/// A server over the sample pack with an observed storage, an order window of `window`
/// bytes and no other read-ahead (no streams, no push), and its files in pack order.
fn order_server(tmp: &Path, window: u64) -> (Arc<Fs>, Arc<Observed>, Vec<(String, u64)>) {
    let (_src, pack) = packed(tmp);
    let storage = Observed::new(&pack);
    let catalog = Arc::new(loosefs::catalog::native::NativeCatalog::new(
        pack,
        Views::default(),
    ));
    let mut opts = common::server_options(0);
    opts.readahead.window_max = 0;
    opts.readahead.order_window = window;
    let s = Arc::new(Fs::new(catalog, storage.clone(), opts));
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    (s, storage, files)
}

/// The inode of `.loosefs/order`.
fn order_ino(s: &Fs) -> u64 {
    let dir = s.lookup(ROOT_INO, b".loosefs").unwrap().attr.ino;
    s.lookup(dir, b"order").unwrap().attr.ino
}

/// Announces `paths` as process `pid` would write them to `.loosefs/order`: in writes of
/// `chunk` bytes, so lines are split across writes.
fn announce(s: &Fs, pid: u32, paths: &[&str], chunk: usize) {
    let ino = order_ino(s);
    assert_eq!(s.setattr(ino, Some(0)).unwrap().attr.size, 0);
    let text: String = paths.iter().map(|p| format!("{p}\n")).collect();
    for (k, part) in text.as_bytes().chunks(chunk).enumerate() {
        let n = s.write(ino, (k * chunk) as u64, part, pid).unwrap();
        assert_eq!(n as usize, part.len());
    }
}

fn r_bytes(s: &Fs) -> u64 {
    order_report(s).read_ahead_bytes
}

fn order_report(s: &Fs) -> loosefs::report::OrderReport {
    control::<Report>(s, "stats").order
}

#[test]
fn an_announced_shuffled_order_is_read_ahead_in_storage_order_and_served_from_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, storage, files) = order_server(tmp.path(), 1 << 30);
    let order: Vec<(String, u64)> = shuffled(files.len())
        .into_iter()
        .map(|k| files[k].clone())
        .collect();
    // Relative paths, `./` paths and absolute paths under the mountpoint all name files.
    let paths: Vec<String> = (order.iter().enumerate())
        .map(|(k, (p, _))| match k % 3 {
            0 => p.clone(),
            1 => format!("./{p}"),
            _ => format!("/test/{p}"),
        })
        .collect();
    let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
    // One write, as the kernel sends up to 128 KiB of a write(2) at a time.
    announce(&s, 7, &refs, 128 << 10);
    let n = files.len() as u64;
    let r = order_report(&s);
    assert_eq!(
        (r.live, r.announced, r.samples, r.unresolved_paths),
        (1, 1, n, 0)
    );
    // The reader waits for its next sample to be asked for (the order thread runs on its own):
    // then every sample read was read ahead first.
    for (k, (path, ino)) in order.iter().enumerate() {
        common::wait_until("the next sample read ahead", 20, || {
            order_report(&s).read_ahead > k as u64
        });
        let bytes = read_all(&s, *ino);
        assert_eq!(
            bytes.len() as u64,
            s.getattr(*ino).unwrap().attr.size,
            "{path}"
        );
    }
    // Every sample asked for about once (a page two samples share may be asked again after
    // the first was served and released), in batches sorted into pack order, neighbours merged.
    let asked = storage.asked.lock().unwrap().clone();
    let asked_bytes: u64 = asked.iter().map(|r| r.end - r.start).sum();
    let sample_bytes: u64 = (order.iter())
        .map(|(_, ino)| s.getattr(*ino).unwrap().attr.size)
        .sum();
    assert!(
        asked_bytes * 100 <= sample_bytes * 102 + 4096 * n,
        "{asked_bytes} bytes asked for {sample_bytes}"
    );
    assert_eq!(r_bytes(&s), sample_bytes, "each sample read ahead once");
    let ascending = asked.windows(2).filter(|w| w[0].end <= w[1].start).count();
    assert!(ascending * 2 > asked.len(), "batches not in pack order");
    // Every sample's bytes lie in what was asked (its pages may come from two requests).
    let mut union: Vec<std::ops::Range<u64>> = Vec::new();
    let mut by_start = asked.clone();
    by_start.sort_by_key(|r| r.start);
    for r in by_start {
        match union.last_mut() {
            Some(u) if r.start <= u.end => u.end = u.end.max(r.end),
            _ => union.push(r),
        }
    }
    for (path, ino) in &order {
        let ext = s.catalog().extent(*ino).unwrap();
        assert!(
            union
                .iter()
                .any(|a| a.start <= ext.range.start && ext.range.end <= a.end),
            "{path} {:?}: {:?}",
            ext.range,
            union
                .iter()
                .filter(|a| a.end + 300_000 > ext.range.start && a.start < ext.range.end + 300_000)
                .collect::<Vec<_>>()
        );
    }
    let r = order_report(&s);
    assert_eq!(
        (
            r.read_ahead,
            r.served,
            r.left,
            r.abandoned,
            r.released_unread
        ),
        (n, n, 0, 0, 0)
    );
    // Served in full, the order is finished: nothing held, nothing live.
    assert_eq!((r.live, r.window_bytes), (0, 0));
}

#[test]
fn an_order_holds_at_most_its_window_unserved_and_moves_on_as_samples_are_served() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 4 << 20;
    let (s, _storage, files) = order_server(tmp.path(), window);
    let order: Vec<(String, u64)> = shuffled(files.len())
        .into_iter()
        .map(|k| files[k].clone())
        .collect();
    let refs: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
    announce(&s, 7, &refs, 1 << 20);
    let largest = files
        .iter()
        .map(|(_, ino)| s.getattr(*ino).unwrap().attr.size)
        .max()
        .unwrap();
    common::wait_until("a first window read ahead", 20, || {
        order_report(&s).read_ahead > 0
    });
    for (k, (_, ino)) in order.iter().enumerate() {
        let r = order_report(&s);
        assert!(
            r.window_bytes <= window + largest,
            "{} bytes held",
            r.window_bytes
        );
        // Within the window the order is read ahead as it is served: the sample about to be
        // read is read ahead before it is asked for.
        common::wait_until("the next sample read ahead within the window", 20, || {
            order_report(&s).read_ahead > k as u64
        });
        read_all(&s, *ino);
    }
    let r = order_report(&s);
    assert_eq!((r.served, r.left, r.abandoned), (files.len() as u64, 0, 0));
    assert!(
        r.read_ahead > 4 * window / largest,
        "the window never moved: {r:?}"
    );
}

#[test]
fn reads_off_the_announced_order_abandon_it_and_release_what_it_read_ahead() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, storage, files) = order_server(tmp.path(), 1 << 30);
    let (announced, others) = files.split_at(files.len() / 2);
    let refs: Vec<&str> = announced.iter().map(|(p, _)| p.as_str()).collect();
    announce(&s, 7, &refs, 4096);
    common::wait_until("the order read ahead", 20, || {
        order_report(&s).read_ahead > 0
    });
    // A stale order: the reader reads the other half.
    for (_, ino) in &others[..64] {
        read_all(&s, *ino);
    }
    let r = order_report(&s);
    assert_eq!((r.abandoned, r.live, r.window_bytes), (1, 0, 0), "{r:?}");
    // Only the ramp's first bytes were read ahead for it (it never proved right), and all of
    // it is released.
    assert!(r.read_ahead_bytes <= (9 << 20), "{r:?}");
    assert_eq!(r.released_unread, r.read_ahead, "{r:?}");
    let released = storage.released.lock().unwrap().clone();
    for (path, ino) in &announced[..r.read_ahead as usize] {
        let ext = s.catalog().extent(*ino).unwrap();
        assert!(
            released
                .iter()
                .any(|x| x.start <= ext.range.start && ext.range.end <= x.end),
            "{path} kept"
        );
    }
    // Reads go on unharmed, and once abandoned the reads are no longer checked.
    for (_, ino) in &others[64..] {
        read_all(&s, *ino);
    }
    assert!(order_report(&s).left <= 64);
}

#[test]
fn announcements_replace_their_process_order_and_refuse_what_is_not_an_order() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, _storage, files) = order_server(tmp.path(), 0);
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    announce(&s, 7, &paths[..100], 64);
    announce(&s, 8, &paths[100..150], 64);
    announce(&s, 7, &paths[200..210], 64);
    let r = order_report(&s);
    assert_eq!((r.announced, r.live, r.samples), (3, 2, 60), "{r:?}");
    // Unknown paths, directories and paths outside the mount are counted, not fatal.
    announce(
        &s,
        9,
        &["no/such.JPEG", "", "/elsewhere/x.JPEG", paths[0]],
        7,
    );
    let dir0 = paths[0].split('/').next().unwrap();
    announce(&s, 10, &[dir0], 64);
    let r = order_report(&s);
    assert_eq!((r.unresolved_paths, r.samples), (3, 61), "{r:?}");
    // Writes must continue the announcement; nothing but the order file takes writes.
    let order = order_ino(&s);
    assert!(matches!(
        s.write(order, 5, b"x\n", 11),
        Err(FsError::Invalid(_))
    ));
    s.write(order, 0, b"abc", 11).unwrap();
    assert!(matches!(
        s.write(order, 2, b"x\n", 11),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        s.write(order, 3, &[b'a'; 5000], 11),
        Err(FsError::Invalid(_))
    ));
    let dir = s.lookup(ROOT_INO, b".loosefs").unwrap().attr.ino;
    let stats = s.lookup(dir, b"stats").unwrap().attr.ino;
    assert_eq!(s.write(stats, 0, b"x", 11), Err(FsError::ReadOnly));
    assert_eq!(s.write(files[0].1, 0, b"x", 11), Err(FsError::ReadOnly));
    assert_eq!(s.setattr(files[0].1, Some(0)), Err(FsError::ReadOnly));
    assert_eq!(s.setattr(order, Some(5)), Err(FsError::ReadOnly));
    assert_eq!(s.write(ROOT_INO, 0, b"x", 11), Err(FsError::ReadOnly));
}

/// A server of `pack` pushing ahead (64 samples) whose only read-ahead is an announced order's
/// (no stream detector), with a 1 GiB order window.
fn push_order_server(pack: Pack) -> Arc<Fs> {
    let storage = Observed::new(&pack);
    let catalog = Arc::new(loosefs::catalog::native::NativeCatalog::new(
        pack,
        Views::default(),
    ));
    let mut opts = common::server_options(64);
    opts.readahead.window_max = 0; // no streams: only the order reads ahead
    opts.readahead.order_window = 1 << 30;
    Arc::new(Fs::new(catalog, storage, opts))
}

#[test]
fn push_ahead_follows_an_announced_order_from_a_few_samples_past_each_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let s = push_order_server(pack);
    // What the push thread stores, and which READ each store came after (its position).
    type Stored = Arc<Mutex<Vec<(u64, Vec<u8>, usize)>>>;
    let stored: Stored = Arc::default();
    let at = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (st, at2) = (stored.clone(), at.clone());
    s.start_push(Box::new(move |ino, data| {
        let after = at2.load(std::sync::atomic::Ordering::SeqCst);
        st.lock().unwrap().push((ino, data.to_vec(), after));
        Ok(())
    }));
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    let order: Vec<(String, u64)> = shuffled(files.len())
        .into_iter()
        .map(|k| files[k].clone())
        .collect();
    let refs: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
    announce(&s, 7, &refs, 128 << 10);
    let n = order.len();
    let pos: std::collections::HashMap<u64, usize> = (order.iter().enumerate())
        .map(|(k, (_, ino))| (*ino, k))
        .collect();
    // The reader reads the samples it was not given (the kernel serves those it was), each
    // once read ahead; after each READ the push thread finishes what it was asked.
    let mut reads = 0;
    for (k, (_, ino)) in order.iter().enumerate() {
        if stored.lock().unwrap().iter().any(|p| p.0 == *ino) {
            continue;
        }
        common::wait_until("the next sample read ahead", 20, || {
            order_report(&s).read_ahead > k as u64
        });
        at.store(k, std::sync::atomic::Ordering::SeqCst);
        read_all(&s, *ino);
        reads += 1;
        s.settle_push();
    }
    let pushed = stored.lock().unwrap().clone();
    assert!(
        pushed.len() * 2 > n,
        "{} of {n} samples pushed ({reads} READs)",
        pushed.len()
    );
    for (ino, data, after) in &pushed {
        let (path, p) = (&order[pos[ino]].0, pos[ino]);
        // Pushed along the order, starting a few positions past the READ that asked for it
        // (the reader reads those itself while the push gets ahead).
        assert!(
            p > after + 8,
            "{path} (position {p}) pushed after the READ at {after}"
        );
        assert_eq!(data, &std::fs::read(src.join(path)).unwrap(), "{path}");
    }
    let once: std::collections::HashSet<u64> = pushed.iter().map(|p| p.0).collect();
    assert_eq!(once.len(), pushed.len(), "a sample pushed twice");
    assert_eq!(reads + pushed.len(), n);
    // Pushed samples leave the order's window as served ones do: the order ran to its end.
    let r = order_report(&s);
    assert_eq!((r.served, r.left, r.abandoned), (n as u64, 0, 0));
    assert_eq!((r.live, r.window_bytes), (0, 0));
    let p = s.report().push_ahead;
    assert_eq!(p.samples, pushed.len() as u64);
    // A READ of a pushed sample after the order finished (it crossed the push, or the kernel
    // dropped the copy) is not a read off the order.
    read_all(&s, pushed[pushed.len() / 2].0);
    assert_eq!(order_report(&s).left, 0);
}

#[test]
fn a_push_run_overtaken_by_its_reader_leaves_it_the_next_positions() {
    // Positions a run leaves to a reader that overtook it (`OVERTAKEN_LEAVE` in push.rs).
    const LEAVE: usize = 96;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("many");
    for k in 0..300u32 {
        let d = src.join(format!("c{}", k % 3));
        std::fs::create_dir_all(&d).unwrap();
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + k * 13) as u8).collect();
        std::fs::write(d.join(format!("f{k:03}.bin")), data).unwrap();
    }
    let out = tmp.path().join("many.pack");
    let o = common::loosefs(&[&"pack", &src, &out]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pack = Pack::open(&out).unwrap();
    let s = push_order_server(pack);
    // The first store waits, mid-run, until the reader has overtaken the run.
    type Stored = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
    let stored: Stored = Arc::default();
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let gate = Mutex::new(Some((started_tx, go_rx)));
    let st = stored.clone();
    s.start_push(Box::new(move |ino, data| {
        if let Some((tx, rx)) = gate.lock().unwrap().take() {
            tx.send(()).unwrap();
            rx.recv_timeout(Duration::from_secs(20)).unwrap();
        }
        st.lock().unwrap().push((ino, data.to_vec()));
        Ok(())
    }));
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    let n = files.len();
    assert_eq!(n, 300);
    let order: Vec<(String, u64)> = shuffled(n).into_iter().map(|k| files[k].clone()).collect();
    let refs: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
    announce(&s, 7, &refs, 128 << 10);
    common::wait_until("the whole order read ahead", 20, || {
        order_report(&s).read_ahead >= n as u64
    });
    // A READ at position 0: its run starts 8 positions on, at 9, and waits in that store.
    read_all(&s, order[0].1);
    started
        .recv_timeout(Duration::from_secs(20))
        .expect("the run's first store");
    // Meanwhile the reader reads positions 10 and 11 itself: it has overtaken the run.
    read_all(&s, order[10].1);
    read_all(&s, order[11].1);
    go.send(()).unwrap();
    s.settle_push();
    let pos: std::collections::HashMap<u64, usize> = (order.iter().enumerate())
        .map(|(k, (_, ino))| (*ino, k))
        .collect();
    let pushed = stored.lock().unwrap().clone();
    let at: Vec<usize> = pushed.iter().map(|(ino, _)| pos[ino]).collect();
    // The run went on past what it left the reader (12..=107) instead of pushing position 12
    // just ahead of it; what it left is pushed later only by runs that start past a READ.
    assert_eq!(
        at[..2],
        [9, 12 + LEAVE],
        "stores in order of position: {at:?}"
    );
    assert!(at.iter().all(|&p| p >= 9 && p != 10 && p != 11), "{at:?}");
    let once: std::collections::HashSet<usize> = at.iter().copied().collect();
    assert_eq!(once.len(), at.len(), "a sample pushed twice: {at:?}");
    for (ino, data) in &pushed {
        let path = &order[pos[ino]].0;
        assert_eq!(data, &std::fs::read(src.join(path)).unwrap(), "{path}");
    }
}

#[test]
fn decode_ahead_follows_an_announced_order_of_views() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, views) = npy_pack(tmp.path());
    let mut opts = common::server_options(0);
    opts.readahead.window_max = 0; // no streams: only the order reads ahead
    opts.decode.ahead = 4;
    let s = Arc::new(Fs::local(Pack::open(&out).unwrap(), views, opts).unwrap());
    let mut files = Vec::new();
    walk(&s, ROOT_INO, "", &mut files);
    // Reversed: no read continues the one before it in storage order.
    let order: Vec<(String, u64)> = (files.iter().rev())
        .filter(|(p, _)| p.ends_with(".npy"))
        .cloned()
        .collect();
    let refs: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
    announce(&s, 7, &refs, 128 << 10);
    let n = order.len() as u64;
    common::wait_until("the order read ahead", 20, || {
        order_report(&s).read_ahead >= n
    });
    let decode = |s: &Fs| s.report().decode.expect("decode section");
    read_all(&s, order[0].1);
    // The first READ decodes its view and the next 4 of the order.
    common::wait_until("decode-ahead", 20, || {
        let d = decode(&s);
        d.decodes >= 5 && d.decoded_ahead >= 4
    });
    let d = decode(&s);
    assert_eq!((d.misses, d.decoded_ahead, d.failures), (1, 4, 0));
    for (path, ino) in &order[1..5] {
        let bytes = read_all(&s, *ino);
        assert!(bytes.starts_with(b"\x93NUMPY\x01\x00"), "{path}");
    }
    let d = decode(&s);
    assert_eq!(
        d.misses, 1,
        "the next views of the order were decoded ahead: {d:?}"
    );
}

#[test]
fn an_announced_order_longer_than_twice_the_samples_is_refused_and_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, _storage, files) = order_server(tmp.path(), 1 << 30);
    let ino = order_ino(&s);
    let n = files.len();
    // Every sample twice (a sampler with replacement may repeat): taken whole.
    let twice: Vec<&str> = (files.iter().chain(files.iter()))
        .map(|(p, _)| p.as_str())
        .collect();
    announce(&s, 7, &twice, 64 << 10);
    assert_eq!(order_report(&s).samples, 2 * n as u64);
    // Ten times the samples, in 128 KiB writes as the kernel sends them: the writes past
    // 2x are refused with EINVAL, and the order keeps 2x at most.
    let text: String = (0..10 * n)
        .map(|k| format!("{}\n", files[k % n].0))
        .collect();
    let mut refused = None;
    for (k, part) in text.as_bytes().chunks(128 << 10).enumerate() {
        match s.write(ino, (k * (128 << 10)) as u64, part, 8) {
            Ok(w) => assert_eq!(w as usize, part.len()),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    match refused {
        Some(FsError::Invalid(why)) => assert!(why.contains("at most"), "{why}"),
        other => panic!("a 10x order was not refused: {other:?}"),
    }
    let r = order_report(&s);
    assert!(
        r.samples <= 4 * n as u64,
        "two orders hold {} records for {n} samples",
        r.samples
    );
    // A later write of the refused announcement does not continue it.
    assert!(matches!(
        s.write(ino, text.len() as u64, b"x\n", 8),
        Err(FsError::Invalid(_))
    ));
}

#[test]
fn at_most_16_orders_live_and_64_announcements_written_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, _storage, files) = order_server(tmp.path(), 1 << 30);
    let ino = order_ino(&s);
    let one = format!("{}\n", files[0].0);
    // 20 processes, one order of one sample each (its own: a sample another order read
    // ahead is left to that order): the oldest go, 16 stay live.
    for pid in 100..120u32 {
        let own = format!("{}\n", files[pid as usize - 99].0);
        s.write(ino, 0, own.as_bytes(), pid).unwrap();
    }
    let r = order_report(&s);
    assert_eq!((r.live, r.announced, r.samples), (16, 20, 16), "{r:?}");
    // 65 announcements being written at once (each one line so far): the first is forgotten,
    // so its next write no longer continues anything, while the 65th's does.
    for pid in 200..265u32 {
        s.write(ino, 0, one.as_bytes(), pid).unwrap();
    }
    let at = one.len() as u64;
    assert!(matches!(
        s.write(ino, at, one.as_bytes(), 200),
        Err(FsError::Invalid(_))
    ));
    assert_eq!(
        s.write(ino, at, one.as_bytes(), 264).unwrap() as usize,
        one.len()
    );
    assert!(order_report(&s).live <= 16);
}

#[test]
fn an_order_with_repeated_samples_is_read_ahead_once_per_sample_and_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 4 << 20;
    let (s, _storage, files) = order_server(tmp.path(), window);
    let n = files.len();
    // 2n draws with replacement, as `RandomSampler(replacement=True)` announces them.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let draws: Vec<usize> = (0..2 * n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        })
        .collect();
    let refs: Vec<&str> = draws.iter().map(|&k| files[k].0.as_str()).collect();
    announce(&s, 7, &refs, 128 << 10);
    let mut seen = std::collections::HashSet::new();
    for &k in &draws {
        if seen.insert(k) {
            // Each sample's first draw was read ahead before it is asked for: repeats never
            // hold the window.
            let want = seen.len() as u64;
            common::wait_until("the next new sample read ahead", 20, || {
                order_report(&s).read_ahead >= want
            });
        }
        read_all(&s, files[k].1);
    }
    let r = order_report(&s);
    assert_eq!(
        (r.read_ahead, r.left, r.abandoned, r.live, r.window_bytes),
        (seen.len() as u64, 0, 0, 0, 0),
        "{r:?}"
    );
}
