//! The filesystem logic behind the mount, free of FUSE types so unit tests drive it directly:
//! inode numbers, lookups, attributes, directory listings and checked reads over a [`Pack`].
//!
//! Inode `n` is index record `n - 1` (the root, record 0, is inode 1 as FUSE expects), so
//! inodes are stable for the life of the pack and `forget` needs no bookkeeping. A sample's
//! bytes are checked against their CRC-32 the first time they are served; a sample that fails
//! answers [`FsError::Corrupt`] (EIO) every time and is never served. Data is read with `pread`
//! into the caller's buffer rather than copied out of a mapping, so serving a pack does not
//! grow the daemon's resident set.
//!
//! Decoded views (`--decode`, see [`crate::decode`]) live here too: the `.npy` view of the JPEG
//! with inode `n` is inode `n | NPY_BIT`, listed after it under the JPEG's stem + `.npy` (a real
//! file of that name wins; of two JPEGs with one stem the first by name gets it); the PPM view
//! takes over the JPEG's own inode. Sizes come from the dimensions in the index.

use crate::decode::codec::{pick_denom, scaled_dims};
use crate::decode::view::{self, ViewKind, Views};
use crate::format::index::{Kind, Record};
use crate::format::reader::Pack;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;
/// `st_blksize` reported for every file, in bytes. Python's `BufferedReader` sizes its buffer
/// from it, so a large value lets `open(...).read()` and PIL fetch a sample in one request.
pub const BLKSIZE: u32 = 128 * 1024;

/// Samples up to this size are checked and served with one read; larger ones are checked in
/// chunks of this size, bytes.
pub const CHECK_CHUNK: usize = 16 << 20;

/// Bit set in the inode of a `.npy` view (below the control directory's bit 62).
pub const NPY_BIT: u64 = 1 << 61;

/// A decoded view of a JPEG sample, as [`Namespace::view`] resolves an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewTarget {
    /// Inode of the view.
    pub ino: u64,
    /// Inode of the JPEG sample (record + 1).
    pub jpeg_ino: u64,
    pub kind: ViewKind,
    /// Decoded size in pixels (after scaling).
    pub width: u32,
    pub height: u32,
    /// Scale denominator (1, 2, 4, 8).
    pub denom: u32,
    /// Size of the JPEG in bytes.
    pub jpeg_size: u64,
}

/// Why a request failed; the FUSE adaptor maps each to an errno.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// No such inode or name (ENOENT).
    #[error("no such file or directory")]
    NotFound,
    /// A directory operation on a file (ENOTDIR).
    #[error("not a directory")]
    NotDir,
    /// A file operation on a directory (EISDIR).
    #[error("is a directory")]
    IsDir,
    /// Stored data failed its check or lies outside the pack (EIO). The string says why.
    #[error("corrupt sample: {0}")]
    Corrupt(String),
}

/// Attributes of an inode, in the units `stat(2)` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    /// Size in bytes (directories: 4096).
    pub size: u64,
    /// Allocated 512-byte blocks, counted in whole 4 KiB pages as ext4 does.
    pub blocks: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub kind: Kind,
    /// Permission bits (the source's, minus every write bit).
    pub perm: u16,
    /// Link count: 1 for files; 1 for directories too, the "subdirectory count unknown" value
    /// (as btrfs reports), since counting subdirectories would cost O(children).
    pub nlink: u32,
    pub blksize: u32,
}

/// One directory entry as `readdir` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry<'a> {
    pub ino: u64,
    /// Offset to pass to continue after this entry.
    pub next_offset: u64,
    pub kind: Kind,
    pub name: Cow<'a, [u8]>,
}

/// Figures for `statfs(2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Pack size in 4 KiB blocks.
    pub blocks: u64,
    /// Number of inodes (files and directories).
    pub files: u64,
    pub bsize: u32,
    pub namelen: u32,
}

/// The namespace of one pack.
#[derive(Debug)]
pub struct Namespace {
    pack: Pack,
    /// One bit per record: set once the sample's CRC-32 has matched.
    verified: Vec<AtomicU64>,
    views: Views,
}

impl Namespace {
    /// Wraps an opened pack. Allocates one bit per record (zeroed lazily by the allocator).
    pub fn new(pack: Pack) -> Namespace {
        Namespace::with_views(pack, Views::default())
    }

    /// As [`Namespace::new`], also serving the decoded `views` of every JPEG sample (a file
    /// whose JPEG dimensions are in the index).
    pub fn with_views(pack: Pack, views: Views) -> Namespace {
        let words = (pack.totals().records as usize).div_ceil(64);
        let verified = std::iter::repeat_with(|| AtomicU64::new(0))
            .take(words)
            .collect();
        Namespace {
            pack,
            verified,
            views,
        }
    }

    /// The decoded views served.
    pub fn views(&self) -> Views {
        self.views
    }

    fn decodable(r: &Record) -> bool {
        !r.is_dir && r.width > 0 && r.height > 0
    }

    fn target(&self, ino: u64, jpeg_ino: u64, kind: ViewKind, r: &Record) -> ViewTarget {
        let denom = pick_denom(r.width, r.height, self.views.max_side);
        let (width, height) = scaled_dims(r.width, r.height, denom);
        ViewTarget {
            ino,
            jpeg_ino,
            kind,
            width,
            height,
            denom,
            jpeg_size: r.size,
        }
    }

    /// The decoded view served at inode `ino`, `None` when `ino` serves stored bytes.
    pub fn view(&self, ino: u64) -> Option<ViewTarget> {
        if ino & NPY_BIT != 0 {
            let base = ino & !NPY_BIT;
            let r = self.record(base).ok()?;
            (self.views.npy && Self::decodable(&r))
                .then(|| self.target(ino, base, ViewKind::Npy, &r))
        } else if self.views.ppm {
            let r = self.record(ino).ok()?;
            Self::decodable(&r).then(|| self.target(ino, ino, ViewKind::Ppm, &r))
        } else {
            None
        }
    }

    /// The child of directory `p` whose `.npy` view is named `stem` + `.npy`: the first JPEG
    /// sample (by name) with that stem.
    fn npy_owner(&self, p: &Record, stem: &[u8]) -> Option<u32> {
        let ix = self.pack.index();
        let end = ix.children(p).end;
        let mut i = ix.lower_bound(p, stem);
        while i < end {
            let c = ix.record(i)?;
            let name = ix.name(&c);
            if !name.starts_with(stem) {
                return None;
            }
            if view::stem(name) == stem && Self::decodable(&c) {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// Name of the `.npy` view listed beside child record `i` (named `name`) of `p`, if any.
    fn npy_sibling(&self, p: &Record, i: u32, c: &Record, name: &[u8]) -> Option<Vec<u8>> {
        if !self.views.npy || !Self::decodable(c) {
            return None;
        }
        let n = view::npy_name(name);
        let ix = self.pack.index();
        (self.npy_owner(p, view::stem(name)) == Some(i) && ix.find_child(p, &n).is_none())
            .then_some(n)
    }

    /// The underlying pack.
    pub fn pack(&self) -> &Pack {
        &self.pack
    }

    fn record(&self, ino: u64) -> Result<Record, FsError> {
        let i = ino
            .checked_sub(1)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or(FsError::NotFound)?;
        self.pack.index().record(i).ok_or(FsError::NotFound)
    }

    fn attr_of(&self, ino: u64, r: &Record) -> Attr {
        let size = match self.view(ino) {
            _ if r.is_dir => 4096,
            Some(t) => view::size(t.kind, t.width, t.height),
            None => r.size,
        };
        Attr {
            ino,
            size,
            blocks: size.div_ceil(4096) * 8,
            mtime_sec: r.mtime_sec,
            mtime_nsec: r.mtime_nsec.min(999_999_999),
            kind: r.kind(),
            perm: (r.mode & 0o7555) as u16,
            nlink: 1,
            blksize: BLKSIZE,
        }
    }

    /// Attributes of inode `ino`. Errors: [`FsError::NotFound`].
    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        if ino & NPY_BIT != 0 {
            let r = self.view(ino).ok_or(FsError::NotFound)?;
            return Ok(self.attr_of(ino, &self.record(r.jpeg_ino)?));
        }
        Ok(self.attr_of(ino, &self.record(ino)?))
    }

    /// Looks up `name` in directory `parent`. O(log children).
    /// Errors: [`FsError::NotFound`], [`FsError::NotDir`].
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let p = self.record(parent)?;
        if !p.is_dir {
            return Err(FsError::NotDir);
        }
        let ix = self.pack.index();
        match name {
            b"." => return Ok(self.attr_of(parent, &p)),
            b".." => return self.getattr(u64::from(p.parent) + 1),
            _ => {}
        }
        if let Some(i) = ix.find_child(&p, name) {
            let r = ix.record(i).ok_or(FsError::NotFound)?;
            if self.views.hides_jpeg() && Self::decodable(&r) {
                return Err(FsError::NotFound);
            }
            return Ok(self.attr_of(u64::from(i) + 1, &r));
        }
        if self.views.npy {
            if let Some(stem) = name.strip_suffix(b".npy") {
                if let Some(i) = self.npy_owner(&p, stem) {
                    return self.getattr((u64::from(i) + 1) | NPY_BIT);
                }
            }
        }
        Err(FsError::NotFound)
    }

    /// Entries of directory `ino` starting at `offset` (0 = from the start): `.`, `..`, then the
    /// children in name order, each JPEG followed by its `.npy` view when served (child `k` is
    /// at position `2 + 2k`, its view at `3 + 2k`). Errors: [`FsError::NotFound`],
    /// [`FsError::NotDir`].
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
    ) -> Result<impl Iterator<Item = DirEntry<'_>>, FsError> {
        let r = self.record(ino)?;
        if !r.is_dir {
            return Err(FsError::NotDir);
        }
        let ix = self.pack.index();
        let dots = [(ino, &b"."[..]), (u64::from(r.parent) + 1, &b".."[..])]
            .into_iter()
            .enumerate()
            .map(|(k, (ino, name))| DirEntry {
                ino,
                next_offset: k as u64 + 1,
                kind: Kind::Dir,
                name: Cow::Borrowed(name),
            });
        let kids = ix.children(&r);
        let first = u32::try_from(offset.saturating_sub(2) / 2)
            .unwrap_or(u32::MAX)
            .min(kids.len() as u32);
        let children = (kids.start + first..kids.end).flat_map(move |i| {
            let pos = 2 + 2 * u64::from(i - kids.start);
            let Some(c) = ix.record(i) else {
                return [None, None];
            };
            let name = ix.name(&c);
            let own = (!(self.views.hides_jpeg() && Self::decodable(&c))).then(|| DirEntry {
                ino: u64::from(i) + 1,
                next_offset: pos + 1,
                kind: c.kind(),
                name: Cow::Borrowed(name),
            });
            let npy = self.npy_sibling(&r, i, &c, name).map(|n| DirEntry {
                ino: (u64::from(i) + 1) | NPY_BIT,
                next_offset: pos + 2,
                kind: Kind::File,
                name: Cow::Owned(n),
            });
            [own, npy]
        });
        Ok(dots
            .chain(children.flatten())
            .filter(move |e| e.next_offset > offset))
    }

    /// Up to `size` bytes of file `ino` from byte `offset` (empty at or past the end), read with
    /// `pread` into `buf` (reused across calls; it grows to at most the larger of the request
    /// and [`CHECK_CHUNK`]). The whole sample is checked against its CRC-32 the first time any
    /// part of it is read.
    /// Errors: [`FsError::NotFound`], [`FsError::IsDir`], [`FsError::Corrupt`] (failed check,
    /// data outside the pack, or an I/O error reading it).
    pub fn read<'b>(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        buf: &'b mut Vec<u8>,
    ) -> Result<&'b [u8], FsError> {
        let r = self.record(ino)?;
        if r.is_dir {
            return Err(FsError::IsDir);
        }
        if self.pack.data_range(&r).is_none() {
            return Err(FsError::Corrupt(format!(
                "data range {}+{} is outside the pack",
                r.data_off, r.size
            )));
        }
        let start = offset.min(r.size);
        let end = offset.saturating_add(u64::from(size)).min(r.size);
        let io = |e: std::io::Error| FsError::Corrupt(format!("cannot read the pack: {e}"));
        if !self.is_verified(ino) {
            if r.size <= CHECK_CHUNK as u64 {
                // Small sample (the usual case): one read serves the check and the request.
                buf.resize(r.size as usize, 0);
                self.pack.read_at(r.data_off, buf).map_err(io)?;
                self.check_crc(ino, &r, crc32fast::hash(buf))?;
                return Ok(&buf[start as usize..end as usize]);
            }
            let mut h = crc32fast::Hasher::new();
            let mut off = 0;
            while off < r.size {
                let n = (r.size - off).min(CHECK_CHUNK as u64) as usize;
                buf.resize(n, 0);
                self.pack.read_at(r.data_off + off, buf).map_err(io)?;
                h.update(buf);
                off += n as u64;
            }
            self.check_crc(ino, &r, h.finalize())?;
        }
        buf.resize((end - start) as usize, 0);
        self.pack.read_at(r.data_off + start, buf).map_err(io)?;
        Ok(&buf[..])
    }

    fn is_verified(&self, ino: u64) -> bool {
        let i = (ino - 1) as usize;
        self.verified[i / 64].load(Ordering::Relaxed) & (1u64 << (i % 64)) != 0
    }

    fn check_crc(&self, ino: u64, r: &Record, crc: u32) -> Result<(), FsError> {
        if crc != r.crc32 {
            return Err(FsError::Corrupt(format!(
                "CRC-32 {crc:08x} does not match the index ({:08x})",
                r.crc32
            )));
        }
        let i = (ino - 1) as usize;
        self.verified[i / 64].fetch_or(1u64 << (i % 64), Ordering::Relaxed);
        Ok(())
    }

    /// Byte range of file `ino`'s data inside the pack, `None` for directories, unknown inodes
    /// and ranges outside the sample data.
    pub fn data_range(&self, ino: u64) -> Option<std::ops::Range<u64>> {
        self.pack.data_range(&self.record(ino).ok()?)
    }

    /// The file after `ino` in pack order (depth first, names sorted: the order of the data in
    /// the pack), skipping directories; `None` after the last file. O(depth) amortised.
    pub fn next_file(&self, ino: u64) -> Option<u64> {
        let ix = self.pack.index();
        let mut cur = u32::try_from(ino.checked_sub(1)?).ok()?;
        let mut descend = false; // true: enter `cur` (a directory) instead of moving past it
        loop {
            let r = ix.record(cur)?;
            if descend {
                let kids = ix.children(&r);
                if kids.is_empty() {
                    descend = false; // empty directory: move past it
                    continue;
                }
                cur = kids.start;
            } else {
                if cur == 0 {
                    return None; // past the root: no more files
                }
                let parent = ix.record(r.parent)?;
                if cur + 1 < ix.children(&parent).end {
                    cur += 1;
                } else {
                    cur = r.parent;
                    continue;
                }
            }
            let r = ix.record(cur)?;
            if !r.is_dir {
                return Some(u64::from(cur) + 1);
            }
            descend = true;
        }
    }

    /// Inodes whose data has been served (checked) since the mount.
    pub fn served_inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.verified.iter().enumerate().flat_map(|(w, word)| {
            let bits = word.load(Ordering::Relaxed);
            (0..64)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| (w * 64 + b) as u64 + 1)
        })
    }

    /// Path of inode `ino` from the mount root (for log messages), e.g. `n01440764/x.JPEG`.
    pub fn path_of(&self, ino: u64) -> String {
        if ino & NPY_BIT != 0 {
            let jpeg = self.path_of(ino & !NPY_BIT);
            let (dir, name) = jpeg.rsplit_once('/').unwrap_or(("", &jpeg));
            let npy = String::from_utf8_lossy(&view::npy_name(name.as_bytes())).into_owned();
            return if dir.is_empty() {
                npy
            } else {
                format!("{dir}/{npy}")
            };
        }
        let ix = self.pack.index();
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO && parts.len() < 4096 {
            let Ok(r) = self.record(cur) else { break };
            parts.push(String::from_utf8_lossy(ix.name(&r)).into_owned());
            cur = u64::from(r.parent) + 1;
        }
        parts.reverse();
        parts.join("/")
    }

    /// Figures for `statfs`.
    pub fn statfs(&self) -> FsStats {
        FsStats {
            blocks: self.pack.file_len().div_ceil(4096),
            files: self.pack.totals().records,
            bsize: 4096,
            namelen: 255,
        }
    }
}
