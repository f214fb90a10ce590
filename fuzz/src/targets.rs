//! The fuzz targets' bodies, one function per target: AFL++ runs them through the one-line
//! binaries in `src/bin/` (`scripts/fuzz`), and the main package's `tests/fuzz_replay.rs`
//! replays their seeds and deterministic mutants through the same functions in every
//! `cargo test`, so a target that stops compiling or a regression on a seed fails the suite.
//! Each takes one input; errors are expected, a panic or a hang is a finding.

use loosefs::fuse::uring::{Handler, abi};
use loosefs::storage::object::Pin;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// Where the pack target writes its input, made once per process (in /dev/shm when it can).
fn pack_path() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temp dir")
            .keep();
        dir.join("f.pack")
    })
}

/// The ring handler of the uring target, over [`super::small_server`], made once.
fn handler() -> &'static Handler {
    static H: OnceLock<Handler> = OnceLock::new();
    H.get_or_init(|| {
        let (s, ..) = super::small_server();
        Handler::new(Arc::clone(s), 0, 0)
    })
}

/// index bytes (the `.loosefs-index` member). The checksum is recomputed over the
/// input first, so the fuzzer explores the structure a forger controls, not the hash.
pub fn index(data: &[u8]) {
    let mut bytes = data.to_vec();
    if bytes.len() >= 128 {
        let c = loosefs::pack::index::checksum(&bytes);
        bytes[120..128].copy_from_slice(&c.to_le_bytes());
    }
    let Ok(ix) = loosefs::pack::index::IndexView::parse(&bytes) else {
        return;
    };
    if ix.validate_tree().is_ok() {
        let n = super::walk(&ix);
        assert_eq!(
            n as u64 + 1,
            ix.totals().records,
            "every record reachable once"
        );
    }
}

/// the tail of a pack (the loosefs trailer in the zip comment).
pub fn trailer(data: &[u8]) {
    let _ = loosefs::pack::trailer::Trailer::parse_tail(data);
}

/// the JPEG header probe `loosefs pack` runs on every file.
pub fn jpeg(data: &[u8]) {
    let _ = loosefs::pack::jpeg::probe(data);
}

/// a whole pack file, as `mount`, `info` and `verify` read it: open (trailer,
/// index, tree), verify (every sample's CRC-32, the zip central directory and local headers),
/// and the walk the daemon's lookups and listings do. The file lives in /dev/shm when it can.
pub fn pack(data: &[u8]) {
    let path = pack_path();
    if std::fs::write(path, data).is_err() {
        return;
    }
    let Ok(pack) = loosefs::pack::reader::Pack::open(path) else {
        return;
    };
    let _ = loosefs::verify::verify(&pack, None);
    super::walk(&pack.index());
}

/// a tar dataset (scan, then the index build), from one input.
pub fn tar(data: &[u8]) {
    super::scan_dataset(
        loosefs::formats::Format::Tar,
        data,
        &["shard-000000.tar"],
        true,
    );
}

/// a zip dataset (scan, then the index build), from one input.
pub fn zip(data: &[u8]) {
    super::scan_dataset(loosefs::formats::Format::Zip, data, &["images.zip"], true);
}

/// a tfrecord dataset (scan, then the index build), from one input.
pub fn tfrecord(data: &[u8]) {
    super::scan_dataset(
        loosefs::formats::Format::Tfrecord,
        data,
        &["train-00000-of-00001"],
        true,
    );
}

/// a ffcv dataset (scan, then the index build), from one input.
pub fn ffcv(data: &[u8]) {
    super::scan_dataset(loosefs::formats::Format::Ffcv, data, &["data.beton"], true);
}

/// a parquet dataset (scan, then the index build), from one input.
pub fn parquet(data: &[u8]) {
    super::scan_dataset(
        loosefs::formats::Format::Parquet,
        data,
        &["train.parquet"],
        true,
    );
}

/// a mds dataset (scan, then the index build), from one input.
pub fn mds(data: &[u8]) {
    super::scan_dataset(
        loosefs::formats::Format::Mds,
        data,
        &["index.json", "shard.00000.mds"],
        false,
    );
}

/// a litdata dataset (scan, then the index build), from one input.
pub fn litdata(data: &[u8]) {
    super::scan_dataset(
        loosefs::formats::Format::Litdata,
        data,
        &["index.json", "chunk-0-0.bin"],
        false,
    );
}

/// a gulpio dataset (scan, then the index build), from one input.
pub fn gulpio(data: &[u8]) {
    super::scan_dataset(
        loosefs::formats::Format::Gulpio,
        data,
        &["meta_0.gmeta", "data_0.gulp", "label2idx.json"],
        false,
    );
}

/// a compressed chunk's decompression against the length and CRC its container
/// declares (first byte: zstd or deflate; next 8: the declared length, up to 2^64−1; the rest:
/// the stream). A bomb or a lying length must be refused without allocating what it claims.
pub fn chunk(data: &[u8]) {
    if data.len() < 9 {
        return;
    }
    let codec = if data[0] & 1 == 0 {
        loosefs::storage::chunks::Codec::Zstd
    } else {
        loosefs::storage::chunks::Codec::Deflate
    };
    let len = u64::from_le_bytes(data[1..9].try_into().unwrap());
    let mut f = tempfile::tempfile().expect("temp file");
    std::io::Write::write_all(&mut f, &data[9..]).expect("write");
    let c = loosefs::storage::chunks::Chunk {
        path: "fuzz.chunk".into(),
        file: loosefs::storage::chunks::ChunkFile::Local(Arc::new(f)),
        range: 0..(data.len() - 9) as u64,
        codec,
        len,
        crc32: None,
        parquet: None,
    };
    let _ = c.decompress();
}

/// announced orders (what any user of a mount may write to `.loosefs/order`).
/// One server over a small pack lives for the whole run; each input is written as one
/// announcement: byte 0 sets the write size (1–256 bytes), byte 1 the writing process, and
/// byte 2 = 0xff restarts at a wrong offset once. Some files are then read, so the reads meet
/// the order. Errors are expected; a panic, a hang or unbounded growth is a finding.
pub fn order(data: &[u8]) {
    let (s, order, files) = super::small_server();
    let [size, pid, wrong, rest @ ..] = data else {
        return;
    };
    let size = usize::from(*size) + 1;
    let mut off = 0u64;
    for (k, part) in rest.chunks(size).enumerate() {
        let at = if k == 1 && *wrong == 0xff {
            off + 1
        } else {
            off
        };
        if s.write(*order, at, part, u32::from(*pid)).is_ok() {
            off = at + part.len() as u64;
        }
    }
    for &ino in files.iter().skip(usize::from(*pid) % 8).step_by(3) {
        s.read(ino, 0, 4096, |_| {});
    }
}

/// requests as the kernel hands them to a FUSE-over-io_uring ring entry,
/// answered by the ring's handler over one in-process server (`fuse::uring::Handler`). The
/// input is the entry's 288-byte header buffer (zero-padded) followed by its payload; a node
/// id of 2..=65 is replaced by file k − 2's inode, so lookups, reads, listings and writes to
/// `.loosefs/order` meet real nodes. Errors are expected; a panic, a hang, a reply longer than
/// its buffer, or a READ/READDIR(PLUS) reply longer than the request's size is a finding.
pub fn uring(data: &[u8]) {
    let (_, _, files) = super::small_server();
    let mut header = [0u8; abi::HEADER_LEN];
    let n = data.len().min(abi::HEADER_LEN);
    header[..n].copy_from_slice(&data[..n]);
    let node = u64::from_le_bytes(header[16..24].try_into().unwrap());
    if (2..=65).contains(&node) {
        header[16..24].copy_from_slice(&files[node as usize - 2].to_le_bytes());
    }
    let mut payload = vec![0u8; 1 << 16];
    let rest = &data[n..];
    let m = rest.len().min(payload.len());
    payload[..m].copy_from_slice(&rest[..m]);
    let mut input = Vec::new();
    handler().serve_entry(&mut header, &mut payload, &mut input);
    let len = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
    assert!(
        len >= 16 && len - 16 <= payload.len(),
        "reply of {len} bytes"
    );
    // A READ, READDIR or READDIRPLUS answered with data: never more than the request's size
    // (fuse_read_in's `size`, at byte 16 of the op header; the kernel would take the excess
    // as a protocol error).
    let opcode = u32::from_le_bytes(data_header(&data[..n], 4));
    let error = i32::from_le_bytes(header[4..8].try_into().unwrap());
    if matches!(opcode, 15 | 28 | 44) && error == 0 {
        let size = u32::from_le_bytes(data_header(&data[..n], 128 + 16)) as usize;
        assert!(
            len - 16 <= size,
            "opcode {opcode}: a reply of {} bytes to a request for {size}",
            len - 16
        );
    }
}

/// Four bytes of the request header as given, at `at` (zero past its end).
fn data_header(given: &[u8], at: usize) -> [u8; 4] {
    let mut b = [0u8; 4];
    for (k, v) in b.iter_mut().enumerate() {
        *v = given.get(at + k).copied().unwrap_or(0);
    }
    b
}

/// a shared index file (`loosefs index`, read by every node that mounts the
/// dataset): loaded for a dataset directory holding one file, with the options it names, so
/// the header, the object table, the relative names and the index inside are all explored.
pub fn shared(data: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("ds");
    std::fs::create_dir(&src).expect("dataset dir");
    std::fs::write(src.join("shard-000000.tar"), b"data").expect("a file");
    let path = dir.path().join("ds.loosefs-index");
    std::fs::write(&path, data).expect("write the index");
    let options = loosefs::formats::index::load(&path)
        .map(|f| vec![f.header.options])
        .unwrap_or_default();
    if let Ok(Some(f)) = loosefs::formats::index::shared::load(&path, &src, &options) {
        let n = super::walk(&f.view());
        assert!(n as u64 + 1 <= f.view().totals().records);
        assert!(f.header.objects.iter().all(|o| o.path.starts_with(&src)));
    }
}

/// a shared index of a remote dataset (`loosefs index s3://…`, fetched by every
/// node that mounts the dataset): checked for a dataset URL against a listing of four objects,
/// and without a listing (HTTPS: names and pins taken from the index), so the header's
/// recorded objects, the names the samples come from and the index inside are all explored.
pub fn remote_shared(data: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("i.loosefs-index");
    std::fs::write(&path, data).expect("write the index");
    let args = loosefs::open::OpenOptions {
        shared_index: Some(path.clone()),
        ..Default::default()
    };
    // The seed's objects (scripts/fuzz): each of size 4, ETag `"i"`.
    let names: Vec<String> = [
        "index.json",
        "shard.00000.mds",
        "shard.00001.mds",
        "shard.00002.mds",
    ]
    .map(String::from)
    .to_vec();
    let pins: Vec<Option<Pin>> = (0..names.len())
        .map(|i| {
            Some(Pin {
                size: 4,
                etag: format!("\"{i}\""),
                version: None,
                modified: None,
            })
        })
        .collect();
    let at = (path.to_str().expect("utf-8"), true);
    let url = "s3://b/d/";
    for listed in [Some((&names[..], &pins[..])), None] {
        let checked = loosefs::open::remote_dataset::shared::check(&path, at, url, &args, listed);
        if let Ok(Some((n, p, f))) = checked {
            assert_eq!(n.len(), p.len());
            let walked = super::walk(&f.view());
            assert!(walked as u64 + 1 <= f.view().totals().records);
            if listed.is_some() {
                assert_eq!(n, names);
            }
            assert!(
                n.iter()
                    .all(|x| !x.starts_with('/') && !x.split('/').any(|c| c == ".."))
            );
        }
    }
}

/// A JPEG decoded for a view, as `--decode` serves it: the header probed as the index probes
/// it, a scale picked, the pixels decoded under the daemon's policy (damaged images refused,
/// then accepted), and the `.npy` and `.ppm` files built from them and read in pieces.
pub fn decode(data: &[u8]) {
    use loosefs::decode::codec::{Policy, decode_checked};
    use loosefs::view::{ViewKind, header, pick_denom, scaled_dims, slice_into};
    let Some(info) = loosefs::pack::jpeg::probe(data) else {
        return;
    };
    for (max_side, accept_damaged) in [(None, false), (Some(64), true)] {
        let denom = pick_denom(info.width, info.height, max_side);
        let (w, h) = scaled_dims(info.width, info.height, denom);
        let policy = Policy {
            accept_damaged,
            max_bytes: 64 << 20,
        };
        let Ok(rgb) = decode_checked(data, denom, w, h, policy) else {
            continue;
        };
        assert_eq!(
            rgb.pixels.len(),
            rgb.width as usize * rgb.height as usize * 3
        );
        for kind in [ViewKind::Npy, ViewKind::Ppm] {
            let head = header(kind, rgb.width, rgb.height);
            let size = (head.len() + rgb.pixels.len()) as u64;
            let (mut whole, mut piece) = (Vec::new(), Vec::new());
            while (whole.len() as u64) < size {
                slice_into(&head, &rgb.pixels, whole.len() as u64, 4093, &mut piece);
                assert!(!piece.is_empty(), "no bytes at {} of {size}", whole.len());
                whole.extend_from_slice(&piece);
            }
            assert_eq!(&whole[head.len()..], &rgb.pixels[..]);
        }
    }
}

/// a directory listing an HTTP server answers (nginx's JSON) and a shared listing of loose
/// objects (`LOOSEFSL`, fetched by every node that mounts a prefix): parsed or decoded, then
/// checked as a mount checks them (a level against the listing recorded), and the names
/// sorted into files and packed-format shards.
pub fn listing(data: &[u8]) {
    use loosefs::open::remote_dir::{holds_a_format, shared_listing};
    let url = "https://h/d/";
    let keys = |l: &[loosefs::storage::object::source::Listed]| -> Vec<String> {
        l.iter().map(|o| o.key.clone()).collect()
    };
    if let Ok(level) = loosefs::storage::object::http_listing::parse(url, "application/json", data)
    {
        let _ = holds_a_format(&keys(&level.objects));
        // A level checked against itself as recorded: always current.
        let recorded: Vec<_> = (level.objects.iter().cloned())
            .chain(
                level
                    .dirs
                    .iter()
                    .map(|d| loosefs::storage::object::source::Listed {
                        key: format!("{d}/x"),
                        pin: None,
                        modified: 0,
                    }),
            )
            .collect();
        let _ = shared_listing::check_level(&level, &recorded, "I", url);
    }
    if let Ok(Some(listed)) = shared_listing::decode(data, "I") {
        let _ = holds_a_format(&keys(&listed));
        let level = loosefs::storage::object::source::Level {
            objects: listed
                .iter()
                .filter(|l| !l.key.contains('/'))
                .cloned()
                .collect(),
            ..Default::default()
        };
        let _ = shared_listing::check_level(&level, &listed, "I", url);
    }
}

/// a LeRobot v3 dataset's metadata and video (`--decode frames`): `meta/info.json`, the
/// episodes' and the data's Parquet files and an MP4 (both cameras' file), separated by
/// [`super::SEP`]: the metadata read, the video indexed by demuxing, every row's frame chosen,
/// and the first and last GOPs decoded.
pub fn video(data: &[u8]) {
    let parts: Vec<&[u8]> = super::split(data, 4);
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let files = [
        "meta/info.json",
        "meta/episodes/chunk-000/file-000.parquet",
        "data/chunk-000/file-000.parquet",
        "videos/observation.images.top/chunk-000/file-000.mp4",
    ];
    for (name, part) in files
        .iter()
        .zip(parts.iter().chain(std::iter::repeat(&&b""[..])))
    {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("dirs");
        std::fs::write(&p, part).expect("a file");
    }
    let wrist = root.join("videos/observation.images.wrist/chunk-000");
    std::fs::create_dir_all(&wrist).expect("dirs");
    let _ = std::fs::copy(root.join(files[3]), wrist.join("file-000.mp4"));
    let _ = loosefs::video::lerobot::LeRobot::open(root);
    let mp4 = root.join(files[3]);
    if let Ok(ix) = loosefs::video::decoder::VideoIndex::of(&mp4) {
        for i in 0..ix.packets.len().min(64) {
            let _ = ix.nearest(i as f64 / 30.0);
        }
        for g in [0, ix.gops.len().saturating_sub(1)] {
            if let Ok(frames) = loosefs::video::decoder::decode_gop(&mp4, &ix, g, None) {
                let want = (ix.width * ix.height * 3) as usize;
                assert!(frames.iter().all(|f| f.1.len() == want));
            }
        }
    }
}

/// Runs the target named `name` (as `scripts/fuzz` names it) on `data`. Panics on an unknown
/// name.
pub fn run(name: &str, data: &[u8]) {
    match name {
        "index" => index(data),
        "trailer" => trailer(data),
        "jpeg" => jpeg(data),
        "pack" => pack(data),
        "tar" => tar(data),
        "zip" => zip(data),
        "tfrecord" => tfrecord(data),
        "ffcv" => ffcv(data),
        "parquet" => parquet(data),
        "mds" => mds(data),
        "litdata" => litdata(data),
        "gulpio" => gulpio(data),
        "chunk" => chunk(data),
        "order" => order(data),
        "uring" => uring(data),
        "shared" => shared(data),
        "remote_shared" => remote_shared(data),
        "decode" => decode(data),
        "listing" => listing(data),
        "video" => video(data),
        other => panic!("no fuzz target {other}"),
    }
}
