//! Writes a pack: a ZIP64 archive (via the `zip` crate) with every member STORED and its data
//! aligned, members in the order they are added (the caller adds them in pack order), then the
//! index member and the trailer comment.
//!
//! Data offsets for the index are taken from a position-tracking wrapper around the output
//! file: right after `start_file` the stream position is where the member's data begins.

use super::index::{self, Node, Record};
use super::trailer::Trailer;
use super::{FormatError, INDEX_MEMBER};
use std::collections::HashMap;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// Metadata of a source entry, as recorded in the pack.
#[derive(Debug, Clone, Copy)]
pub struct EntryMeta {
    /// Unix mode (type and permission bits).
    pub mode: u32,
    /// Modification time: seconds since the Unix epoch.
    pub mtime_sec: i64,
    /// Nanoseconds of the modification time.
    pub mtime_nsec: u32,
}

/// Node number of the root directory in a [`PackWriter`].
pub const ROOT: usize = 0;

/// Streams members into a new pack. Add directories before their contents, in pack order.
pub struct PackWriter<W: Write + Seek> {
    /// `None` once finished. An unfinished writer is abandoned on drop without writing (see
    /// the `Drop` impl).
    zip: Option<ZipWriter<PosWriter<W>>>,
    pos: Arc<AtomicU64>,
    /// Where the central directory starts once [`PackWriter::finish`] begins (see
    /// `PosWriter`).
    tail_from: Arc<AtomicU64>,
    align: u32,
    nodes: Vec<Node>,
    dir_paths: HashMap<usize, String>,
}

impl<W: Write + Seek> PackWriter<W> {
    /// Starts a pack on `out` with member data aligned to `align` bytes (a power of two,
    /// 1..=[`super::MAX_ALIGN`]). `root` gives the root directory's mode and mtime.
    pub fn new(out: W, align: u32, root: EntryMeta) -> Result<Self, FormatError> {
        if !align.is_power_of_two() || align > super::MAX_ALIGN {
            return Err(FormatError::Corrupt(format!(
                "alignment {align} is not a power of two between 1 and {}",
                super::MAX_ALIGN
            )));
        }
        let pos = Arc::new(AtomicU64::new(0));
        let tail_from = Arc::new(AtomicU64::new(u64::MAX));
        let w = PosWriter {
            inner: BufWriter::with_capacity(1 << 20, out),
            pos: pos.clone(),
            tail_from: tail_from.clone(),
            tail: Vec::new(),
        };
        let root = Node {
            parent: None,
            name: Vec::new(),
            record: record_for(root, true),
        };
        let mut dir_paths = HashMap::new();
        dir_paths.insert(ROOT, String::new());
        Ok(PackWriter {
            zip: Some(ZipWriter::new(w)),
            tail_from,
            pos,
            align,
            nodes: vec![root],
            dir_paths,
        })
    }

    fn options(&self, meta: EntryMeta) -> SimpleFileOptions {
        let mut o = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .unix_permissions(meta.mode & 0o7777)
            .with_alignment(self.align as u16)
            .large_file(false);
        if let Some(t) = dos_time(meta.mtime_sec) {
            o = o.last_modified_time(t);
        }
        o
    }

    fn member_path(&self, parent: usize, name: &str) -> Result<String, FormatError> {
        let base = self
            .dir_paths
            .get(&parent)
            .ok_or_else(|| FormatError::Corrupt(format!("node {parent} is not a directory")))?;
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(FormatError::Corrupt(format!(
                "invalid member name {name:?}"
            )));
        }
        Ok(if base.is_empty() {
            name.to_string()
        } else {
            format!("{base}/{name}")
        })
    }

    /// Adds directory `name` under directory node `parent`; returns its node number.
    pub fn add_dir(
        &mut self,
        parent: usize,
        name: &str,
        meta: EntryMeta,
    ) -> Result<usize, FormatError> {
        let path = self.member_path(parent, name)?;
        // Directories have no data: no alignment padding for them.
        let opts = self.options(meta).with_alignment(1);
        self.zip()?
            .add_directory(format!("{path}/"), opts)
            .map_err(zip_err)?;
        let id = self.nodes.len();
        self.nodes.push(Node {
            parent: Some(parent),
            name: name.as_bytes().to_vec(),
            record: record_for(meta, true),
        });
        self.dir_paths.insert(id, path);
        Ok(id)
    }

    /// Adds file `name` under directory node `parent` with contents `data`. `crc32` is the
    /// CRC-32 of `data` (the caller computes it off the writing thread) and `jpeg` its header
    /// probe. Returns the node number.
    pub fn add_file(
        &mut self,
        parent: usize,
        name: &str,
        meta: EntryMeta,
        data: &[u8],
        crc32: u32,
        jpeg: Option<super::jpeg::JpegInfo>,
    ) -> Result<usize, FormatError> {
        let data_off = self.start_member(parent, name, meta, data.len() as u64)?;
        self.zip()?.write_all(data)?;
        Ok(self.push_file(parent, name, meta, data_off, data.len() as u64, crc32, jpeg))
    }

    /// Adds file `name` under directory node `parent`, copying exactly `size` bytes from
    /// `data` in 1 MiB chunks (so a file of any size costs 1 MiB of memory), computing its
    /// CRC-32 and JPEG header probe (on the first chunk) on the way. Returns the node number.
    /// Errors: I/O errors; `data` ends before `size` bytes or has more (the file changed).
    pub fn add_file_from(
        &mut self,
        parent: usize,
        name: &str,
        meta: EntryMeta,
        size: u64,
        data: &mut dyn std::io::Read,
    ) -> Result<usize, FormatError> {
        let data_off = self.start_member(parent, name, meta, size)?;
        let mut buf = vec![0u8; 1 << 20];
        let (mut done, mut crc, mut jpeg) = (0u64, crc32fast::Hasher::new(), None);
        loop {
            // Whole chunks (a reader may return less per call), so the probe sees 1 MiB.
            let n = fill(data, &mut buf)?;
            if n == 0 {
                break;
            }
            if done == 0 {
                jpeg = super::jpeg::probe(&buf[..n]);
            }
            crc.update(&buf[..n]);
            self.zip()?.write_all(&buf[..n])?;
            done += n as u64;
            if done > size {
                break;
            }
        }
        if done != size {
            return Err(FormatError::Io(std::io::Error::other(format!(
                "{name} changed while being packed: {done} bytes read where {size} were listed"
            ))));
        }
        Ok(self.push_file(parent, name, meta, data_off, size, crc.finalize(), jpeg))
    }

    /// Starts the zip member of a `size`-byte file; returns the offset its data starts at.
    fn start_member(
        &mut self,
        parent: usize,
        name: &str,
        meta: EntryMeta,
        size: u64,
    ) -> Result<u64, FormatError> {
        let path = self.member_path(parent, name)?;
        let opts = self.options(meta).large_file(size >= u32::MAX as u64);
        self.zip()?.start_file(path, opts).map_err(zip_err)?;
        Ok(self.pos.load(Ordering::Relaxed))
    }

    /// Records a file node whose data was written at `data_off`; returns its number.
    #[allow(clippy::too_many_arguments)]
    fn push_file(
        &mut self,
        parent: usize,
        name: &str,
        meta: EntryMeta,
        data_off: u64,
        size: u64,
        crc32: u32,
        jpeg: Option<super::jpeg::JpegInfo>,
    ) -> usize {
        let mut record = record_for(meta, false);
        (record.data_off, record.size, record.crc32) = (data_off, size, crc32);
        if let Some(j) = jpeg {
            (record.width, record.height, record.components) = (j.width, j.height, j.components);
        }
        self.nodes.push(Node {
            parent: Some(parent),
            name: name.as_bytes().to_vec(),
            record,
        });
        self.nodes.len() - 1
    }

    /// Whether node `id` is a file whose JPEG header was recognised.
    pub fn is_jpeg(&self, id: usize) -> bool {
        self.nodes.get(id).is_some_and(|n| n.record.width > 0)
    }

    /// Number of nodes added so far, root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: the root exists from the start.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the index member and the trailer, finishes the archive and returns the output
    /// (flushed, not synced).
    pub fn finish(mut self) -> Result<W, FormatError> {
        let index = index::build(&self.nodes, self.align)?;
        let meta = EntryMeta {
            mode: 0o100444,
            mtime_sec: self.nodes[ROOT].record.mtime_sec,
            mtime_nsec: 0,
        };
        let opts = self.options(meta).large_file(false);
        self.zip()?
            .start_file(INDEX_MEMBER, opts)
            .map_err(zip_err)?;
        let index_offset = self.pos.load(Ordering::Relaxed);
        self.zip()?.write_all(&index)?;
        let trailer = Trailer {
            version: index::INDEX_VERSION,
            index_offset,
            index_len: index.len() as u64,
        };
        let mut zip = self.zip.take().ok_or_else(finished)?;
        zip.set_comment(trailer.encode());
        // The last member's data ends here: all the zip writer writes from here on (the central
        // directory and the end records) is kept, and written without alignment padding.
        let start = self.pos.load(Ordering::Relaxed);
        self.tail_from.store(start, Ordering::Relaxed);
        let mut w = zip.finish().map_err(zip_err)?;
        let tail = strip_central_padding(start, &w.tail)?;
        w.inner.seek(SeekFrom::Start(start))?;
        w.inner.write_all(&tail)?;
        w.inner
            .into_inner()
            .map_err(|e| FormatError::Io(e.into_error()))
    }
}

impl<W: Write + Seek> PackWriter<W> {
    fn zip(&mut self) -> Result<&mut ZipWriter<PosWriter<W>>, FormatError> {
        self.zip.as_mut().ok_or_else(finished)
    }
}

/// Reads from `r` until `buf` is full or the input ends; returns the bytes read.
fn fill(r: &mut dyn std::io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn finished() -> FormatError {
    FormatError::Io(std::io::Error::other(
        "the pack writer was already finished",
    ))
}

/// A writer dropped unfinished (an error or an interrupt) is abandoned: its caller removes the
/// output, so nothing more is written to it. (The zip writer would otherwise try to write a
/// central directory on drop, and on a full disk print its own error before the caller's.)
impl<W: Write + Seek> Drop for PackWriter<W> {
    fn drop(&mut self) {
        if let Some(zip) = self.zip.take() {
            std::mem::forget(zip);
        }
    }
}

fn record_for(meta: EntryMeta, is_dir: bool) -> Record {
    Record {
        is_dir,
        mode: meta.mode,
        mtime_sec: meta.mtime_sec,
        mtime_nsec: meta.mtime_nsec,
        ..Record::default()
    }
}

fn zip_err(e: zip::result::ZipError) -> FormatError {
    match e {
        zip::result::ZipError::Io(e) => FormatError::Io(e),
        other => FormatError::Corrupt(format!("zip writer: {other}")),
    }
}

/// MS-DOS timestamp (UTC) for a Unix time, `None` outside 1980..=2107 (zip keeps its default).
fn dos_time(sec: i64) -> Option<zip::DateTime> {
    let t = time::OffsetDateTime::from_unix_timestamp(sec).ok()?;
    zip::DateTime::try_from(t).ok()
}

/// A writer that tracks its stream position in a shared counter, and keeps what is written at
/// or past `tail_from` in memory instead (for [`strip_central_padding`]).
struct PosWriter<W: Write + Seek> {
    inner: BufWriter<W>,
    pos: Arc<AtomicU64>,
    /// Bytes at or past this offset are kept in `tail` instead of written (`u64::MAX`: none).
    tail_from: Arc<AtomicU64>,
    tail: Vec<u8>,
}

impl<W: Write + Seek> Write for PosWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let pos = self.pos.load(Ordering::Relaxed);
        let from = self.tail_from.load(Ordering::Relaxed);
        if pos >= from {
            let at = (pos - from) as usize;
            if self.tail.len() < at + buf.len() {
                self.tail.resize(at + buf.len(), 0);
            }
            self.tail[at..at + buf.len()].copy_from_slice(buf);
            self.pos.store(pos + buf.len() as u64, Ordering::Relaxed);
            return Ok(buf.len());
        }
        // Below the kept tail: never write across its start.
        let room = usize::try_from(from - pos).unwrap_or(usize::MAX);
        let n = self.inner.write(&buf[..buf.len().min(room)])?;
        self.pos.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write + Seek> Seek for PosWriter<W> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let from = self.tail_from.load(Ordering::Relaxed);
        if from == u64::MAX {
            let p = self.inner.seek(to)?;
            self.pos.store(p, Ordering::Relaxed);
            return Ok(p);
        }
        let pos = self.pos.load(Ordering::Relaxed);
        let p = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => pos.checked_add_signed(d),
            SeekFrom::End(d) => (from + self.tail.len() as u64).checked_add_signed(d),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        if p < from {
            self.inner.seek(SeekFrom::Start(p))?;
        }
        self.pos.store(p, Ordering::Relaxed);
        Ok(p)
    }
}

/// Extra field id of the zip writer's alignment padding (APPNOTE 4.6.11, as zipalign writes).
const PADDING_FIELD: u16 = 0xa11e;

/// Rewrites the central directory and end records the zip writer produced at offset `start`
/// without alignment padding in the central records (it belongs in the local headers only:
/// repeated in the central directory it made 100k files of 64 B an 822 MB pack, 405 MB of it
/// central directory), with the sizes and offsets that change with it.
/// Errors: output not shaped as the zip writer writes it.
fn strip_central_padding(start: u64, tail: &[u8]) -> Result<Vec<u8>, FormatError> {
    let bad = |what: &str| FormatError::Corrupt(format!("unexpected zip writer output: {what}"));
    let u16_at = |b: &[u8], o: usize| usize::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let mut out = Vec::with_capacity(tail.len());
    let mut i = 0;
    while tail[i..].starts_with(b"PK\x01\x02") {
        let h = tail
            .get(i..i + 46)
            .ok_or_else(|| bad("short central record"))?;
        let (name, extra, comment) = (u16_at(h, 28), u16_at(h, 30), u16_at(h, 32));
        let end = i + 46 + name + extra + comment;
        let rec = tail
            .get(i..end)
            .ok_or_else(|| bad("central record past the end"))?;
        let at = out.len();
        out.extend_from_slice(&rec[..46 + name]);
        let fields = &rec[46 + name..46 + name + extra];
        let mut k = 0;
        while k + 4 <= fields.len() {
            let (id, len) = (u16_at(fields, k), u16_at(fields, k + 2));
            let f = fields
                .get(k..k + 4 + len)
                .ok_or_else(|| bad("extra field past its end"))?;
            if id != usize::from(PADDING_FIELD) {
                out.extend_from_slice(f);
            }
            k += 4 + len;
        }
        let kept = u16::try_from(out.len() - at - 46 - name).map_err(|_| bad("extra field"))?;
        out[at + 30..at + 32].copy_from_slice(&kept.to_le_bytes());
        out.extend_from_slice(&rec[46 + name + extra..]);
        i = end;
    }
    let cd_len = out.len() as u64;
    let mut rest = tail[i..].to_vec();
    let mut j = 0;
    if rest.starts_with(b"PK\x06\x06") {
        // ZIP64 end of central directory: the central directory's size at +40.
        let size = rest.get(4..12).ok_or_else(|| bad("zip64 end record"))?;
        j = 12 + u64::from_le_bytes(size.try_into().map_err(|_| bad("zip64 end"))?) as usize;
        rest.get_mut(40..48)
            .ok_or_else(|| bad("zip64 end record"))?
            .copy_from_slice(&cd_len.to_le_bytes());
        if rest.get(j..).is_some_and(|r| r.starts_with(b"PK\x06\x07")) {
            // Its locator: the offset of the ZIP64 end record at +8.
            rest.get_mut(j + 8..j + 16)
                .ok_or_else(|| bad("zip64 locator"))?
                .copy_from_slice(&(start + cd_len).to_le_bytes());
            j += 20;
        }
    }
    let eocd = rest
        .get_mut(j..j + 22)
        .ok_or_else(|| bad("no end record"))?;
    if !eocd.starts_with(b"PK\x05\x06") {
        return Err(bad("no end of central directory record"));
    }
    if eocd[12..16] != [0xff; 4] {
        let len = u32::try_from(cd_len).map_err(|_| bad("central directory over 4 GiB"))?;
        eocd[12..16].copy_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(&rest);
    Ok(out)
}
