//! Every foreign format of `../shared/data/formats` (written by each format's own writer)
//! served in process, without a mount: the tree listed, looked up and read through the same
//! `Fs` the FUSE adaptor calls. Where the writer keeps the original JPEG bytes, each served
//! file is byte-identical to its source image and sits under its source's class; where it
//! re-encodes (GulpIO, FFCV), every file is a whole JPEG and the classes are the manifest's.

mod common;

use loosefs::catalog::Kind;
use loosefs::decode::DecodeOptions;
use loosefs::fs::{Fs, FsOptions};
use loosefs::ino::ROOT_INO;
use loosefs::readahead::ReadAheadOptions;
use loosefs::view::Views;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn formats_dir() -> Option<PathBuf> {
    let p = common::data_root()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"))
        .join("formats");
    if p.join("manifest.json").is_file() {
        Some(p)
    } else {
        common::missing_prerequisite(&format!("{} is missing", p.display()));
        None
    }
}

/// The manifest: class names in label order, and each source file's class.
fn manifest(dir: &Path) -> (Vec<String>, Vec<(PathBuf, String)>) {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let classes: Vec<String> = serde_json::from_value(v["classes"].clone()).unwrap();
    let sample = dir.join("../imagenet-sample");
    let files = (v["files"].as_array().unwrap().iter())
        .map(|f| {
            let rel = f.as_str().unwrap();
            (sample.join(rel), rel.split('/').next().unwrap().to_string())
        })
        .collect();
    (classes, files)
}

fn server(src: &Path, index: &Path) -> Fs {
    server_verifying(src, index, "lazy")
}

/// [`server`] with `--verify` `verify` (lazy or full).
fn server_verifying(src: &Path, index: &Path, verify: &str) -> Fs {
    let args = loosefs::open::OpenOptions {
        index_dir: Some(index.to_path_buf()),
        verify_full: verify == "full",
        ..Default::default()
    };
    let ds = loosefs::open::Dataset::open(src, &args, loosefs::progress::Progress::None).unwrap();
    loosefs::mount::compose::served(ds, Views::default(), server_options(), 64 << 20).unwrap()
}

/// The shared in-process options ([`common::server_options`]) with a smaller read-ahead
/// window, two threads and a 64 MiB single-threaded decoder without decode-ahead.
fn server_options() -> FsOptions {
    let base = common::server_options(0);
    FsOptions {
        readahead: ReadAheadOptions {
            window_max: 16 << 20,
            ..base.readahead
        },
        threads: 2,
        decode: DecodeOptions {
            cache_bytes: 64 << 20,
            frame_cache_bytes: 64 << 20,
            threads: 1,
            ahead: 0,
            ..base.decode
        },
        ..base
    }
}

fn read_all(s: &Fs, ino: u64) -> Vec<u8> {
    let size = s.getattr(ino).unwrap().attr.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let (tx, rx) = std::sync::mpsc::channel();
        s.read(ino, out.len() as u64, 64 << 10, move |r| {
            let _ = tx.send(r.map(<[u8]>::to_vec));
        });
        let b = rx.recv_timeout(Duration::from_secs(60)).unwrap().unwrap();
        assert!(!b.is_empty(), "short read at {} of {size}", out.len());
        out.extend_from_slice(&b);
    }
    out
}

/// Every file as (top directory, bytes), found by readdir and checked by lookup.
fn files(s: &Fs, dir: u64, top: Option<&str>, out: &mut Vec<(String, Vec<u8>)>) {
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
        assert_eq!(
            s.lookup(dir, name.as_bytes()).unwrap().attr.ino,
            ino,
            "{name}"
        );
        let top = top.unwrap_or(&name).to_string();
        match kind {
            Kind::Dir => files(s, ino, Some(&top), out),
            Kind::File => out.push((top, read_all(s, ino))),
        }
    }
}

/// Serves `rel` of the formats directory; checks it shows the 48 images under the right
/// classes. `exact`: byte-identical to the sources. `numbered`: classes shown as zero-padded
/// labels (`first_label` for class 0) rather than names.
fn check(rel: &str, exact: bool, numbered: Option<i64>) {
    let Some(dir) = formats_dir() else { return };
    let (classes, sources) = manifest(&dir);
    let index = tempfile::tempdir().unwrap();
    let s = server(&dir.join(rel), index.path());
    let mut got = Vec::new();
    files(&s, ROOT_INO, None, &mut got);
    assert_eq!(got.len(), sources.len(), "{rel}: files");
    let class_of: HashMap<Vec<u8>, String> = (sources.iter())
        .map(|(p, c)| (std::fs::read(p).unwrap(), c.clone()))
        .collect();
    let shown = |c: &str| match numbered {
        Some(first) => {
            let label = first + classes.iter().position(|x| x == c).unwrap() as i64;
            format!("{label:04}")
        }
        None => c.to_string(),
    };
    let mut dirs: Vec<&String> = got.iter().map(|(d, _)| d).collect();
    dirs.dedup();
    let want: Vec<String> = classes.iter().map(|c| shown(c)).collect();
    assert_eq!(
        dirs,
        want.iter().collect::<Vec<_>>(),
        "{rel}: class directories"
    );
    for (d, bytes) in &got {
        assert!(
            bytes.starts_with(b"\xff\xd8") && bytes.ends_with(b"\xff\xd9"),
            "{rel}/{d}: not a whole JPEG"
        );
        if exact {
            let c = class_of
                .get(bytes)
                .unwrap_or_else(|| panic!("{rel}/{d}: bytes of no source image"));
            assert_eq!(d, &shown(c), "{rel}: an image under another class");
        }
    }
}

#[test]
fn webdataset_shards_serve_the_original_jpegs_under_their_classes() {
    check("webdataset", true, None);
}

#[test]
fn mds_shards_serve_the_original_jpegs_under_their_classes() {
    check("mds", true, None);
}

#[test]
fn parquet_serves_the_original_jpegs_under_their_class_names() {
    check("hf-parquet", true, None);
}

#[test]
fn tfrecord_serves_the_original_jpegs_under_their_synsets() {
    check("tfrecord", true, None);
}

#[test]
fn a_zip_serves_its_members_as_its_own_tree() {
    let Some(dir) = formats_dir() else { return };
    let (_, sources) = manifest(&dir);
    let index = tempfile::tempdir().unwrap();
    let s = server(&dir.join("zip/images.zip"), index.path());
    let train = s.lookup(ROOT_INO, b"train").unwrap().attr.ino;
    for (p, class) in sources {
        let c = s.lookup(train, class.as_bytes()).unwrap().attr.ino;
        let name = p.file_name().unwrap().as_encoded_bytes();
        let ino = s.lookup(c, name).unwrap().attr.ino;
        assert_eq!(
            read_all(&s, ino),
            std::fs::read(&p).unwrap(),
            "{}",
            p.display()
        );
    }
}

/// The zip Python's `zipfile` wrote, scanned from its end record and central directory alone
/// (how an archive at a URL is indexed), gives exactly the samples the `zip` crate's scan
/// gives (which reads every local header), and each range holds its member's bytes.
#[test]
fn a_zips_central_directory_alone_places_every_member_as_its_local_headers_do() {
    let Some(dir) = formats_dir() else { return };
    let src = dir.join("zip/images.zip");
    let (ours, crates) = (
        loosefs::formats::zip::table::scan(&src).unwrap(),
        loosefs::formats::zip::scan(&src).unwrap(),
    );
    let shape = |s: &loosefs::formats::Scan| -> Vec<String> {
        (s.samples.iter())
            .map(|x| {
                format!(
                    "{} {:?} {:?} {} {:?}",
                    x.object, x.range, x.dir, x.name, x.crc32
                )
            })
            .chain(s.chunks.iter().map(|c| format!("{c:?}")))
            .collect()
    };
    assert_eq!(shape(&ours), shape(&crates));
    let bytes = std::fs::read(&src).unwrap();
    let (_, sources) = manifest(&dir);
    assert_eq!(ours.samples.len(), sources.len());
    for x in ours.samples.iter().filter(|x| x.object == 0) {
        let data = &bytes[x.range.start as usize..x.range.end as usize];
        assert_eq!(Some(crc32fast::hash(data)), x.crc32, "{}", x.name);
    }
}

#[test]
fn litdata_gulpio_and_ffcv_serve_whole_jpegs_under_every_class() {
    check("litdata", false, Some(0));
    check("gulpio", false, None);
    check("ffcv/jpg.beton", false, Some(0));
}

#[test]
fn every_format_is_detected_from_its_content() {
    use loosefs::formats::{Format, detect};
    let Some(dir) = formats_dir() else { return };
    for (rel, want) in [
        ("webdataset", Format::Tar),
        ("mds", Format::Mds),
        ("litdata", Format::Litdata),
        ("gulpio", Format::Gulpio),
        ("tfrecord", Format::Tfrecord),
        ("hf-parquet", Format::Parquet),
        ("ffcv/raw.beton", Format::Ffcv),
        ("zip/images.zip", Format::Zip),
    ] {
        assert_eq!(detect(&dir.join(rel)).unwrap(), want, "{rel}");
    }
    let e = format!("{:#}", detect(&dir.join("../imagenet-sample")).unwrap_err());
    assert!(
        e.contains("plain directory") && e.contains("loosefs pack"),
        "{e}"
    );
}

#[test]
fn an_index_is_built_once_and_rebuilt_when_a_file_changes() {
    use loosefs::formats::index::open;
    let Some(dir) = formats_dir() else { return };
    // A copy of the MDS dataset, so one of its shards can be touched.
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("mds");
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(dir.join("mds")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let args = loosefs::open::OpenOptions::default();
    let opts = args.scan_options().unwrap();
    let index = d.path().join("index");
    let first = open(&src, &opts, Some(&index), loosefs::progress::Progress::None).unwrap();
    assert!(first.built, "the first open builds the index");
    let again = open(&src, &opts, Some(&index), loosefs::progress::Progress::None).unwrap();
    assert!(!again.built, "an unchanged source reuses it");
    let shard = src.join("shard.00001.mds");
    let f = std::fs::File::options().write(true).open(&shard).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 30))
        .unwrap();
    drop(f);
    let changed = open(&src, &opts, Some(&index), loosefs::progress::Progress::None).unwrap();
    assert!(changed.built, "a shard with another mtime rebuilds it");
    // A different --label is another index, not a reuse of this one.
    let mut other = opts.clone();
    other.label = Some("label".into());
    assert!(
        open(
            &src,
            &other,
            Some(&index),
            loosefs::progress::Progress::None
        )
        .unwrap()
        .built
    );
}

/// A copy of `rel` of the formats directory in a temp dir.
fn copy_of(dir: &Path, rel: &str, to: &Path) -> PathBuf {
    let dst = to.join(rel);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(dir.join(rel)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

#[test]
fn a_sample_damaged_after_indexing_fails_alone_and_never_serves_wrong_bytes() {
    let Some(dir) = formats_dir() else { return };
    let (_, sources) = manifest(&dir);
    let d = tempfile::tempdir().unwrap();
    let src = copy_of(&dir, "webdataset", d.path());
    // `--verify full`: the index holds every sample's CRC-32 (a lazy one learns them on first
    // read, so damage done before that read goes unseen in a format without checksums).
    let s = server_verifying(&src, &d.path().join("index"), "full");
    // Flip one byte in the middle of the first image, in the shard, after the index was built.
    let victim = std::fs::read(&sources[0].0).unwrap();
    let shard = src.join("shard-000000.tar");
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = memchr::memmem::find(&bytes, &victim).expect("the image is stored in place");
    bytes[at + victim.len() / 2] ^= 0x01;
    let damaged = bytes[at..at + victim.len()].to_vec();
    std::fs::write(&shard, &bytes).unwrap();
    let mut failed = Vec::new();
    let mut served = 0;
    let mut stack = vec![ROOT_INO];
    while let Some(dirino) = stack.pop() {
        let mut entries = Vec::new();
        s.readdir(dirino, 0, |e| {
            entries.push((e.ino, e.kind, String::from_utf8_lossy(&e.name).into_owned()));
            false
        })
        .unwrap();
        for (ino, kind, name) in entries {
            match kind {
                Kind::Dir if name != "." && name != ".." => stack.push(ino),
                Kind::File => {
                    let size = s.getattr(ino).unwrap().attr.size;
                    let (tx, rx) = std::sync::mpsc::channel();
                    s.read(ino, 0, size as u32, move |r| {
                        let _ = tx.send(r.map(<[u8]>::to_vec));
                    });
                    match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
                        Ok(b) => {
                            assert_ne!(b.len(), 0);
                            assert_ne!(b, damaged, "{name}: the damaged bytes were served");
                            served += 1;
                        }
                        Err(_) => failed.push(name),
                    }
                }
                _ => {}
            }
        }
    }
    let victim_name = sources[0]
        .0
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].starts_with(&victim_name),
        "{failed:?} vs {victim_name}"
    );
    assert_eq!(served, sources.len() - 1);
}

#[test]
fn fields_all_shows_every_member_beside_the_image() {
    let Some(dir) = formats_dir() else { return };
    let (classes, sources) = manifest(&dir);
    let d = tempfile::tempdir().unwrap();
    let args = loosefs::open::OpenOptions {
        index_dir: Some(d.path().to_path_buf()),
        fields_all: true,
        ..Default::default()
    };
    let ds = loosefs::open::Dataset::open(
        &dir.join("webdataset"),
        &args,
        loosefs::progress::Progress::None,
    )
    .unwrap();
    let loosefs::open::Dataset::Foreign(f) = &ds else {
        panic!("a foreign dataset")
    };
    assert_eq!(
        f.info().samples,
        3 * sources.len() as u64,
        "image, .cls and .txt"
    );
    let (class, stem) = (
        &sources[5].1,
        sources[5].0.file_stem().unwrap().to_string_lossy(),
    );
    let s =
        loosefs::mount::compose::served(ds, Views::default(), server_options(), 64 << 20).unwrap();
    let c2 = s.lookup(ROOT_INO, class.as_bytes()).unwrap().attr.ino;
    let cls = s
        .lookup(c2, format!("{stem}.cls").as_bytes())
        .unwrap()
        .attr
        .ino;
    let label = classes.iter().position(|x| x == class).unwrap();
    assert_eq!(read_all(&s, cls), label.to_string().as_bytes());
    let txt = s
        .lookup(c2, format!("{stem}.txt").as_bytes())
        .unwrap()
        .attr
        .ino;
    assert_eq!(read_all(&s, txt), class.as_bytes());
}

/// A storage over another that, while `flip` is set, flips the first byte of every read and
/// reports a new generation, as a remote block cache does when it fetched bytes again.
struct Flipping {
    inner: std::sync::Arc<dyn loosefs::storage::Storage>,
    flip: std::sync::atomic::AtomicBool,
}

impl loosefs::storage::Storage for Flipping {
    fn len(&self, obj: u32) -> u64 {
        self.inner.len(obj)
    }
    fn read_at(&self, obj: u32, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(obj, off, buf)?;
        if self.flip.load(std::sync::atomic::Ordering::SeqCst) && !buf.is_empty() {
            buf[0] ^= 0x01;
        }
        Ok(())
    }
    fn will_need(&self, obj: u32, r: &std::ops::Range<u64>) {
        self.inner.will_need(obj, r)
    }
    fn resident_bytes(&self, obj: u32, r: &std::ops::Range<u64>) -> u64 {
        self.inner.resident_bytes(obj, r)
    }
    fn resident(&self, obj: u32, r: &std::ops::Range<u64>) -> bool {
        self.inner.resident(obj, r)
    }
    fn release(&self, obj: u32, r: &std::ops::Range<u64>) -> std::io::Result<()> {
        self.inner.release(obj, r)
    }
    fn evict(&self, obj: u32, r: &std::ops::Range<u64>) -> std::io::Result<()> {
        self.inner.evict(obj, r)
    }
    fn pin(&self, obj: u32, r: &std::ops::Range<u64>) -> std::io::Result<()> {
        self.inner.pin(obj, r)
    }
    fn generation(&self) -> u64 {
        u64::from(self.flip.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[test]
fn a_lazy_index_learns_each_crc_at_the_first_read_and_refuses_other_bytes_later() {
    use loosefs::catalog::Catalog;
    let Some(dir) = formats_dir() else { return };
    let (_, sources) = manifest(&dir);
    let d = tempfile::tempdir().unwrap();
    let src = dir.join("webdataset");
    let args = loosefs::open::OpenOptions {
        index_dir: Some(d.path().join("index")),
        ..Default::default()
    };
    let loosefs::open::Dataset::Foreign(f) =
        loosefs::open::Dataset::open(&src, &args, loosefs::progress::Progress::None).unwrap()
    else {
        panic!("a foreign dataset")
    };
    let info = f.info();
    assert_eq!(info.verify, "lazy");
    assert_eq!(
        info.crc_learned_on_read,
        sources.len(),
        "tar stores no checksum"
    );
    let storage = std::sync::Arc::new(Flipping {
        inner: loosefs::open::foreign::storage_of(&f, 1 << 20).unwrap(),
        flip: false.into(),
    });
    let cat = std::sync::Arc::new(
        loosefs::catalog::native::NativeCatalog::with_objects(
            f.map.clone(),
            f.index.clone(),
            f.objects(),
            f.header.bases.clone(),
            Views::default(),
        )
        .unwrap(),
    );
    let samples = loosefs::samples::Samples::new(cat.clone(), storage.clone());
    let files: Vec<u64> = (0..cat.records() as u32)
        .map(loosefs::ino::record_ino)
        .filter(|&ino| cat.extent(ino).is_ok())
        .collect();
    assert_eq!(files.len(), sources.len());
    let by_md5: HashMap<Vec<u8>, ()> = sources
        .iter()
        .map(|(p, _)| (std::fs::read(p).unwrap(), ()))
        .collect();
    let mut buf = Vec::new();
    let read = |ino: u64, buf: &mut Vec<u8>| {
        let len = cat.extent(ino).unwrap().len() as u32;
        samples.read(ino, 0, len, buf).map(<[u8]>::to_vec)
    };
    // First reads: served as stored (each a source image), their CRC-32 learned.
    for &ino in &files[..2] {
        let b = read(ino, &mut buf).unwrap();
        assert!(by_md5.contains_key(&b), "a source image, byte for byte");
    }
    assert_eq!(samples.learned(), 2);
    // The storage fetched other bytes (a new generation): the learned CRC-32 refuses them.
    storage
        .flip
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let e = read(files[0], &mut buf).unwrap_err();
    assert!(e.to_string().contains("the one of its first read"), "{e}");
    // Good bytes again: the other learned sample is served.
    storage
        .flip
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let b = read(files[1], &mut buf).unwrap();
    assert!(by_md5.contains_key(&b));
    assert_eq!(samples.learned(), 2);
}

/// A copy of `from` (a flat dataset directory) at `to`, every file keeping its mtime (as on a
/// shared file system seen from another node under another path).
fn copy_keeping_mtimes(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        std::fs::copy(e.path(), &dst).unwrap();
        let mtime = e.metadata().unwrap().modified().unwrap();
        let f = std::fs::File::options().write(true).open(&dst).unwrap();
        f.set_modified(mtime).unwrap();
    }
}

#[test]
fn a_shared_index_mounts_the_dataset_elsewhere_without_a_scan_and_a_changed_shard_refuses_it() {
    use loosefs::formats::index::shared;
    let Some(dir) = formats_dir() else { return };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("node1/wds");
    copy_keeping_mtimes(&dir.join("webdataset"), &src);
    let args = |index: &str| loosefs::open::OpenOptions {
        index_dir: Some(d.path().join(index)),
        ..Default::default()
    };
    // `loosefs index`: indexed once, written beside the dataset.
    let opts = loosefs::formats::ScanOptions {
        shared_index: loosefs::formats::SharedIndex::Off,
        ..args("ix1").scan_options().unwrap()
    };
    let f = loosefs::formats::index::open(
        &src,
        &opts,
        Some(&d.path().join("ix1")),
        loosefs::progress::Progress::None,
    )
    .unwrap();
    assert!(f.built);
    let src = f.header.source.clone();
    shared::write(&f, &src, &shared::default_path(&src)).unwrap();
    // Another node: the same files under another path, an empty local index directory.
    let other = d.path().join("node2/wds");
    copy_keeping_mtimes(&src, &other);
    std::fs::copy(shared::default_path(&src), shared::default_path(&other)).unwrap();
    let open = |src: &Path, a: &loosefs::open::OpenOptions| match loosefs::open::Dataset::open(
        src,
        a,
        loosefs::progress::Progress::None,
    ) {
        Ok(loosefs::open::Dataset::Foreign(f)) => Ok(f),
        Ok(_) => panic!("a foreign dataset"),
        Err(e) => Err(format!("{e:#}")),
    };
    let g = open(&other, &args("ix2")).unwrap();
    assert!(!g.built, "no scan");
    assert_eq!(g.path, shared::default_path(&other.canonicalize().unwrap()));
    assert!(!d.path().join("ix2").exists(), "nothing indexed locally");
    assert!(
        g.header
            .objects
            .iter()
            .all(|o| o.path.starts_with(&g.header.source))
    );
    // Its tree serves the second node's files, byte for byte as the first node's.
    let serve = |f| {
        let ds = loosefs::open::Dataset::Foreign(f);
        loosefs::mount::compose::served(ds, Views::default(), server_options(), 64 << 20).unwrap()
    };
    let (s1, s2) = (serve(f), serve(g));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (s, out) in [(&s1, &mut a), (&s2, &mut b)] {
        files(s, ROOT_INO, None, out);
        out.sort();
    }
    assert_eq!(a.len(), 48);
    assert_eq!(a, b);
    // A shard changed on the second node: the shared index is refused, naming it.
    let shard = other.join("shard-000001.tar");
    let f2 = std::fs::File::options().write(true).open(&shard).unwrap();
    f2.set_modified(std::time::SystemTime::now()).unwrap();
    let e = open(&other, &args("ix2")).unwrap_err();
    assert!(e.contains("stale") && e.contains("shard-000001.tar"), "{e}");
    assert!(e.contains("loosefs index"), "{e}");
    // Named with --index and built with other options (another label field): refused.
    let named = loosefs::open::OpenOptions {
        shared_index: Some(shared::default_path(&src)),
        label: Some("txt".into()),
        ..args("ix3")
    };
    let e = open(&src, &named).unwrap_err();
    assert!(e.contains("other options"), "{e}");
}
