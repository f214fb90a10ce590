//! One compressed chunk: a range of a file whose bytes are served decompressed (a zstd MDS
//! shard or LitData frame, a deflated zip member, a Parquet row group's images), checked
//! against its declared length (at most [`MAX_CHUNK`]) and, for zip, its CRC-32. The file is
//! local, or an object of another storage (a remote shard read through its block cache).

use std::fs::File;
use std::io::{self, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

/// The largest decompressed chunk served, bytes (512 MiB): a chunk is decompressed whole into
/// memory, so a longer claim (a decompression bomb, a damaged length) is refused, naming the
/// file. Real chunks are far smaller: MDS shards and LitData chunks default to 64 MiB
/// (`size_limit`, `chunk_bytes`), and a zip member of a sample dataset is one file.
pub const MAX_CHUNK: u64 = 512 << 20;

/// How a chunk is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// A zstd stream (one or more frames).
    Zstd,
    /// Raw deflate (a zip member).
    Deflate,
    /// The image values of one row group of a Parquet file, concatenated in row order, as the
    /// `parquet` crate decodes them (any codec, dictionary or not). `range` is unused.
    ParquetRowGroup,
}

/// Where a chunk's compressed bytes are read from.
#[derive(Clone)]
pub enum ChunkFile {
    /// A local file, shared by every chunk of it (a zip of many members opens it once).
    Local(Arc<File>),
    /// Object `1` of a storage (a remote shard through its block cache: fetched, checked).
    Stored(Arc<dyn crate::storage::Storage>, crate::storage::ObjectId),
}

impl std::fmt::Debug for ChunkFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkFile::Local(file) => f.debug_tuple("Local").field(file).finish(),
            ChunkFile::Stored(_, obj) => f.debug_tuple("Stored").field(obj).finish(),
        }
    }
}

impl ChunkFile {
    /// Asks for bytes `r` ahead of their reads (the device, or the storage's read-ahead).
    pub fn will_need(&self, r: &Range<u64>) {
        match self {
            ChunkFile::Local(f) => {
                let _ = crate::storage::fadvise(
                    f,
                    r,
                    nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
                );
            }
            ChunkFile::Stored(s, obj) => s.will_need(*obj, r),
        }
    }

    /// Drops bytes `r` from the page cache (or the storage's cache), so their next read is cold.
    pub fn evict(&self, r: &Range<u64>) -> io::Result<()> {
        match self {
            ChunkFile::Local(f) => {
                crate::storage::fadvise(f, r, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)
            }
            ChunkFile::Stored(s, obj) => s.evict(*obj, r),
        }
    }

    /// Reads `buf.len()` bytes at `at`. Errors: I/O, or the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        match self {
            ChunkFile::Local(f) => f.read_exact_at(buf, at),
            ChunkFile::Stored(s, obj) => {
                if at.saturating_add(buf.len() as u64) > s.len(*obj) {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "a chunk runs past the end of its object",
                    ));
                }
                s.read_at(*obj, at, buf)
            }
        }
    }
}

/// A stored chunk file as the `parquet` crate reads files: ranges of the object.
struct StoredParquet(Arc<dyn crate::storage::Storage>, crate::storage::ObjectId);

impl parquet::file::reader::Length for StoredParquet {
    fn len(&self) -> u64 {
        self.0.len(self.1)
    }
}

impl parquet::file::reader::ChunkReader for StoredParquet {
    type T = io::BufReader<StoredRead>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(io::BufReader::with_capacity(
            1 << 20,
            StoredRead {
                file: ChunkFile::Stored(self.0.clone(), self.1),
                at: start,
                end: self.0.len(self.1),
            },
        ))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        let mut buf = vec![0u8; length];
        ChunkFile::Stored(self.0.clone(), self.1)
            .read_exact_at(&mut buf, start)
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
        Ok(buf.into())
    }
}

/// One compressed chunk: bytes `range` of `path`, `len` bytes once decompressed.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The file, for messages.
    pub path: PathBuf,
    /// Where its bytes are read from.
    pub file: ChunkFile,
    /// The compressed bytes in the file.
    pub range: Range<u64>,
    /// How they are compressed.
    pub codec: Codec,
    /// Decompressed length, bytes.
    pub len: u64,
    /// CRC-32 of the decompressed bytes, when the container records one (zip).
    pub crc32: Option<u32>,
    /// For [`Codec::ParquetRowGroup`]: the row group and the image column's group name.
    pub parquet: Option<(usize, String)>,
}

impl Chunk {
    /// The concatenated image bytes of a Parquet row group (see [`Codec::ParquetRowGroup`]).
    fn parquet_images(&self) -> io::Result<Vec<u8>> {
        use parquet::file::reader::SerializedFileReader;
        let bad = |why: String| self.bad(why);
        // Its own open file: the crate seeks and reads, and a dup of the shared handle would
        // share the offset with other row groups decoded at the same time.
        let (g, image) = self
            .parquet
            .clone()
            .ok_or_else(|| bad("no row group given".into()))?;
        match &self.file {
            ChunkFile::Local(_) => {
                let reader = SerializedFileReader::new(File::open(&self.path)?)
                    .map_err(|e| bad(e.to_string()))?;
                self.row_group_images(&reader, g, &image)
            }
            ChunkFile::Stored(s, obj) => {
                let reader = SerializedFileReader::new(StoredParquet(s.clone(), *obj))
                    .map_err(|e| bad(e.to_string()))?;
                self.row_group_images(&reader, g, &image)
            }
        }
    }

    /// The concatenated image bytes (column group `image`) of row group `g` of `reader`.
    fn row_group_images(
        &self,
        reader: &impl parquet::file::reader::FileReader,
        g: usize,
        image: &str,
    ) -> io::Result<Vec<u8>> {
        use parquet::record::Field;
        let bad = |why: String| self.bad(why);
        let rg = reader
            .get_row_group(g)
            .map_err(|e| bad(format!("row group {g}: {e}")))?;
        let mut out = Vec::with_capacity(self.len as usize);
        for row in rg
            .get_row_iter(None)
            .map_err(|e| bad(format!("row group {g}: {e}")))?
        {
            let row = row.map_err(|e| bad(format!("row group {g}: {e}")))?;
            for (name, field) in row.get_column_iter() {
                if let (true, Field::Group(img)) = (*name == image, field) {
                    for (n, v) in img.get_column_iter() {
                        if let ("bytes", Field::Bytes(b)) = (n.as_str(), v) {
                            out.extend_from_slice(b.data());
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Reads and decompresses the chunk. Errors: I/O, a damaged stream, a length or CRC-32
    /// that does not match (the message names the file).
    pub fn decompress(&self) -> io::Result<Vec<u8>> {
        self.check_limit()?;
        if self.codec == Codec::ParquetRowGroup {
            let out = self.parquet_images()?;
            if out.len() as u64 != self.len {
                return Err(self.bad(format!(
                    "row group images are {} bytes, the index says {}",
                    out.len(),
                    self.len
                )));
            }
            return Ok(out);
        }
        let mut raw = vec![0u8; (self.range.end - self.range.start) as usize];
        self.file.read_exact_at(&mut raw, self.range.start)?;
        let r = match self.codec {
            Codec::ParquetRowGroup => unreachable!("handled above"),
            Codec::Zstd => {
                zstd::stream::read::Decoder::new(&raw[..]).and_then(|d| read_declared(d, self.len))
            }
            Codec::Deflate => read_declared(flate2::read::DeflateDecoder::new(&raw[..]), self.len),
        };
        let out = r.map_err(|e| self.stream_error(e))?;
        self.check_output(out.len() as u64, || crc32fast::hash(&out))?;
        Ok(out)
    }

    /// An `InvalidData` error whose message names the chunk's file.
    fn bad(&self, why: String) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", self.path.display()),
        )
    }

    /// A decompressor's error, with the compressed byte range that gave it.
    fn stream_error(&self, e: io::Error) -> io::Error {
        self.bad(format!(
            "bytes {}..{} do not decompress ({e})",
            self.range.start, self.range.end
        ))
    }

    /// Refuses a chunk whose declared decompressed length is over [`MAX_CHUNK`].
    fn check_limit(&self) -> io::Result<()> {
        if self.len > MAX_CHUNK {
            return Err(self.bad(format!(
                "a chunk of {} bytes decompressed is over the {} byte limit for one chunk",
                self.len, MAX_CHUNK
            )));
        }
        Ok(())
    }

    /// Checks a decompressed stream of `n` bytes against the declared length, then (when the
    /// archive gives one) its CRC-32, computed by `crc` only when needed.
    fn check_output(&self, n: u64, crc: impl FnOnce() -> u32) -> io::Result<()> {
        if n != self.len {
            return Err(self.bad(format!(
                "bytes {}..{} decompress to {n} bytes, the index says {}",
                self.range.start, self.range.end, self.len
            )));
        }
        match self.crc32 {
            Some(want) => match crc() {
                got if got != want => Err(self.bad(format!(
                    "decompressed CRC-32 {got:08x}, the archive says {want:08x}"
                ))),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Chunk {
    /// Decompresses the chunk as a stream and calls `each(k, piece, last)` with the bytes of
    /// `ranges[k]` (offsets in the decompressed chunk), in order, in pieces of at most 1 MiB
    /// (`last` on the range's final piece, also for an empty range): index builds hold neither
    /// a chunk nor a sample whole, whatever their lengths. Checks the
    /// chunk's length and CRC-32 as [`Chunk::decompress`] does, after the last range. Parquet
    /// row groups, and ranges that are not sorted and disjoint, go through
    /// [`Chunk::decompress`]. Errors: those of `decompress`, a range past the chunk's end, and
    /// `each`'s own.
    pub fn for_each_range(
        &self,
        ranges: &[Range<u64>],
        mut each: impl FnMut(usize, &[u8], bool) -> io::Result<()>,
    ) -> io::Result<()> {
        let disjoint = ranges.windows(2).all(|w| w[0].end <= w[1].start)
            && ranges.iter().all(|r| r.start <= r.end);
        if self.codec == Codec::ParquetRowGroup || !disjoint {
            let data = self.decompress()?;
            for (k, r) in ranges.iter().enumerate() {
                let b = usize::try_from(r.start)
                    .ok()
                    .zip(usize::try_from(r.end).ok())
                    .and_then(|(s, e)| data.get(s..e))
                    .ok_or_else(|| self.bad(format!("bytes {r:?} lie past the chunk's end")))?;
                each(k, b, true)?;
            }
            return Ok(());
        }
        self.check_limit()?;
        let raw = io::BufReader::with_capacity(
            1 << 20,
            StoredRead {
                file: self.file.clone(),
                at: self.range.start,
                end: self.range.end,
            },
        );
        let dec: Box<dyn Read> = match self.codec {
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(raw)?),
            _ => Box::new(flate2::bufread::DeflateDecoder::new(raw)),
        };
        // One byte past the declared length is read, so a longer stream is seen.
        let mut r = Hashing {
            inner: dec.take(self.len.saturating_add(1)),
            crc: crc32fast::Hasher::new(),
            n: 0,
        };
        let stream_err = |e| self.stream_error(e);
        let mut buf = vec![0u8; 1 << 20];
        'ranges: for (k, rg) in ranges.iter().enumerate() {
            if rg.end > self.len {
                return Err(self.bad(format!("bytes {rg:?} lie past the chunk's end")));
            }
            let skip = rg.start - r.n;
            if io::copy(&mut (&mut r).take(skip), &mut io::sink()).map_err(stream_err)? < skip {
                break;
            }
            loop {
                let want = (rg.end - r.n).min(buf.len() as u64) as usize;
                let got =
                    crate::storage::read_full(&mut r, &mut buf[..want]).map_err(stream_err)?;
                if got < want {
                    break 'ranges;
                }
                let last = r.n == rg.end;
                each(k, &buf[..got], last)?;
                if last {
                    break;
                }
            }
        }
        io::copy(&mut r, &mut io::sink()).map_err(stream_err)?;
        self.check_output(r.n, || r.crc.finalize())
    }
}

/// Reads bytes `at..end` of a chunk file by positioned reads (no shared file offset: other
/// threads read the same file), at most 1 MiB at a time.
pub struct StoredRead {
    file: ChunkFile,
    at: u64,
    end: u64,
}

impl Read for StoredRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.end - self.at).min(buf.len() as u64).min(1 << 20) as usize;
        if n == 0 {
            return Ok(0);
        }
        let k = match &self.file {
            ChunkFile::Local(f) => f.read_at(&mut buf[..n], self.at)?,
            ChunkFile::Stored(..) => {
                self.file.read_exact_at(&mut buf[..n], self.at)?;
                n
            }
        };
        self.at += k as u64;
        Ok(k)
    }
}

/// A reader that counts and CRC-32s what passes through it.
struct Hashing<R> {
    inner: R,
    crc: crc32fast::Hasher,
    n: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.crc.update(&buf[..k]);
        self.n += k as u64;
        Ok(k)
    }
}

/// Reads `r` to its end, or to one byte past `len` (a stream longer than declared), into a
/// buffer that never holds more than `len + 1` bytes of capacity. The length is the file's own
/// claim: the first 16 MiB are reserved as the stream proves them, then the rest of the claim
/// at once (exactly, so a chunk of `len` bytes costs `len`, not the doubling of a growing
/// buffer, which for a 1 GiB chunk reached 2 GiB).
pub(crate) fn read_declared(mut r: impl Read, len: u64) -> io::Result<Vec<u8>> {
    const PROVEN: u64 = 16 << 20;
    let limit = len.saturating_add(1);
    let mut out: Vec<u8> = Vec::with_capacity(limit.min(PROVEN) as usize);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let room = (limit - out.len() as u64).min(buf.len() as u64) as usize;
        if room == 0 {
            break;
        }
        let n = match r.read(&mut buf[..room]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if out.len() + n > out.capacity() {
            let want = if out.len() as u64 >= PROVEN {
                limit
            } else {
                limit.min(PROVEN.max(out.len() as u64 + n as u64))
            };
            out.reserve_exact(want as usize - out.len());
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}
