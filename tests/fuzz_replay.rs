//! The fuzz targets' bodies (`fuzz/src/targets.rs`, which AFL++ runs through `scripts/fuzz`)
//! replayed in every `cargo test`: each target over the seeds `scripts/fuzz` starts from (a
//! real pack, real JPEGs, the formats' real writers' output cut to AFL's 1 MB, compressed
//! chunks, a shared index, announced orders, ring entries), each seed also flipped at 24 places
//! and cut at 8 lengths, plus any input kept in `fuzz/regressions/<target>/` (a finding, once
//! fixed, stays fixed). A panic or an overrun of the time limit fails the test.

mod common;

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code, missing_docs, clippy::all)]
mod loosefs_fuzz;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The formats written by their own writers (`../shared/data/formats`, else the corpus').
fn formats() -> Option<PathBuf> {
    let p = common::data_root()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"))
        .join("formats");
    if p.is_dir() {
        Some(p)
    } else {
        common::missing_prerequisite(
            "../shared/data/formats (the fuzz seeds of the foreign formats)",
        );
        None
    }
}

/// The first `n` bytes of `path`.
fn head(path: &Path, n: usize) -> Vec<u8> {
    let mut b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.truncate(n);
    b
}

/// Parts joined as one input of a multi-file dataset.
fn joined(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.join(loosefs_fuzz::SEP)
}

/// A small real pack (three files, one a real JPEG when the sample is there).
fn seed_pack() -> Vec<u8> {
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::create_dir_all(tree.join("c")).unwrap();
    std::fs::write(tree.join("a/one.txt"), b"x").unwrap();
    std::fs::write(tree.join("a/b/two.bin"), b"second file\n").unwrap();
    std::fs::write(tree.join("c/empty"), b"").unwrap();
    std::fs::write(
        tree.join("c/img.jpg"),
        common::encode_jpeg(32, 24, false, 7),
    )
    .unwrap();
    let out = tmp.path().join("seed.pack");
    let opts = loosefs::packer::PackOptions {
        jobs: 1,
        align: 1,
        follow_links: false,
        force: true,
        progress: loosefs::progress::Progress::None,
        source: Default::default(),
    };
    loosefs::packer::pack_dir(&tree, &out, &opts).unwrap();
    std::fs::read(out).unwrap()
}

/// The seeds of `target`.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let f = || formats();
    match target {
        "pack" => out.push(seed_pack()),
        "trailer" => {
            let p = seed_pack();
            out.push(p[p.len().saturating_sub(4096)..].to_vec());
        }
        "index" => {
            let p = seed_pack();
            let t = loosefs::pack::trailer::Trailer::parse_tail(&p).unwrap();
            out.push(p[t.index_offset as usize..(t.index_offset + t.index_len) as usize].to_vec());
        }
        "jpeg" | "decode" => {
            out.push(common::encode_jpeg(64, 48, false, 1));
            out.push(common::encode_jpeg(17, 9, true, 2));
            if let Some(dir) = common::shared_sample() {
                let mut jpegs: Vec<PathBuf> = walkdir::WalkDir::new(dir)
                    .into_iter()
                    .filter_map(|e| e.ok())
                    .map(|e| e.into_path())
                    .filter(|p| p.extension().is_some_and(|x| x == "JPEG"))
                    .collect();
                jpegs.sort();
                out.extend(jpegs.iter().take(3).map(|p| std::fs::read(p).unwrap()));
            }
        }
        "tar" => out.extend(f().map(|f| head(&f.join("webdataset/shard-000000.tar"), 1 << 20))),
        "tfrecord" => {
            out.extend(f().map(|f| head(&f.join("tfrecord/train-00000-of-00001"), 1 << 20)))
        }
        "zip" => {
            out.extend(f().map(|f| head(&f.join("zip/images.zip"), 1 << 20)));
            let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
            let stored = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored);
            let deflated = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            w.start_file("c1/a.jpg", stored).unwrap();
            std::io::Write::write_all(&mut w, &[0xff, 0xd8, 1, 2, 3]).unwrap();
            w.start_file("c2/b.jpg", deflated).unwrap();
            std::io::Write::write_all(&mut w, &[0xff, 0xd8].repeat(300)).unwrap();
            w.add_directory("c2/", stored).unwrap();
            out.push(w.finish().unwrap().into_inner());
        }
        "ffcv" => out.extend(f().map(|f| head(&f.join("ffcv/jpg.beton"), 1 << 20))),
        "parquet" => out
            .extend(f().map(|f| head(&f.join("hf-parquet/train-00000-of-00001.parquet"), 1 << 20))),
        "mds" => out.extend(f().map(|f| {
            joined(&[
                head(&f.join("mds/index.json"), usize::MAX),
                head(&f.join("mds/shard.00000.mds"), 900_000),
            ])
        })),
        "litdata" => out.extend(f().map(|f| {
            joined(&[
                head(&f.join("litdata/index.json"), usize::MAX),
                head(&f.join("litdata/chunk-0-0.bin"), 900_000),
            ])
        })),
        "gulpio" => out.extend(f().map(|f| {
            joined(&[
                head(&f.join("gulpio/meta_0.gmeta"), usize::MAX),
                head(&f.join("gulpio/data_0.gulp"), 900_000),
                head(&f.join("gulpio/label2idx.json"), usize::MAX),
            ])
        })),
        "chunk" => {
            let zeros = vec![0u8; 4096];
            let mut z = vec![0u8];
            z.extend(4096u64.to_le_bytes());
            z.extend(zstd::encode_all(&zeros[..], 3).unwrap());
            out.push(z);
            let mut d = vec![1u8];
            d.extend(4096u64.to_le_bytes());
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
            std::io::Write::write_all(&mut e, &zeros).unwrap();
            d.extend(e.finish().unwrap());
            out.push(d);
        }
        "shared" | "remote_shared" => {
            if let Some(f) = f() {
                let tmp = tempfile::tempdir().unwrap();
                let src = tmp.path().join("wds");
                std::fs::create_dir(&src).unwrap();
                for e in std::fs::read_dir(f.join("webdataset")).unwrap() {
                    let e = e.unwrap();
                    std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
                }
                let o = common::loosefs(&[&"index", &src, &"--index-dir", &tmp.path().join("ix")]);
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                out.push(std::fs::read(tmp.path().join("wds.loosefs-index")).unwrap());
            }
        }
        "video" => {
            let l = common::data_root()
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"))
                .join("lerobot/so100-av1");
            if l.is_dir() {
                out.push(joined(&[
                    head(&l.join("meta/info.json"), usize::MAX),
                    head(
                        &l.join("meta/episodes/chunk-000/file-000.parquet"),
                        usize::MAX,
                    ),
                    head(&l.join("data/chunk-000/file-000.parquet"), usize::MAX),
                    head(
                        &l.join("videos/observation.images.top/chunk-000/file-000.mp4"),
                        usize::MAX,
                    ),
                ]));
            } else {
                common::missing_prerequisite(
                    "../shared/data/lerobot/so100-av1 (the video fuzz seed)",
                );
            }
        }
        "listing" => {
            out.push(
                br#"[{"name":"n01","type":"directory","mtime":"Wed, 25 Nov 2026 10:00:00 GMT"},
{"name":"a b.JPEG","type":"file","mtime":"Wed, 25 Nov 2026 10:00:01 GMT","size":1234},
{"name":"x.tar","type":"file","mtime":"Thu, 01 Jan 1970 00:00:10 GMT","size":0}]"#
                    .to_vec(),
            );
            let listed = loosefs::storage::object::http_listing::parse(
                "https://h/d/",
                "application/json",
                &out[out.len() - 1],
            )
            .unwrap()
            .objects;
            let mut s3 = listed.clone();
            s3[0].pin.as_mut().unwrap().etag = "\"e\"".into();
            s3[1].key = "n01/y.jpg".into();
            for l in [listed, s3] {
                out.push(
                    loosefs::open::remote_dir::shared_listing::encode("s3://b/d/", &l).unwrap(),
                );
            }
        }
        "order" => {
            // Write size, writer, restart flag, then the order's lines.
            out.push([&[63u8, 1, 0][..], b"c0/f0.bin\nc1/f1.bin\nc2/f2.bin\n"].concat());
            out.push([&[3u8, 2, 0xff][..], b"c3/f3.bin\nnope\nc0/f4.bin\n"].concat());
        }
        "uring" => {
            // A LOOKUP (opcode 1) of `c0` in the root, then a READ (15) of file node 2.
            let mut lookup = vec![0u8; 288];
            lookup[0..4].copy_from_slice(&(40 + 3u32).to_le_bytes());
            lookup[4..8].copy_from_slice(&1u32.to_le_bytes());
            lookup[16..24].copy_from_slice(&1u64.to_le_bytes());
            lookup.extend(b"c0\0");
            out.push(lookup);
            let mut read = vec![0u8; 288];
            read[4..8].copy_from_slice(&15u32.to_le_bytes());
            read[16..24].copy_from_slice(&2u64.to_le_bytes());
            // fuse_read_in in the op header (bytes 128..): offset 0, size 4096; and one asking
            // for 100 bytes, whose reply must hold no more.
            read[136..144].copy_from_slice(&0u64.to_le_bytes());
            read[144..148].copy_from_slice(&4096u32.to_le_bytes());
            out.push(read.clone());
            read[144..148].copy_from_slice(&100u32.to_le_bytes());
            out.push(read);
        }
        t => panic!("no seeds for {t}"),
    }
    let kept = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    if let Ok(rd) = std::fs::read_dir(kept) {
        let mut files: Vec<PathBuf> = rd.map(|e| e.unwrap().path()).collect();
        files.sort();
        out.extend(files.iter().map(|p| std::fs::read(p).unwrap()));
    }
    out
}

/// `seed`, and it flipped at 24 places and cut at 8 lengths.
fn mutants(seed: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![seed.to_vec()];
    let n = seed.len();
    for k in 0..24 {
        if n == 0 {
            break;
        }
        let mut m = seed.to_vec();
        m[(k * 7919 + k * n / 24) % n] ^= 0xff;
        out.push(m);
    }
    for k in 0..8 {
        out.push(seed[..n * k / 8].to_vec());
    }
    out
}

/// Replays `target` over its seeds and their mutants within `limit`.
fn replay(target: &'static str, limit: Duration) {
    let run = common::with_timeout(
        move || {
            let seeds = seeds(target);
            assert!(
                !seeds.is_empty() || std::env::var("CI").is_err(),
                "{target}: no seeds"
            );
            let mut n = 0;
            for s in &seeds {
                for m in mutants(s) {
                    loosefs_fuzz::targets::run(target, &m);
                    n += 1;
                }
            }
            n
        },
        limit,
    );
    match run.recv() {
        Ok(n) => eprintln!("{target}: {n} inputs replayed"),
        Err(_) => panic!("{target}: the replay panicked or ran past {limit:?}"),
    }
}

macro_rules! targets {
    ($($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                replay(stringify!($name), Duration::from_secs(300));
            }
        )*

        #[test]
        fn every_target_of_scripts_fuzz_is_replayed() {
            let script = std::fs::read_to_string(
                concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/fuzz"),
            )
            .unwrap();
            let line = script
                .lines()
                .find(|l| l.starts_with("TARGETS="))
                .expect("the TARGETS line");
            let listed: Vec<&str> = line
                .split(":-")
                .nth(1)
                .unwrap()
                .trim_end_matches('}')
                .split_whitespace()
                .collect();
            let replayed = [$(stringify!($name)),*];
            assert_eq!(listed, replayed);
        }
    };
}

targets!(
    index,
    trailer,
    jpeg,
    pack,
    tar,
    zip,
    tfrecord,
    ffcv,
    parquet,
    mds,
    litdata,
    gulpio,
    chunk,
    order,
    uring,
    shared,
    remote_shared,
    decode,
    listing,
    video
);
