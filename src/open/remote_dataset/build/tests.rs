//! The first-mount index build over a [`FakeObject`] behind a real block cache: a zip indexed
//! from its tables alone receives a few blocks and gives the same tree as the local scan of
//! the whole archive; a zip the tables cannot place, a tar, and a failed table GET fall back
//! to the whole download with the same tree; an outage leaves no index behind.

use super::*;
use crate::storage::block_cache::{CacheDir, check_root};
use crate::storage::object::fake::FakeObject;
use crate::storage::object::source::ObjectSource;
use std::io::Write;
use std::sync::atomic::Ordering::SeqCst;

use crate::testutil::noise;

/// A zip of `n` stored 60 KB members in class directories (`stream`: written with data
/// descriptors, as a writer to a pipe does).
fn zip_bytes(n: usize, stream: bool) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let o = ::zip::write::SimpleFileOptions::default()
            .compression_method(::zip::CompressionMethod::Stored);
        macro_rules! fill {
            ($w:expr) => {{
                let mut w = $w;
                for i in 0..n {
                    w.start_file(format!("c{}/s{i:04}.jpg", i % 3), o).unwrap();
                    w.write_all(&noise(i as u64 + 7, 60_000)).unwrap();
                }
                w.finish().unwrap();
            }};
        }
        if stream {
            fill!(::zip::ZipWriter::new_stream(&mut out));
        } else {
            fill!(::zip::ZipWriter::new(&mut out));
        }
    }
    out.into_inner()
}

/// A tar (WebDataset shard) of `n` samples: `.jpg` and `.cls`.
fn tar_bytes(n: usize) -> Vec<u8> {
    crate::testutil::wds_shard(0..n, |_| 50_000, 4)
}

/// One object at a fake URL, its block cache, and where the build puts things.
struct World {
    tmp: tempfile::TempDir,
    name: String,
    data: Vec<u8>,
    fake: Arc<FakeObject>,
    caches: Vec<Arc<BlockCache>>,
}

impl World {
    fn new(name: &str, data: Vec<u8>) -> World {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        check_root(&root).unwrap();
        let fake = Arc::new(FakeObject::new(&format!("s3://b/{name}"), data.clone()));
        let dir = CacheDir::lock(&root.join("obj")).unwrap();
        let cache = BlockCache::open(fake.clone(), dir, 1 << 30).unwrap();
        World {
            tmp,
            name: name.into(),
            data,
            fake,
            caches: vec![Arc::new(cache)],
        }
    }

    fn kept(&self) -> std::path::PathBuf {
        self.tmp.path().join("index/remote.lfx")
    }

    /// Builds the index as a first mount of the one-object URL does.
    fn build(&self) -> Result<Foreign> {
        let view = self.tmp.path().join("cache/.view-1");
        let src = view.join(&self.name);
        std::fs::create_dir_all(self.kept().parent().unwrap()).unwrap();
        let args = OpenOptions {
            index_dir: Some(self.tmp.path().join("index")),
            ..OpenOptions::default()
        };
        let url = self.fake.url().to_string();
        build(
            &url,
            std::slice::from_ref(&self.name),
            &self.caches,
            (&view, &src),
            &self.kept(),
            &args,
            crate::progress::Progress::None,
        )
    }

    /// The same object scanned whole as a local file, as a local mount scans it.
    fn local(&self) -> Foreign {
        let p = self.tmp.path().join("local").join(&self.name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &self.data).unwrap();
        let opts = ScanOptions {
            shared_index: crate::formats::SharedIndex::Off,
            ..OpenOptions {
                ..OpenOptions::default()
            }
            .scan_options()
            .unwrap()
        };
        index::open(
            &p,
            &opts,
            Some(&self.tmp.path().join("local.lfx")),
            crate::progress::Progress::None,
        )
        .unwrap()
    }

    fn received(&self) -> u64 {
        self.fake.stats().bytes.load(SeqCst)
    }
}

/// Each record's path, kind, place in the object and CRC-32 (not its JPEG components: a table
/// index reads no JPEG header).
fn tree(f: &Foreign) -> Vec<String> {
    let v = f.view();
    let name = |i: u32| {
        let mut parts = Vec::new();
        let mut i = i;
        while i != 0 {
            let r = v.record(i).unwrap();
            parts.push(String::from_utf8_lossy(v.name(&r)).into_owned());
            i = r.parent;
        }
        parts.reverse();
        parts.join("/")
    };
    (0..v.len())
        .map(|i| {
            let r = v.record(i).unwrap();
            format!(
                "{} {} {} {} {:?}",
                name(i),
                r.is_dir,
                r.data_off,
                r.size,
                r.crc()
            )
        })
        .collect()
}

#[test]
fn a_zip_is_indexed_from_its_tables_alone_and_its_tree_equals_the_whole_scan() {
    let w = World::new("train.zip", zip_bytes(200, false));
    assert!(w.data.len() as u64 > 11 * crate::storage::block_cache::BLOCK);
    let f = w.build().unwrap();
    assert_eq!(f.info().verify, "table");
    assert_eq!(f.info().samples, 200);
    assert_eq!(tree(&f), tree(&w.local()));
    // The first block and the blocks of the end record and directory, nothing else.
    let got = w.received();
    assert!(
        got <= 3 * crate::storage::block_cache::BLOCK,
        "{got} of {} bytes received",
        w.data.len()
    );
    assert!(w.kept().exists());
    assert!(!w.tmp.path().join("cache/.view-1").exists());
}

#[test]
fn what_the_tables_cannot_place_is_downloaded_whole_with_the_same_tree() {
    // Data descriptors: a member's sizes only after its data, so it cannot be placed from the
    // directory without its local header.
    let w = World::new("stream.zip", zip_bytes(40, true));
    let f = w.build().unwrap();
    assert_eq!(f.info().verify, "lazy");
    assert_eq!(tree(&f), tree(&w.local()));
    assert!(w.received() >= w.data.len() as u64);
    // A tar records no table of its samples.
    let w = World::new("shard-0.tar", tar_bytes(30));
    let f = w.build().unwrap();
    assert_eq!(f.info().verify, "lazy");
    assert_eq!(f.info().samples, 30);
    assert_eq!(tree(&f), tree(&w.local()));
    assert_eq!(w.received(), w.data.len() as u64);
}

#[test]
fn a_failed_table_get_falls_back_and_an_outage_leaves_no_index() {
    // The first round trip fails: the object is downloaded whole instead (its GETs retried
    // block by block), and the tree is the whole scan's.
    let w = World::new("train.zip", zip_bytes(60, false));
    w.fake.fail_next.store(1, SeqCst);
    let f = w.build().unwrap();
    assert_eq!(f.info().verify, "lazy");
    assert!(w.received() >= w.data.len() as u64);
    assert_eq!(tree(&f), tree(&w.local()));
    // Every GET fails: an error naming the URL and the reason; no index kept, no view left.
    let w = World::new("train.zip", zip_bytes(60, false));
    w.fake.down.store(true, SeqCst);
    let e = format!("{:#}", w.build().unwrap_err());
    assert!(
        e.contains("cannot index s3://b/train.zip") && e.contains("connection refused"),
        "{e}"
    );
    assert!(!w.kept().exists());
    assert!(!w.kept().with_extension("building").exists());
    assert!(!w.tmp.path().join("cache/.view-1").exists());
}
