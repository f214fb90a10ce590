//! Shared pieces of the fuzz targets: a walk over everything an index view exposes, so a
//! target exercises every accessor the daemon uses on a pack that passed validation.

use loosefs::fs::{Fs, FsOptions};
use loosefs::pack::index::IndexView;
use std::sync::{Arc, OnceLock};

pub mod targets;

/// Visits every record of `ix` depth first through `children`, looks each name up again
/// through `find_child` and `lower_bound`, as lookups and listings do. Bounded by the record
/// count: a validated tree has no cycle, and a bug that made one would show up as a hang.
pub fn walk(ix: &IndexView<'_>) -> usize {
    let Some(root) = ix.record(0) else { return 0 };
    let mut seen = 0usize;
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for i in ix.children(&d) {
            let Some(r) = ix.record(i) else { continue };
            seen += 1;
            assert!(seen <= ix.len() as usize, "a record was reached twice");
            let name = ix.name(&r);
            assert_eq!(ix.find_child(&d, name), Some(i), "lookup of a listed name");
            assert!(ix.lower_bound(&d, name) <= i);
            if r.is_dir {
                stack.push(r);
            }
        }
    }
    seen
}

/// Separates the files of a multi-file dataset in one fuzz input: `index SEP data [SEP data…]`.
pub const SEP: &[u8] = b"\n--8<--loosefs-fuzz--8<--\n";

/// The parts of `input` separated by [`SEP`] (at most `n`: the last holds the rest).
pub fn split(input: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = input;
    while out.len() + 1 < n {
        let Some(i) = find(rest, SEP) else { break };
        out.push(&rest[..i]);
        rest = &rest[i + SEP.len()..];
    }
    out.push(rest);
    out
}

/// Writes `input` as a dataset of `format` into a fresh temp dir and scans it, then builds its
/// index (every sample read, chunks decompressed) when the scan accepts it; then the same from
/// the format's tables alone (`tables_only`). `names`: the
/// file names the parts of the input become (split on [`SEP`]); the first part gets the first
/// name, and so on (parts beyond the names are dropped). `file`: the source is the first file,
/// not the directory. Errors are expected; a panic, an abort or a hang is a finding.
pub fn scan_dataset(format: loosefs::formats::Format, input: &[u8], names: &[&str], file: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rest = input;
    for (k, name) in names.iter().enumerate() {
        let (part, next) = match find(rest, SEP) {
            Some(i) if k + 1 < names.len() => (&rest[..i], &rest[i + SEP.len()..]),
            _ => (rest, &rest[rest.len()..]),
        };
        std::fs::write(dir.path().join(name), part).expect("write part");
        rest = next;
    }
    let src = if file {
        dir.path().join(names[0])
    } else {
        dir.path().to_path_buf()
    };
    let opts = loosefs::formats::ScanOptions {
        format: Some(format),
        inflate_dir: dir.path().join(".inflated"),
        ..Default::default()
    };
    if loosefs::formats::scan(&src, format, &opts).is_ok() {
        // Both indexings: lazy (heads only) and full (every sample read).
        for verify in [
            loosefs::formats::Verify::Lazy,
            loosefs::formats::Verify::Full,
        ] {
            let opts = loosefs::formats::ScanOptions {
                verify,
                ..opts.clone()
            };
            let _ = loosefs::formats::index::open(
                &src,
                &opts,
                Some(&dir.path().join(".index")),
                loosefs::progress::Progress::None,
            );
        }
    }
    // The table-only scan and index of a dataset at a URL (a zip: its own central-directory
    // parser; every format: no sample read).
    let tabled = loosefs::formats::ScanOptions {
        tables_only: true,
        ..opts
    };
    if loosefs::formats::scan(&src, format, &tabled).is_ok() {
        let at = dir.path().join(".index-table");
        let _ = loosefs::formats::index::open(
            &src,
            &tabled,
            Some(&at),
            loosefs::progress::Progress::None,
        );
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// One in-process server over a small pack (64 files in 4 directories), made once per fuzz
/// run: the server, the inode of `.loosefs/order`, and the files' inodes (file k is
/// `c{k % 4}/f{k}.bin`, `100 + 37k` bytes of the byte k).
pub fn small_server() -> &'static (Arc<Fs>, u64, Vec<u64>) {
    static S: OnceLock<(Arc<Fs>, u64, Vec<u64>)> = OnceLock::new();
    S.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        let tree = dir.join("tree");
        for k in 0..64u32 {
            let d = tree.join(format!("c{}", k % 4));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join(format!("f{k}.bin")),
                vec![k as u8; 100 + k as usize * 37],
            )
            .unwrap();
        }
        let pack = dir.join("p.pack");
        let opts = loosefs::packer::PackOptions {
            jobs: 1,
            align: 1,
            follow_links: false,
            force: true,
            progress: loosefs::progress::Progress::None,
            source: Default::default(),
        };
        loosefs::packer::pack_dir(&tree, &pack, &opts).expect("pack");
        let base = FsOptions::in_process();
        let opts = FsOptions {
            decode: loosefs::decode::DecodeOptions {
                ahead: 1,
                ..base.decode
            },
            ..base
        };
        let p = loosefs::pack::reader::Pack::open(&pack).expect("open");
        let s = Fs::local(p, Default::default(), opts).expect("server");
        let dir = s.lookup(1, b".loosefs").unwrap().attr.ino;
        let order = s.lookup(dir, b"order").unwrap().attr.ino;
        let files = (0..64u32)
            .filter_map(|k| {
                let c = s.lookup(1, format!("c{}", k % 4).as_bytes()).ok()?.attr.ino;
                Some(s.lookup(c, format!("f{k}.bin").as_bytes()).ok()?.attr.ino)
            })
            .collect();
        (Arc::new(s), order, files)
    })
}
