//! The table-only scan against the `zip` crate's (which reads every local header), on
//! archives the crate writes: stored and deflated members, directories, symbolic links, extra
//! fields the central directory alone holds, zip64 headers, an archive comment.

use super::*;
use std::io::Write;

type Opts = ::zip::write::FullFileOptions<'static>;

fn opts(deflate: bool) -> Opts {
    let m = if deflate {
        ::zip::CompressionMethod::Deflated
    } else {
        ::zip::CompressionMethod::Stored
    };
    ::zip::write::FileOptions::default().compression_method(m)
}

/// Writes `members` (name, data, options) to `p`, with `comment` as the archive's comment.
fn write(p: &Path, members: &[(&str, Vec<u8>, Opts)], comment: &str) {
    let mut w = ::zip::ZipWriter::new(std::fs::File::create(p).unwrap());
    for (name, data, o) in members {
        w.start_file(*name, o.clone()).unwrap();
        w.write_all(data).unwrap();
    }
    w.add_directory("c1/sub/", opts(false)).unwrap();
    w.add_symlink("c1/link.jpg", "x.jpg", opts(false)).unwrap();
    w.set_comment(comment);
    w.finish().unwrap();
}

/// What a scan says of each sample and chunk, for comparing two scans.
fn shape(s: &Scan) -> Vec<String> {
    let mut v: Vec<String> = (s.samples.iter())
        .map(|x| {
            format!(
                "{} {:?} {:?} {} {:?}",
                x.object, x.range, x.dir, x.name, x.crc32
            )
        })
        .collect();
    v.extend(s.chunks.iter().map(|c| format!("{c:?}")));
    v.push(format!("{:?} {}", s.objects, s.compression));
    v
}

/// The directory and members of the archive at `p`, as [`scan`] finds them (before [`place`]).
fn table_of(p: &Path) -> (Directory, Vec<Member>) {
    let b = std::fs::read(p).unwrap();
    let mut read = |off: u64, n: usize| read_at(p, off, n);
    let dir = directory(&mut read, b.len() as u64).unwrap();
    let cd = &b[dir.start as usize..(dir.start + dir.len) as usize];
    (dir, members(cd, &dir).unwrap())
}

fn varied() -> Vec<(&'static str, Vec<u8>, Opts)> {
    let mut central_only = opts(false);
    central_only
        .add_extra_data(0xcafe, vec![7u8; 300], true)
        .unwrap();
    let mut both = opts(true);
    both.add_extra_data(0xbeef, vec![1u8; 40], false).unwrap();
    let big64 = opts(false).large_file(true);
    vec![
        ("c1/x.jpg", b"\xff\xd8stored".to_vec(), opts(false)),
        ("c2/y.jpg", vec![9u8; 50_000], opts(true)),
        (
            "c2/z.jpg",
            (0..70_000u32).map(|i| i as u8).collect(),
            central_only,
        ),
        ("c3/w.jpg", vec![3u8; 1000], both),
        ("c3/v.jpg", vec![4u8; 100], big64),
        ("top.jpg", Vec::new(), opts(false)),
    ]
}

#[test]
fn the_tables_alone_give_the_samples_the_crate_gives() {
    let d = tempfile::tempdir().unwrap();
    for comment in ["", "a comment that ends the archive"] {
        let p = d.path().join("a.zip");
        write(&p, &varied(), comment);
        let (ours, crates) = (scan(&p).unwrap(), super::super::scan(&p).unwrap());
        assert_eq!(shape(&ours), shape(&crates), "comment {comment:?}");
        assert_eq!(ours.samples.len(), 6);
    }
}

#[test]
fn an_archive_with_data_descriptors_is_refused_saying_why() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("stream.zip");
    let mut w = ::zip::ZipWriter::new_stream(std::fs::File::create(&p).unwrap());
    w.start_file("a.jpg", opts(false)).unwrap();
    w.write_all(b"streamed").unwrap();
    w.finish().unwrap();
    let flags: Vec<u16> = table_of(&p).1.iter().map(|m| m.flags).collect();
    assert!(flags.iter().all(|f| f & 0x8 != 0), "{flags:?}");
    let e = format!("{:#}", scan(&p).unwrap_err());
    assert!(
        e.contains("stream.zip") && e.contains("data descriptor"),
        "{e}"
    );
}

#[test]
fn a_local_header_that_disagrees_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.zip");
    write(&p, &varied(), "");
    let mut b = std::fs::read(&p).unwrap();
    // The first member's local header: its extra length grows by one.
    assert_eq!(&b[..4], b"PK\x03\x04");
    b[28] = b[28].wrapping_add(1);
    std::fs::write(&p, &b).unwrap();
    let e = format!("{:#}", scan(&p).unwrap_err());
    assert!(e.contains("a.zip") && e.contains("disagrees"), "{e}");
}

#[test]
fn gaps_truncations_and_garbage_are_refused_without_a_panic() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.zip");
    write(&p, &varied(), "c");
    let good = std::fs::read(&p).unwrap();
    // Bytes between two members: no local extra field explains them.
    let (dir, mut ms) = table_of(&p);
    ms[1].header += 70_000;
    assert!(place(&mut ms, dir.start).is_err());
    for cut in [0, 10, good.len() / 2, good.len() - 30, good.len() - 1] {
        let q = d.path().join(format!("cut{cut}.zip"));
        std::fs::write(&q, &good[..cut]).unwrap();
        let e = format!("{:#}", scan(&q).unwrap_err());
        assert!(e.contains(&format!("cut{cut}.zip")), "{e}");
    }
    let mut flipped = good.clone();
    for i in (dir.start as usize..good.len()).step_by(7) {
        flipped[i] ^= 0x5a;
        std::fs::write(&p, &flipped).unwrap();
        let _ = scan(&p);
        flipped[i] ^= 0x5a;
    }
}

#[test]
fn a_local_header_just_before_the_directory_that_disagrees_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.zip");
    write(&p, &varied(), "");
    let mut b = std::fs::read(&p).unwrap();
    let (_, ms) = table_of(&p);
    // The last member by offset lies past the first 64 KiB (the members before it fill more).
    let last = ms.iter().max_by_key(|m| m.header).unwrap();
    assert!(last.header > LOCAL_CHECKED, "{}", last.header);
    let at = last.header as usize;
    assert_eq!(&b[at..at + 4], b"PK\x03\x04");
    b[at + 28] = b[at + 28].wrapping_add(1);
    std::fs::write(&p, &b).unwrap();
    let e = format!("{:#}", scan(&p).unwrap_err());
    assert!(e.contains("a.zip") && e.contains("disagrees"), "{e}");
}

#[test]
fn an_end_record_claiming_a_huge_or_too_small_directory_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.zip");
    write(&p, &varied(), "");
    let good = std::fs::read(&p).unwrap();
    let eocd = good.len() - 22;
    assert_eq!(&good[eocd..eocd + 4], b"PK\x05\x06");
    // The directory claims the whole archive from byte 0 (in bounds, but not 46 bytes a
    // member short of it): refused before anything is read.
    let mut b = good.clone();
    b[eocd + 12..eocd + 16].copy_from_slice(&(eocd as u32).to_le_bytes());
    b[eocd + 16..eocd + 20].copy_from_slice(&0u32.to_le_bytes());
    b[eocd + 10..eocd + 12].copy_from_slice(&u16::MAX.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let e = format!("{:#}", scan(&p).unwrap_err());
    assert!(
        e.contains("a.zip") && e.contains("central directory"),
        "{e}"
    );
    let mut read = |off: u64, n: usize| read_at(&p, off, n);
    let dir = directory(&mut read, b.len() as u64).unwrap_err();
    assert!(dir.contains("at least 46 a member"), "{dir}");
}

#[test]
fn a_directory_over_the_bound_is_refused_before_it_is_read() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("huge.zip");
    let len = MAX_DIRECTORY + (2 << 20);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(len).unwrap(); // sparse: nothing but the end record is written
    let mut eocd = b"PK\x05\x06".to_vec();
    eocd.extend_from_slice(&[0, 0, 0, 0, 1, 0, 1, 0]);
    eocd.extend_from_slice(&((MAX_DIRECTORY + 1) as u32).to_le_bytes());
    eocd.extend_from_slice(&0u32.to_le_bytes());
    eocd.extend_from_slice(&[0, 0]);
    std::os::unix::fs::FileExt::write_all_at(&f, &eocd, len - 22).unwrap();
    let mut read = |off: u64, n: usize| read_at(&p, off, n);
    let e = directory(&mut read, len).unwrap_err();
    assert!(e.contains("at most"), "{e}");
}
