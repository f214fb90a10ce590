//! The chunk cache over real files of zstd and deflate chunks: bytes served, damage refused,
//! single flight, and the budget counting chunks in flight.

use super::*;
use std::io::Write;

/// A file holding `chunks` (plain bytes) each compressed with zstd, one after the other, and
/// the chunk objects over it. `damage` breaks that chunk's zstd magic number.
fn zstd_file(chunks: &[Vec<u8>], damage: Option<usize>) -> (tempfile::NamedTempFile, Vec<Part>) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let mut parts = Vec::new();
    let file = Arc::new(f.reopen().unwrap());
    let mut at = 0u64;
    for (i, c) in chunks.iter().enumerate() {
        let mut z = zstd::encode_all(&c[..], 1).unwrap();
        if damage == Some(i) {
            z[0] ^= 0xff; // the frame's magic number
        }
        f.write_all(&z).unwrap();
        parts.push(Part::Chunk(Chunk {
            path: f.path().to_path_buf(),
            file: ChunkFile::Local(file.clone()),
            range: at..at + z.len() as u64,
            codec: Codec::Zstd,
            len: c.len() as u64,
            crc32: None,
            parquet: None,
        }));
        at += z.len() as u64;
    }
    f.flush().unwrap();
    (f, parts)
}

/// `n` distinct chunks of `len` bytes.
fn chunks(n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| (0..len).map(|j| ((i * 31 + j * 7) % 251) as u8).collect())
        .collect()
}

fn read(s: &MixedStorage, obj: ObjectId, off: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    s.read_at(obj, off, &mut b)?;
    Ok(b)
}

#[test]
fn chunks_are_served_decompressed_and_reads_past_them_refused() {
    let data = chunks(3, 4096);
    let (_f, parts) = zstd_file(&data, None);
    let s = MixedStorage::new(parts, 1 << 20);
    for (k, d) in data.iter().enumerate() {
        assert_eq!(read(&s, k as u32, 100, 50).unwrap(), &d[100..150]);
        assert_eq!(s.len(k as u32), 4096);
    }
    let e = read(&s, 1, 4000, 200).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    let e = read(&s, 9, 0, 1).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(s.resident(0, &(0..10)));
    s.evict(0, &(0..4096)).unwrap();
    assert!(!s.resident(0, &(0..10)), "evicted");
}

#[test]
fn a_damaged_chunk_fails_every_read_without_wedging_the_others() {
    let data = chunks(3, 8192);
    let (f, parts) = zstd_file(&data, Some(1));
    let s = MixedStorage::new(parts, 1 << 20);
    for _ in 0..3 {
        let e = read(&s, 1, 0, 10).unwrap_err();
        assert!(
            e.to_string().contains(&f.path().display().to_string()),
            "{e}"
        );
    }
    assert_eq!(read(&s, 2, 0, 10).unwrap(), &data[2][..10]);
}

#[test]
fn a_wrong_length_crc_or_claim_is_refused_naming_the_file() {
    let data = b"the decompressed bytes".to_vec();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&data).unwrap();
    let z = enc.finish().unwrap();
    f.write_all(&z).unwrap();
    let chunk = |len: u64, crc32: Option<u32>| Chunk {
        path: f.path().to_path_buf(),
        file: ChunkFile::Local(Arc::new(f.reopen().unwrap())),
        range: 0..z.len() as u64,
        codec: Codec::Deflate,
        len,
        crc32,
        parquet: None,
    };
    let n = data.len() as u64;
    assert_eq!(
        chunk(n, Some(crc32fast::hash(&data))).decompress().unwrap(),
        data
    );
    let e = chunk(n + 1, None).decompress().unwrap_err().to_string();
    assert!(
        e.contains("the index says") && e.contains(&f.path().display().to_string()),
        "{e}"
    );
    let e = chunk(n, Some(1)).decompress().unwrap_err().to_string();
    assert!(e.contains("CRC-32"), "{e}");
    let e = chunk(MAX_CHUNK + 1, None)
        .decompress()
        .unwrap_err()
        .to_string();
    assert!(e.contains("limit"), "{e}");
}

/// `ranges` of `c` through `for_each_range`: each range's bytes joined from its pieces, and the
/// largest piece seen.
fn streamed(c: &Chunk, ranges: &[std::ops::Range<u64>]) -> io::Result<(Vec<Vec<u8>>, usize)> {
    let mut out = vec![Vec::new(); ranges.len()];
    let (mut biggest, mut ended) = (0, vec![false; ranges.len()]);
    c.for_each_range(ranges, |k, piece, last| {
        assert!(!ended[k], "a piece after the last one of range {k}");
        out[k].extend_from_slice(piece);
        biggest = biggest.max(piece.len());
        ended[k] = last;
        Ok(())
    })?;
    assert!(ended.iter().all(|&e| e), "every range ends");
    Ok((out, biggest))
}

#[test]
fn ranges_stream_in_pieces_and_the_whole_chunk_is_still_checked() {
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (_f, parts) = zstd_file(std::slice::from_ref(&data), None);
    let Part::Chunk(c) = &parts[0] else { panic!() };
    let ranges = [0..10, 10..10, 100..2_500_000, 2_999_999..3_000_000];
    let (got, biggest) = streamed(c, &ranges).unwrap();
    for (r, g) in ranges.iter().zip(&got) {
        assert_eq!(g[..], data[r.start as usize..r.end as usize]);
    }
    assert!(biggest <= 1 << 20, "pieces of at most 1 MiB: {biggest}");
    // Unsorted ranges go through the whole chunk, and give the same bytes.
    let (got2, _) = streamed(c, &[100..2_500_000, 0..10]).unwrap();
    assert_eq!((&got2[0], &got2[1]), (&got[2], &got[0]));
    // A range past the end, a length claim the stream does not meet, a wrong CRC: refused
    // after the stream is read, naming the file.
    let e = streamed(c, std::slice::from_ref(&(0..3_000_001)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("past the chunk's end"), "{e}");
    let mut long = Chunk {
        len: 3_000_001,
        ..c.clone()
    };
    let e = streamed(&long, std::slice::from_ref(&(0..10)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the index says") && e.contains(&c.path.display().to_string()),
        "{e}"
    );
    long.len = 2_000_000;
    let e = streamed(&long, std::slice::from_ref(&(0..10)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the index says"),
        "a stream longer than its claim: {e}"
    );
    let bad_crc = Chunk {
        crc32: Some(1),
        ..c.clone()
    };
    let e = streamed(&bad_crc, std::slice::from_ref(&(0..10)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("CRC-32"), "{e}");
    let good_crc = Chunk {
        crc32: Some(crc32fast::hash(&data)),
        ..c.clone()
    };
    assert!(streamed(&good_crc, std::slice::from_ref(&(5..6))).is_ok());
}

#[test]
fn readers_of_one_chunk_share_one_decompression() {
    // Below the read-ahead size: no background decompression joins in.
    let data = chunks(1, 512 << 10);
    let (_f, parts) = zstd_file(&data, None);
    let s = MixedStorage::new(parts, 64 << 20);
    std::thread::scope(|sc| {
        for t in 0..8u64 {
            let (s, d) = (&s, &data[0]);
            sc.spawn(move || {
                let off = t * 1000;
                assert_eq!(
                    read(s, 0, off, 100).unwrap(),
                    &d[off as usize..off as usize + 100]
                );
            });
        }
    });
    assert_eq!(s.peak_bytes(), 512 << 10, "one chunk decompressed, once");
}

#[test]
fn chunks_in_flight_count_against_the_budget() {
    // 8 readers of 8 different 512 KiB chunks at once under a 1 MiB budget: at most two
    // chunks are held at any time, and every byte is right.
    let data = chunks(8, 512 << 10);
    let (_f, parts) = zstd_file(&data, None);
    let s = MixedStorage::new(parts, 1 << 20);
    std::thread::scope(|sc| {
        for t in 0..8usize {
            let (s, data) = (&s, &data);
            sc.spawn(move || {
                for round in 0..4 {
                    let k = (t + round) % 8;
                    let off = (round * 4096) as u64;
                    let got = read(s, k as u32, off, 4096).unwrap();
                    assert_eq!(got, &data[k][off as usize..off as usize + 4096]);
                }
            });
        }
    });
    assert!(s.peak_bytes() <= 1 << 20, "peak {}", s.peak_bytes());
}

#[test]
fn a_chunk_larger_than_the_budget_is_still_served() {
    let data = chunks(2, 256 << 10);
    let (_f, parts) = zstd_file(&data, None);
    let s = MixedStorage::new(parts, 1000);
    assert_eq!(read(&s, 0, 5, 5).unwrap(), &data[0][5..10]);
    assert_eq!(read(&s, 1, 5, 5).unwrap(), &data[1][5..10]);
    assert!(s.peak_bytes() <= 256 << 10);
}

#[test]
fn pinned_chunks_stay_outside_the_budget() {
    let data = chunks(3, 64 << 10);
    let (_f, parts) = zstd_file(&data, None);
    let s = MixedStorage::new(parts, 64 << 10);
    s.pin(0, &(0..1)).unwrap();
    read(&s, 1, 0, 1).unwrap();
    read(&s, 2, 0, 1).unwrap();
    assert!(s.resident(0, &(0..1)), "pinned");
    assert!(!s.resident(1, &(0..1)), "evicted for chunk 2");
}

#[test]
fn chunks_stored_in_another_storage_are_read_through_it() {
    // The compressed file as object 0 of a plain storage (as a remote shard is an object of
    // its dataset's block caches); the catalog sees chunk 0, chunk 1, then the plain object.
    let data = chunks(2, 5000);
    let (f, parts) = zstd_file(&data, None);
    let file = f.reopen().unwrap();
    // SAFETY: a read-only map of a test file nobody writes any more.
    let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
    let plain: Arc<dyn Storage> = Arc::new(LocalStorage::new(vec![LocalObject::new(file, map)]));
    let stored = |p: &Part| {
        let Part::Chunk(c) = p else { panic!() };
        Part::Chunk(Chunk {
            file: ChunkFile::Stored(plain.clone(), 0),
            ..c.clone()
        })
    };
    let mut over: Vec<Part<ObjectId>> = parts.iter().map(stored).collect();
    over.push(Part::Plain(0));
    let whole = std::fs::read(f.path()).unwrap();
    let s = MixedStorage::with_plain(plain.clone(), over, 1 << 20);
    for (k, d) in data.iter().enumerate() {
        assert_eq!(read(&s, k as u32, 0, 5000).unwrap(), *d);
    }
    assert_eq!(read(&s, 2, 0, whole.len()).unwrap(), whole);
    assert_eq!(s.len(2), whole.len() as u64);
    // A chunk whose range runs past its object's end fails its reads.
    let Part::Chunk(c) = stored(&parts[1]) else {
        panic!()
    };
    let past = Chunk {
        range: c.range.start..whole.len() as u64 + 10,
        ..c
    };
    let s = MixedStorage::with_plain(plain, vec![Part::Chunk(past)], 1 << 20);
    let e = read(&s, 0, 0, 10).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
}
