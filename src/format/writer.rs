//! Writes a pack: a ZIP64 archive with every member STORED and its data aligned, members in
//! the order they are added (the caller adds them in pack order), then the index member, the
//! central directory and the trailer comment (`docs/FORMAT.md`, PKWARE APPNOTE 6.3.10 §4.3).
//!
//! The zip layer is written here rather than with the `zip` crate: the crate keeps every
//! member's alignment padding (its extra field, up to the alignment) in memory until the
//! archive is finished and repeats it in the central directory, so packing cost ~8.7 KB of
//! memory per file (868 MB for 100k files, ~11 GB for ImageNet-1k). Stored members need only
//! their local headers, written as they come, and a central directory generated at the end
//! from the index's own records (one u64 per member kept: its local header's offset), streamed
//! to the file. The `zip` crate still reads packs (tests, `verify`'s zip layer check) and
//! converts timestamps.

use super::index::{self, Node, Record};
use super::trailer::Trailer;
use super::{FormatError, INDEX_MEMBER};
use std::collections::HashMap;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};

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

/// The largest value a 32-bit zip field holds; at or past it a ZIP64 field is used.
const ZIP32_MAX: u64 = 0xFFFF_FFFF;
/// Extra field id of the alignment padding (APPNOTE 4.6.11, as zipalign writes it).
const PADDING_FIELD: u16 = 0xa11e;
/// Extra field id of the ZIP64 sizes and offset (APPNOTE 4.5.3).
const ZIP64_FIELD: u16 = 0x0001;
/// General purpose flag bit 11: the name is UTF-8.
const UTF8_FLAG: u16 = 0x0800;

/// The output stream and its position.
struct Out<W: Write + Seek> {
    inner: BufWriter<W>,
    pos: u64,
}

impl<W: Write + Seek> Out<W> {
    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.inner.write_all(b)?;
        self.pos += b.len() as u64;
        Ok(())
    }

    /// Overwrites bytes at `at` (before the current position) and comes back.
    fn patch(&mut self, at: u64, b: &[u8]) -> io::Result<()> {
        self.inner.seek(SeekFrom::Start(at))?;
        self.inner.write_all(b)?;
        self.inner.seek(SeekFrom::Start(self.pos))?;
        Ok(())
    }
}

/// One member as the central directory lists it.
struct Member<'a> {
    path: &'a str,
    is_dir: bool,
    mode: u32,
    mtime_sec: i64,
    crc32: u32,
    size: u64,
    header: u64,
}

/// Little-endian byte building for zip records.
trait Le {
    fn u16(&mut self, v: u16) -> &mut Self;
    fn u32(&mut self, v: u32) -> &mut Self;
    fn u64(&mut self, v: u64) -> &mut Self;
}

impl Le for Vec<u8> {
    fn u16(&mut self, v: u16) -> &mut Self {
        self.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// A 32-bit zip field for `v`: `v`, or the ZIP64 marker when it does not fit.
fn zip32(v: u64) -> u32 {
    u32::try_from(v)
        .ok()
        .filter(|&x| u64::from(x) < ZIP32_MAX)
        .unwrap_or(u32::MAX)
}

/// MS-DOS (time, date) of a Unix time, UTC; 1980-01-01 00:00 outside 1980..=2107.
fn dos_time(sec: i64) -> (u16, u16) {
    let t = time::OffsetDateTime::from_unix_timestamp(sec)
        .ok()
        .and_then(|t| zip::DateTime::try_from(t).ok())
        .unwrap_or_default();
    (t.timepart(), t.datepart())
}

/// Streams members into a new pack. Add directories before their contents, in pack order.
pub struct PackWriter<W: Write + Seek> {
    /// `None` once finished.
    out: Option<Out<W>>,
    align: u32,
    nodes: Vec<Node>,
    /// Offset of each node's local header (the root has none: `u64::MAX`).
    headers: Vec<u64>,
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
        let mut inner = BufWriter::with_capacity(1 << 20, out);
        let pos = inner.stream_position()?;
        let root = Node {
            parent: None,
            name: Vec::new(),
            record: record_for(root, true),
        };
        let mut dir_paths = HashMap::new();
        dir_paths.insert(ROOT, String::new());
        Ok(PackWriter {
            out: Some(Out { inner, pos }),
            align,
            nodes: vec![root],
            headers: vec![u64::MAX],
            dir_paths,
        })
    }

    fn out(&mut self) -> Result<&mut Out<W>, FormatError> {
        self.out.as_mut().ok_or_else(finished)
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

    /// Writes the local header of member `path` (`size` bytes, `crc32`), its data aligned to
    /// `align`; returns (header offset, data offset).
    fn local_header(
        &mut self,
        path: &str,
        mtime_sec: i64,
        size: u64,
        crc32: u32,
        align: u32,
    ) -> Result<(u64, u64), FormatError> {
        let name = path.as_bytes();
        let name_len = u16::try_from(name.len())
            .map_err(|_| FormatError::Corrupt(format!("member name of {} bytes", name.len())))?;
        let zip64 = size >= ZIP32_MAX;
        let mut extra = Vec::new();
        if zip64 {
            extra.u16(ZIP64_FIELD).u16(16).u64(size).u64(size);
        }
        let start = self.out()?.pos;
        let align = u64::from(align);
        let unaligned = (start + 30 + name.len() as u64 + extra.len() as u64) % align;
        if unaligned != 0 {
            let mut pad = align - unaligned;
            while pad < 6 {
                pad += align;
            }
            extra
                .u16(PADDING_FIELD)
                .u16(pad as u16 - 4)
                .u16(align as u16);
            extra.resize(extra.len() + pad as usize - 6, 0);
        }
        let (time, date) = dos_time(mtime_sec);
        let mut h = Vec::with_capacity(30 + name.len() + extra.len());
        h.u32(0x0403_4b50)
            .u16(if zip64 { 45 } else { 20 })
            .u16(UTF8_FLAG)
            .u16(0);
        h.u16(time)
            .u16(date)
            .u32(crc32)
            .u32(zip32(size))
            .u32(zip32(size));
        h.u16(name_len).u16(extra.len() as u16);
        h.extend_from_slice(name);
        h.extend_from_slice(&extra);
        let out = self.out()?;
        out.put(&h)?;
        Ok((start, out.pos))
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
        let (header, _) = self.local_header(&format!("{path}/"), meta.mtime_sec, 0, 0, 1)?;
        let id = self.nodes.len();
        self.nodes.push(Node {
            parent: Some(parent),
            name: name.as_bytes().to_vec(),
            record: record_for(meta, true),
        });
        self.headers.push(header);
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
        let path = self.member_path(parent, name)?;
        let size = data.len() as u64;
        let (header, data_off) =
            self.local_header(&path, meta.mtime_sec, size, crc32, self.align)?;
        self.out()?.put(data)?;
        Ok(self.push_file(parent, name, meta, header, data_off, size, crc32, jpeg))
    }

    /// Adds file `name` under directory node `parent`, copying exactly `size` bytes from
    /// `data` in 1 MiB chunks (so a file of any size costs 1 MiB of memory), computing its
    /// CRC-32 and JPEG header probe (on the first chunk) on the way; the CRC-32 is written into
    /// the local header afterwards. Returns the node number.
    /// Errors: I/O errors; `data` ends before `size` bytes or has more (the file changed).
    pub fn add_file_from(
        &mut self,
        parent: usize,
        name: &str,
        meta: EntryMeta,
        size: u64,
        data: &mut dyn std::io::Read,
    ) -> Result<usize, FormatError> {
        let path = self.member_path(parent, name)?;
        let (header, data_off) = self.local_header(&path, meta.mtime_sec, size, 0, self.align)?;
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
            self.out()?.put(&buf[..n])?;
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
        let crc = crc.finalize();
        self.out()?.patch(header + 14, &crc.to_le_bytes())?;
        Ok(self.push_file(parent, name, meta, header, data_off, size, crc, jpeg))
    }

    /// Records a file node whose data was written at `data_off`; returns its number.
    #[allow(clippy::too_many_arguments)]
    fn push_file(
        &mut self,
        parent: usize,
        name: &str,
        meta: EntryMeta,
        header: u64,
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
        self.headers.push(header);
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

    /// The central directory record of `m` (APPNOTE 4.3.12), ZIP64 fields where needed.
    fn central_record(m: &Member) -> Vec<u8> {
        let name = m.path.as_bytes();
        let mut extra = Vec::new();
        let (big_size, big_off) = (m.size >= ZIP32_MAX, m.header >= ZIP32_MAX);
        if big_size || big_off {
            let n = 16 * u16::from(big_size) + 8 * u16::from(big_off);
            extra.u16(ZIP64_FIELD).u16(n);
            if big_size {
                extra.u64(m.size).u64(m.size);
            }
            if big_off {
                extra.u64(m.header);
            }
        }
        let version = if big_size || big_off { 45 } else { 20 };
        let (time, date) = dos_time(m.mtime_sec);
        let kind = if m.is_dir {
            libc::S_IFDIR
        } else {
            libc::S_IFREG
        };
        let attrs = ((kind | (m.mode & 0o7777)) << 16) | if m.is_dir { 0x10 } else { 0 };
        let mut r = Vec::with_capacity(46 + name.len() + extra.len());
        r.u32(0x0201_4b50)
            .u16(0x0300 | version)
            .u16(version)
            .u16(UTF8_FLAG)
            .u16(0);
        r.u16(time)
            .u16(date)
            .u32(m.crc32)
            .u32(zip32(m.size))
            .u32(zip32(m.size));
        r.u16(name.len() as u16)
            .u16(extra.len() as u16)
            .u16(0)
            .u16(0)
            .u16(0);
        r.u32(attrs).u32(zip32(m.header));
        r.extend_from_slice(name);
        r.extend_from_slice(&extra);
        r
    }

    /// The central directory of every member added and `index` (the index member), written
    /// as it is generated. Returns (members, its start, its length).
    fn central_directory(&mut self, index: &Member) -> Result<(u64, u64, u64), FormatError> {
        let mut out = self.out.take().ok_or_else(finished)?;
        let start = out.pos;
        let mut n = 0u64;
        let mut path = String::new();
        for (id, node) in self.nodes.iter().enumerate().skip(1) {
            let r = &node.record;
            path.clear();
            let parent = node.parent.unwrap_or(ROOT);
            let base = self.dir_paths.get(&parent).map_or("", String::as_str);
            if !base.is_empty() {
                path.push_str(base);
                path.push('/');
            }
            path.push_str(&String::from_utf8_lossy(&node.name));
            if r.is_dir {
                path.push('/');
            }
            let m = Member {
                path: &path,
                is_dir: r.is_dir,
                mode: r.mode,
                mtime_sec: r.mtime_sec,
                crc32: r.crc32,
                size: r.size,
                header: self.headers[id],
            };
            out.put(&Self::central_record(&m))?;
            n += 1;
        }
        out.put(&Self::central_record(index))?;
        let len = out.pos - start;
        self.out = Some(out);
        Ok((n + 1, start, len))
    }

    /// Writes the index member, the central directory and the end records with the trailer as
    /// the archive comment; returns the output (flushed, not synced).
    pub fn finish(mut self) -> Result<W, FormatError> {
        let index = index::build(&self.nodes, self.align)?;
        let mtime = self.nodes[ROOT].record.mtime_sec;
        let crc = crc32fast::hash(&index);
        let size = index.len() as u64;
        let (header, index_offset) =
            self.local_header(INDEX_MEMBER, mtime, size, crc, self.align)?;
        self.out()?.put(&index)?;
        let index_member = Member {
            path: INDEX_MEMBER,
            is_dir: false,
            mode: 0o444,
            mtime_sec: mtime,
            crc32: crc,
            size,
            header,
        };
        let (n, cd_start, cd_len) = self.central_directory(&index_member)?;
        let trailer = Trailer {
            version: index::INDEX_VERSION,
            index_offset,
            index_len: size,
        }
        .encode();
        let out = self.out()?;
        let zip64 = n >= 0xFFFF || cd_start >= ZIP32_MAX || cd_len >= ZIP32_MAX;
        if zip64 {
            // ZIP64 end of central directory record and its locator (APPNOTE 4.3.14-15).
            let at = out.pos;
            let mut e = Vec::with_capacity(76);
            e.u32(0x0606_4b50)
                .u64(44)
                .u16(0x0300 | 45)
                .u16(45)
                .u32(0)
                .u32(0);
            e.u64(n).u64(n).u64(cd_len).u64(cd_start);
            e.u32(0x0706_4b50).u32(0).u64(at).u32(1);
            out.put(&e)?;
        }
        let n16 = u16::try_from(n)
            .ok()
            .filter(|&x| x < 0xFFFF)
            .unwrap_or(0xFFFF);
        let mut e = Vec::with_capacity(22 + trailer.len());
        e.u32(0x0605_4b50).u16(0).u16(0).u16(n16).u16(n16);
        e.u32(zip32(cd_len))
            .u32(zip32(cd_start))
            .u16(trailer.len() as u16);
        e.extend_from_slice(trailer.as_bytes());
        out.put(&e)?;
        let out = self.out.take().ok_or_else(finished)?;
        out.inner
            .into_inner()
            .map_err(|e| FormatError::Io(e.into_error()))
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

fn record_for(meta: EntryMeta, is_dir: bool) -> Record {
    Record {
        is_dir,
        mode: meta.mode,
        mtime_sec: meta.mtime_sec,
        mtime_nsec: meta.mtime_nsec,
        ..Record::default()
    }
}
