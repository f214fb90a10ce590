//! Crafted and damaged inputs for every foreign-format scanner, made from the real writers'
//! output in `../shared/data/formats` (see its README): truncations, flipped bytes, length
//! fields set to 2^64−1 and 2^62, and huge numbers in the JSON metadata. Each must be refused
//! with an error or scanned, never panic or abort (an allocation sized by a file's claim
//! aborts the test binary, which fails it too).

use super::{Format, ScanOptions, scan};
use std::path::{Path, PathBuf};

/// The fixture of each format: `(format, path inside ../shared/data/formats)`.
const FIXTURES: &[(Format, &str)] = &[
    (Format::Ffcv, "ffcv/raw.beton"),
    (Format::Ffcv, "ffcv/jpg.beton"),
    (Format::Gulpio, "gulpio"),
    (Format::Parquet, "hf-parquet"),
    (Format::Litdata, "litdata"),
    (Format::Mds, "mds"),
    (Format::Tfrecord, "tfrecord"),
    (Format::Tar, "webdataset"),
    (Format::Zip, "zip/images.zip"),
];

/// The formats of the tests' data (`../shared/data/formats`, else the corpus').
fn shared() -> Option<PathBuf> {
    let p = crate::testutil::data_root()?.join("formats");
    p.join("manifest.json").is_file().then_some(p)
}

/// One way of damaging a file's bytes, applied when the variant is tried (a variant of a
/// 10 MB file is 10 MB: made one at a time, the test's own memory stays small).
enum Damage {
    /// Cut to this many bytes.
    Truncate(usize),
    /// One byte XORed with 0x5a.
    Flip(usize),
    /// Up to 8 bytes at the offset overwritten by a little-endian u64.
    Word(usize, u64),
    /// The JSON number at (offset, length) replaced by this text.
    Number(usize, usize, &'static str),
}

impl Damage {
    fn apply(&self, b: &[u8]) -> Vec<u8> {
        let mut v = b.to_vec();
        match *self {
            Damage::Truncate(k) => v.truncate(k),
            Damage::Flip(p) => v[p] ^= 0x5a,
            Damage::Word(p, w) => {
                let end = (p + 8).min(v.len());
                v[p..end].copy_from_slice(&w.to_le_bytes()[..end - p]);
            }
            Damage::Number(i, len, huge) => {
                v.splice(i..i + len, huge.bytes());
            }
        }
        v
    }
}

/// Byte-level variants of `b`: truncations, flips, and 8-byte length fields of 2^64−1 and
/// 2^62 at positions spread over the file, its first and its last 256 bytes denser; in JSON,
/// the first 24 numbers made huge.
fn variants(b: &[u8]) -> Vec<(String, Damage)> {
    let n = b.len();
    let mut out = Vec::new();
    for k in [
        0,
        1,
        7,
        12,
        64,
        n / 3,
        n / 2,
        n.saturating_sub(100),
        n.saturating_sub(1),
    ] {
        if k < n {
            out.push((format!("truncated at {k}"), Damage::Truncate(k)));
        }
    }
    let mut at: Vec<usize> = (0..24).map(|i| n * i / 24).collect();
    at.extend((0..256).step_by(13).filter(|&i| i < n));
    at.extend((0..256).step_by(17).map(|i| n.saturating_sub(1 + i)));
    for &p in at.iter().filter(|&&p| p < n) {
        out.push((format!("byte {p} flipped"), Damage::Flip(p)));
        for (what, word) in [("2^64-1", u64::MAX), ("2^62", 1u64 << 62)] {
            out.push((format!("{what} at byte {p}"), Damage::Word(p, word)));
        }
    }
    if let Ok(s) = std::str::from_utf8(b) {
        let digits = s
            .char_indices()
            .filter(|&(i, c)| {
                c.is_ascii_digit() && (i == 0 || !s.as_bytes()[i - 1].is_ascii_digit())
            })
            .map(|(i, _)| (i, s[i..].bytes().take_while(u8::is_ascii_digit).count()))
            .take(24);
        for (i, len) in digits {
            for huge in [
                "18446744073709551615",
                "4611686018427387904",
                "99999999999999999999999",
            ] {
                out.push((
                    format!("number at {i} set to {huge}"),
                    Damage::Number(i, len, huge),
                ));
            }
        }
    }
    out
}

/// Copies the fixture `src` into `dir`; returns the copy's path and its files.
fn copy(src: &Path, dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let to = dir.join(src.file_name().unwrap());
    if src.is_dir() {
        std::fs::create_dir_all(&to).unwrap();
        let mut files = Vec::new();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            let t = to.join(e.file_name());
            std::fs::copy(e.path(), &t).unwrap();
            files.push(t);
        }
        files.sort();
        (to, files)
    } else {
        std::fs::copy(src, &to).unwrap();
        (to.clone(), vec![to])
    }
}

/// The process's peak resident set so far, bytes (`VmHWM`).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb << 10)
}

#[test]
fn every_scanner_refuses_or_reads_damaged_and_crafted_inputs_without_panicking() {
    let Some(root) = shared() else {
        crate::testutil::missing_prerequisite(
            "../shared/data/formats is missing (see ../shared/data/README.md)",
        );
        return;
    };
    let mut tried = 0;
    let mut panics = Vec::new();
    // Which variants raised the peak RSS (printed: memory is measured, not asserted, here).
    let mut raised: Vec<(u64, String)> = Vec::new();
    for &(format, rel) in FIXTURES {
        let tmp = tempfile::tempdir().unwrap();
        let (src, files) = copy(&root.join(rel), tmp.path());
        let opts = ScanOptions {
            inflate_dir: tmp.path().join("inflated"),
            ..Default::default()
        };
        scan(&src, format, &opts).unwrap_or_else(|e| panic!("{rel} itself: {e:#}"));
        for f in files {
            let good = std::fs::read(&f).unwrap();
            for (what, damage) in variants(&good) {
                std::fs::write(&f, damage.apply(&good)).unwrap();
                tried += 1;
                // The scan, then (when it accepts the input) the index build, which reads every
                // sample and decompresses chunks: where declared sizes turn into allocations.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if scan(&src, format, &opts).is_ok() {
                        let ix = tmp.path().join(format!("index{tried}"));
                        let o = ScanOptions {
                            format: Some(format),
                            ..opts.clone()
                        };
                        let _ = super::index::open(
                            &src,
                            &o,
                            Some(&ix),
                            crate::progress::Progress::None,
                        );
                        let _ = std::fs::remove_dir_all(&ix);
                    }
                    // The index from the tables alone (a zip or FFCV file at a URL).
                    let t = ScanOptions {
                        format: Some(format),
                        tables_only: true,
                        ..opts.clone()
                    };
                    if matches!(format, Format::Zip | Format::Ffcv)
                        && scan(&src, format, &t).is_ok()
                    {
                        let ix = tmp.path().join(format!("table{tried}"));
                        let _ = super::index::open(
                            &src,
                            &t,
                            Some(&ix),
                            crate::progress::Progress::None,
                        );
                        let _ = std::fs::remove_dir_all(&ix);
                    }
                }));
                let hwm = peak_rss();
                if raised.last().is_none_or(|(h, _)| hwm > *h + (64 << 20)) {
                    raised.push((hwm, format!("{rel}: {what}")));
                }
                if let Err(p) = r {
                    panics.push(format!(
                        "{rel}: {} {what}: {}",
                        f.file_name().unwrap().to_string_lossy(),
                        crate::stats::panic_message(&*p)
                    ));
                }
            }
            std::fs::write(&f, &good).unwrap();
        }
    }
    crate::eprintln_lossy!("{tried} variants scanned; peak RSS raised by:");
    for (h, what) in &raised {
        crate::eprintln_lossy!("  {} MiB  {what}", h >> 20);
    }
    assert!(
        panics.is_empty(),
        "{} panics:\n{}",
        panics.len(),
        panics.join("\n")
    );
}
