//! The loosefs index: a 128-byte header, then one 64-byte record per inode, then a blob of
//! names. All integers little-endian. Records are read in place from the memory-mapped pack,
//! so opening a pack does no per-entry work beyond one xxh3-64 pass over the bytes.
//!
//! Record `i` is inode `i + 1`; record 0 is the root directory. Records are numbered breadth
//! first, so the children of a directory are consecutive records, sorted by name bytes: a lookup
//! is a binary search and a readdir is a slice. See `docs/PACK-FORMAT.md` (index version 1).

use super::FormatError;

mod tree;
use xxhash_rust::xxh3::Xxh3;

/// Index format version written and read by this build.
pub const INDEX_VERSION: u32 = 1;
/// Magic bytes at the start of the index.
pub const MAGIC: &[u8; 8] = b"LOOSEIDX";
/// Size of the index header in bytes.
pub const HEADER_LEN: usize = 128;
/// Size of one record in bytes.
pub const RECORD_LEN: usize = 64;
const CHECKSUM_AT: usize = 120;

/// Flag in [`Record::components`]: the data are raw pixels (`width`×`height`×channels,
/// channels in the low bits), not a JPEG. Only indexes of foreign datasets use it.
pub const PIXELS: u8 = 0x80;

/// Flag in [`Record::components`]: [`Record::crc32`] is not known (a foreign dataset indexed
/// with `--verify lazy`, whose format stores no checksum): it is learned when the sample is
/// first read and checked on every later read. Only indexes of foreign datasets use it.
pub const UNCHECKED: u8 = 0x40;

/// Kind of an index record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
}

/// One file or directory as stored in the index (decoded form).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// Record number of the parent directory (the root is its own parent, 0).
    pub parent: u32,
    /// Directories: record number of the first child; files: 0.
    pub first_child: u32,
    /// Directories: number of children; files: 0.
    pub n_children: u32,
    /// Offset of the name in the names blob, bytes.
    pub name_off: u32,
    /// Length of the name in bytes (no terminator).
    pub name_len: u16,
    /// true for a directory.
    pub is_dir: bool,
    /// JPEG colour components (1 grey, 3 YCbCr/RGB, 4 CMYK/YCCK), 0 when not a JPEG;
    /// [`PIXELS`] | 3 for raw RGB pixels served behind a PPM header (foreign datasets' indexes).
    pub components: u8,
    /// Unix mode bits of the source (permission bits and file type bits).
    pub mode: u32,
    /// Files: byte offset of the data from the start of the pack; directories: 0.
    pub data_off: u64,
    /// Files: length in bytes; directories: 0.
    pub size: u64,
    /// Modification time of the source: seconds since the Unix epoch.
    pub mtime_sec: i64,
    /// Nanoseconds of the modification time.
    pub mtime_nsec: u32,
    /// CRC-32 (ISO-HDLC, as zip) of the file's data; 0 for directories and when
    /// [`UNCHECKED`] is set in `components`.
    pub crc32: u32,
    /// JPEG width in pixels from the SOF header, 0 when not a JPEG.
    pub width: u32,
    /// JPEG height in pixels from the SOF header, 0 when not a JPEG.
    pub height: u32,
}

impl Record {
    /// The CRC-32 the data must match, `None` when it is to be learned on first read
    /// ([`UNCHECKED`]).
    pub fn crc(&self) -> Option<u32> {
        (self.components & UNCHECKED == 0).then_some(self.crc32)
    }

    /// Whether the data are raw RGB pixels with known dimensions ([`PIXELS`] | 3).
    pub fn is_pixels(&self) -> bool {
        !self.is_dir
            && self.components & !UNCHECKED == PIXELS | 3
            && self.width > 0
            && self.height > 0
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.parent.to_le_bytes());
        out.extend_from_slice(&self.first_child.to_le_bytes());
        out.extend_from_slice(&self.n_children.to_le_bytes());
        out.extend_from_slice(&self.name_off.to_le_bytes());
        out.extend_from_slice(&self.name_len.to_le_bytes());
        out.push(if self.is_dir { 1 } else { 0 });
        out.push(self.components);
        out.extend_from_slice(&self.mode.to_le_bytes());
        out.extend_from_slice(&self.data_off.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.mtime_sec.to_le_bytes());
        out.extend_from_slice(&self.mtime_nsec.to_le_bytes());
        out.extend_from_slice(&self.crc32.to_le_bytes());
        out.extend_from_slice(&self.width.to_le_bytes());
        out.extend_from_slice(&self.height.to_le_bytes());
        debug_assert_eq!(out.len() - start, RECORD_LEN);
    }

    fn decode(b: &[u8]) -> Record {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Record {
            parent: u32_at(0),
            first_child: u32_at(4),
            n_children: u32_at(8),
            name_off: u32_at(12),
            name_len: u16::from_le_bytes([b[16], b[17]]),
            is_dir: b[18] != 0,
            components: b[19],
            mode: u32_at(20),
            data_off: u64_at(24),
            size: u64_at(32),
            mtime_sec: u64_at(40) as i64,
            mtime_nsec: u32_at(48),
            crc32: u32_at(52),
            width: u32_at(56),
            height: u32_at(60),
        }
    }

    /// Kind of this record.
    pub fn kind(&self) -> Kind {
        if self.is_dir { Kind::Dir } else { Kind::File }
    }
}

/// Totals kept in the index header (shown by `loosefs info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Totals {
    /// Number of records (directories + files, root included).
    pub records: u64,
    /// Number of regular files (samples).
    pub files: u64,
    /// Number of directories, root included.
    pub dirs: u64,
    /// Sum of file sizes in bytes.
    pub bytes: u64,
    /// Number of files whose JPEG header was read at pack time.
    pub jpegs: u64,
    /// End of the last file's data (max of `data_off + size`), in bytes from the pack start.
    pub data_end: u64,
    /// Alignment of member data in bytes.
    pub align: u32,
}

/// A node handed to [`build`]: a directory or file in depth-first (pack) order.
#[derive(Debug, Clone)]
pub struct Node {
    /// Index into the node list of the parent directory (`None` for the root, which must be the
    /// first node).
    pub parent: Option<usize>,
    /// File name bytes (empty for the root).
    pub name: Vec<u8>,
    /// The record for this node; `parent`, `first_child`, `n_children`, `name_*` are filled in
    /// by [`build`].
    pub record: Record,
}

/// Serialises `nodes` (root first, every parent before its children, siblings in name order)
/// into index bytes with header and checksum.
///
/// Errors: [`FormatError::Corrupt`] when the tree is malformed or a limit of the format is hit
/// (more than 2^32 records or names, a name over 65535 bytes).
pub fn build(nodes: &[Node], align: u32) -> Result<Vec<u8>, FormatError> {
    if nodes.is_empty() || nodes[0].parent.is_some() || !nodes[0].record.is_dir {
        return Err(FormatError::Corrupt(
            "the first node must be the root directory".into(),
        ));
    }
    if nodes.len() > u32::MAX as usize {
        return Err(FormatError::Corrupt("more than 2^32 entries".into()));
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate().skip(1) {
        let p = n
            .parent
            .filter(|&p| p < i && nodes[p].record.is_dir)
            .ok_or_else(|| {
                FormatError::Corrupt(format!("node {i} has no valid parent directory"))
            })?;
        children[p].push(i);
    }
    for c in &mut children {
        c.sort_by(|&a, &b| nodes[a].name.cmp(&nodes[b].name));
        if c.windows(2).any(|w| nodes[w[0]].name == nodes[w[1]].name) {
            return Err(FormatError::Corrupt(
                "duplicate name in one directory".into(),
            ));
        }
    }
    // Breadth-first numbering: order[k] = node index of record k.
    let mut order = Vec::with_capacity(nodes.len());
    let mut rec_of = vec![0u32; nodes.len()];
    order.push(0usize);
    let mut k = 0;
    while k < order.len() {
        let n = order[k];
        for &c in &children[n] {
            rec_of[c] = order.len() as u32;
            order.push(c);
        }
        k += 1;
    }
    let mut names = Vec::new();
    let mut recs = Vec::with_capacity(nodes.len() * RECORD_LEN);
    let mut t = Totals {
        records: nodes.len() as u64,
        align,
        ..Totals::default()
    };
    for &n in &order {
        let node = &nodes[n];
        let mut r = node.record.clone();
        r.parent = node.parent.map_or(0, |p| rec_of[p]);
        r.n_children = children[n].len() as u32;
        r.first_child = children[n].first().map_or(0, |&c| rec_of[c]);
        r.name_len = u16::try_from(node.name.len())
            .map_err(|_| FormatError::Corrupt("name longer than 65535 bytes".into()))?;
        r.name_off = u32::try_from(names.len())
            .map_err(|_| FormatError::Corrupt("names blob over 4 GiB".into()))?;
        names.extend_from_slice(&node.name);
        if r.is_dir {
            t.dirs += 1;
        } else {
            t.files += 1;
            t.bytes += r.size;
            t.jpegs += u64::from(r.components & !UNCHECKED != 0);
            t.data_end = t.data_end.max(r.data_off + r.size);
        }
        r.encode(&mut recs);
    }
    let mut out = Vec::with_capacity(HEADER_LEN + recs.len() + names.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(&(RECORD_LEN as u32).to_le_bytes());
    out.extend_from_slice(&align.to_le_bytes());
    for v in [t.records, t.files, t.dirs, t.bytes, t.jpegs, t.data_end] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&((HEADER_LEN + recs.len()) as u64).to_le_bytes()); // names offset
    out.extend_from_slice(&(names.len() as u64).to_le_bytes());
    out.resize(HEADER_LEN, 0);
    out.extend_from_slice(&recs);
    out.extend_from_slice(&names);
    let sum = checksum(&out);
    out[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// xxh3-64 of the index with the checksum field itself left out.
/// The index checksum: xxh3-64 of the whole index with the checksum field itself (bytes
/// 120..128 of the header) left out; the value the header stores at byte 120.
pub fn checksum(index: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(&index[..CHECKSUM_AT]);
    h.update(&index[HEADER_LEN..]);
    h.digest()
}

/// A validated, borrowed view of index bytes. Cheap to copy around; decoding a record is a few
/// loads.
#[derive(Debug, Clone, Copy)]
pub struct IndexView<'a> {
    bytes: &'a [u8],
    names: &'a [u8],
    totals: Totals,
}

impl<'a> IndexView<'a> {
    /// Checks magic, version, checksum and internal bounds of `bytes` (the whole index member).
    /// The work is one hash pass: no per-record parsing.
    ///
    /// Errors: [`FormatError::NotAPack`], [`FormatError::Version`], [`FormatError::Checksum`],
    /// [`FormatError::Corrupt`].
    pub fn parse(bytes: &'a [u8]) -> Result<IndexView<'a>, FormatError> {
        if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
            return Err(FormatError::NotAPack("index magic not found".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        let version = u32_at(8);
        if version != INDEX_VERSION {
            return Err(FormatError::Version {
                found: version,
                supported: INDEX_VERSION,
            });
        }
        let stored = u64_at(CHECKSUM_AT);
        let computed = checksum(bytes);
        if stored != computed {
            return Err(FormatError::Checksum { stored, computed });
        }
        if u32_at(12) as usize != HEADER_LEN || u32_at(16) as usize != RECORD_LEN {
            return Err(FormatError::Corrupt(
                "unexpected header or record length".into(),
            ));
        }
        let totals = Totals {
            align: u32_at(20),
            records: u64_at(24),
            files: u64_at(32),
            dirs: u64_at(40),
            bytes: u64_at(48),
            jpegs: u64_at(56),
            data_end: u64_at(64),
        };
        let names_off = u64_at(72);
        let names_len = u64_at(80);
        let recs_end =
            (HEADER_LEN as u64).checked_add(totals.records.saturating_mul(RECORD_LEN as u64));
        if totals.records == 0
            || totals.records > u64::from(u32::MAX)
            || recs_end != Some(names_off)
            || names_off.checked_add(names_len) != Some(bytes.len() as u64)
            || totals.files.checked_add(totals.dirs) != Some(totals.records)
        {
            return Err(FormatError::Corrupt(
                "record or name table out of bounds".into(),
            ));
        }
        let names = &bytes[names_off as usize..];
        Ok(IndexView {
            bytes,
            names,
            totals,
        })
    }

    /// Rebuilds a view over bytes that [`IndexView::parse`] already accepted (the checksum is
    /// not recomputed). Returns `None` if the header no longer matches `totals`.
    pub(crate) fn from_validated(bytes: &'a [u8], totals: Totals) -> Option<IndexView<'a>> {
        let names_off = HEADER_LEN + totals.records as usize * RECORD_LEN;
        let names = bytes.get(names_off..)?;
        Some(IndexView {
            bytes,
            names,
            totals,
        })
    }

    /// Totals from the header.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Number of records.
    pub fn len(&self) -> u32 {
        self.totals.records as u32
    }

    /// Always false for a valid index (the root exists).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Decodes record `i`, or `None` when out of range.
    pub fn record(&self, i: u32) -> Option<Record> {
        if i >= self.len() {
            return None;
        }
        let o = HEADER_LEN + i as usize * RECORD_LEN;
        Some(Record::decode(&self.bytes[o..o + RECORD_LEN]))
    }

    /// Name bytes of a record; empty when its name range is out of bounds (corruption the
    /// checksum cannot catch, e.g. a buggy writer).
    pub fn name(&self, r: &Record) -> &'a [u8] {
        let s = r.name_off as usize;
        self.names.get(s..s + r.name_len as usize).unwrap_or(&[])
    }

    /// Record numbers of the children of directory record `r` (sorted by name), clamped to the
    /// record table.
    pub fn children(&self, r: &Record) -> std::ops::Range<u32> {
        if !r.is_dir {
            return 0..0;
        }
        let start = r.first_child.min(self.len());
        let end = r.first_child.saturating_add(r.n_children).min(self.len());
        start..end
    }

    /// Finds the child of directory `r` named `name` by binary search. O(log n).
    pub fn find_child(&self, r: &Record, name: &[u8]) -> Option<u32> {
        let range = self.children(r);
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let m = self.record(mid)?;
            match self.name(&m).cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The first child of directory `r` whose name is ≥ `name` (the end of its children when
    /// none is): where names starting with a prefix begin. O(log n).
    pub fn lower_bound(&self, r: &Record, name: &[u8]) -> u32 {
        let range = self.children(r);
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.record(mid) {
                Some(m) if self.name(&m) < name => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(parent: Option<usize>, name: &str) -> Node {
        Node {
            parent,
            name: name.as_bytes().to_vec(),
            record: Record {
                is_dir: true,
                mode: 0o40755,
                ..Record::default()
            },
        }
    }
    fn file(parent: usize, name: &str, off: u64, size: u64) -> Node {
        Node {
            parent: Some(parent),
            name: name.as_bytes().to_vec(),
            record: Record {
                mode: 0o100644,
                data_off: off,
                size,
                crc32: 7,
                ..Record::default()
            },
        }
    }

    fn sample_tree() -> Vec<Node> {
        // DFS order: /, a/, a/x, a/y, b/, b/z, c
        vec![
            dir(None, ""),
            dir(Some(0), "a"),
            file(1, "x", 4096, 10),
            file(1, "y", 8192, 20),
            dir(Some(0), "b"),
            file(4, "z", 12288, 30),
            file(0, "c", 16384, 40),
        ]
    }

    /// The sample tree's index with record `rec`'s u32 at byte `field` set to `v`, re-checksummed
    /// (as a forger would), then parsed and validated. Records (breadth first): 0 /, 1 a/,
    /// 2 b/, 3 c, 4 a/x, 5 a/y, 6 b/z. Fields: 0 parent, 4 first child, 8 children.
    fn forged(edits: &[(u32, usize, u32)]) -> Result<(), FormatError> {
        let mut bytes = build(&sample_tree(), 4096).unwrap();
        for &(rec, field, v) in edits {
            let o = HEADER_LEN + rec as usize * RECORD_LEN + field;
            bytes[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
        let c = checksum(&bytes);
        bytes[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&c.to_le_bytes());
        IndexView::parse(&bytes)?.validate_tree()
    }

    #[test]
    fn header_counts_that_overflow_are_refused() {
        // Found by the index fuzz target: files + dirs overflowed (a panic with overflow
        // checks; in release it wrapped to the record count and passed).
        let mut bytes = build(&sample_tree(), 4096).unwrap();
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes()); // files
        bytes[40..48].copy_from_slice(&8u64.to_le_bytes()); // dirs: u64::MAX + 8 wraps to 7
        let c = checksum(&bytes);
        bytes[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&c.to_le_bytes());
        assert!(matches!(
            IndexView::parse(&bytes),
            Err(FormatError::Corrupt(_))
        ));
    }

    #[test]
    fn forged_trees_are_refused_with_the_reason() {
        assert!(forged(&[]).is_ok());
        let why = |edits: &[(u32, usize, u32)]| match forged(edits) {
            Err(FormatError::Corrupt(m)) => m,
            other => panic!("{edits:?} accepted: {other:?}"),
        };
        // A directory that lists itself as a child, and a self-parented file.
        assert!(why(&[(1, 4, 1), (1, 8, 1)]).contains("record 1"));
        assert!(why(&[(4, 0, 4)]).contains("names 4 as its parent"));
        // A cycle: a/ lists b/ as its child, b/ lists a/.
        let m = why(&[(1, 4, 2), (1, 8, 1), (2, 4, 1), (2, 8, 1)]);
        assert!(m.contains("record"), "{m}");
        // A file with children, a root that is not its own parent, children past the table.
        assert!(why(&[(3, 8, 1)]).contains("file with children"));
        assert!(why(&[(0, 0, 1)]).contains("root"));
        assert!(why(&[(2, 8, 9)]).contains("past the record table"));
        // Data outside the sample data.
        let o = 24; // data_off (u64): set its low word far out
        assert!(why(&[(6, o, u32::MAX)]).contains("outside the sample data"));
        // Duplicate names: a/y renamed to a/x (same name bytes offset and length).
        let ix_bytes = build(&sample_tree(), 4096).unwrap();
        let ix = IndexView::parse(&ix_bytes).unwrap();
        let x = ix.record(4).unwrap();
        assert!(why(&[(5, 12, x.name_off)]).contains("duplicate or unsorted"));
    }

    #[test]
    fn round_trip_and_lookup() {
        let bytes = build(&sample_tree(), 4096).unwrap();
        let ix = IndexView::parse(&bytes).unwrap();
        let t = ix.totals();
        assert_eq!(
            (t.records, t.files, t.dirs, t.bytes, t.data_end),
            (7, 4, 3, 100, 16424)
        );
        let root = ix.record(0).unwrap();
        let names: Vec<_> = ix
            .children(&root)
            .map(|i| ix.name(&ix.record(i).unwrap()).to_vec())
            .collect();
        assert_eq!(names, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        let a = ix.find_child(&root, b"a").unwrap();
        let ra = ix.record(a).unwrap();
        assert!(ra.is_dir);
        let y = ix.record(ix.find_child(&ra, b"y").unwrap()).unwrap();
        assert_eq!((y.data_off, y.size, y.parent), (8192, 20, a));
        assert!(ix.find_child(&ra, b"z").is_none());
        assert!(ix.find_child(&root, b"").is_none());
        assert!(ix.record(7).is_none());
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let bytes = build(&sample_tree(), 4096).unwrap();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(
                IndexView::parse(&b).is_err(),
                "flip at byte {i} not detected"
            );
        }
        assert!(matches!(
            IndexView::parse(&bytes[..bytes.len() - 1]),
            Err(FormatError::Checksum { .. })
        ));
        assert!(IndexView::parse(&bytes[..10]).is_err());
    }

    #[test]
    fn future_version_is_refused_by_name() {
        let mut b = build(&sample_tree(), 4096).unwrap();
        b[8] = 2;
        let sum = checksum(&b);
        b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
        assert!(matches!(
            IndexView::parse(&b),
            Err(FormatError::Version { found: 2, .. })
        ));
    }

    #[test]
    fn malformed_trees_are_refused() {
        let mut t = sample_tree();
        t.push(file(0, "c", 0, 1));
        assert!(build(&t, 1).is_err(), "duplicate name");
        let t = vec![dir(None, ""), file(2, "x", 0, 1)];
        assert!(build(&t, 1).is_err(), "forward parent");
        assert!(build(&[], 1).is_err());
    }
}
