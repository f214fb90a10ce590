//! Writes a pack: a ZIP64 archive with every member STORED and its data aligned, members in
//! the order they are added (the caller adds them in pack order), then the index member, the
//! central directory and the trailer comment (`docs/PACK-FORMAT.md`, PKWARE APPNOTE 6.3.10 §4.3).
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
use std::io::{BufWriter, Seek, Write};

mod records;
use records::{Member, Out};

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
        let start = self.out()?.pos;
        let h = records::local_header(path, mtime_sec, size, crc32, start, align)?;
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
            let n = crate::storage::read_full(data, &mut buf)?;
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
}

/// The end of a pack: the index member, the central directory, the end records.
impl<W: Write + Seek> PackWriter<W> {
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
            out.put(&records::central_record(&m))?;
            n += 1;
        }
        out.put(&records::central_record(index))?;
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
        let at = out.pos;
        out.put(&records::end_records(n, cd_start, cd_len, at, &trailer))?;
        let out = self.out.take().ok_or_else(finished)?;
        out.inner
            .into_inner()
            .map_err(|e| FormatError::Io(e.into_error()))
    }
}

fn finished() -> FormatError {
    FormatError::Io(std::io::Error::other(
        "the pack writer was already finished",
    ))
}

/// The record of a directory or file with `meta`'s mode and mtime; the tree fields, offset,
/// size, CRC and JPEG fields left for the caller.
pub(crate) fn record_for(meta: EntryMeta, is_dir: bool) -> Record {
    Record {
        is_dir,
        mode: meta.mode,
        mtime_sec: meta.mtime_sec,
        mtime_nsec: meta.mtime_nsec,
        ..Record::default()
    }
}
