//! Catalogs: what files a mount shows and where each file's bytes come from.
//!
//! A [`Catalog`] answers the namespace questions (lookup, attributes, listings, storage order)
//! and, for every file, gives an [`Extent`]: the storage object holding its bytes, the byte
//! range inside it, the checksum those bytes must match, and the [`Transform`] that turns them
//! into the file's content. The read path never asks what kind of catalog it serves: the native
//! pack index ([`native`]) is one implementation; catalogs over other packed formats or remote
//! objects give extents in the same terms.

pub mod native;

use crate::view::{ViewGeom, Views};
use std::borrow::Cow;
use std::ops::Range;
use std::path::PathBuf;

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
    /// The bytes could not be read (EIO): a disk error, a network outage past the retries, a
    /// remote object replaced since the mount. The string says which, with its source.
    #[error("I/O error: {0}")]
    Io(String),
    /// The stored bytes' remote object was replaced or removed since it was pinned (ESTALE, as
    /// mountpoint-s3 answers "object was mutated remotely"): its uncached bytes are gone for
    /// good, unlike an outage's. The string names the object and the ETag it was pinned to.
    #[error("stale: {0}")]
    Stale(String),
    /// The daemon could not answer for a reason of its own (EIO): a worker pool that is not
    /// running, a report that cannot be written. The string says why.
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller may not do this (EACCES): a control command from a user other than the
    /// mount's owner or root.
    #[error("permission denied")]
    Denied,
    /// A change to the mount's files or directories (EROFS): only `.loosefs/order` takes
    /// writes.
    #[error("read-only file system")]
    ReadOnly,
    /// A request the daemon cannot make sense of (EINVAL): a write to `.loosefs/order` away from
    /// its end, a line longer than a path may be. The string says which.
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// File or directory.
pub use crate::pack::index::Kind;

/// Attributes of an inode, in the units `stat(2)` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes (directories: 4096).
    pub size: u64,
    /// Allocated 512-byte blocks, counted in whole 4 KiB pages as ext4 does.
    pub blocks: u64,
    /// Modification time, seconds since the epoch.
    pub mtime_sec: i64,
    /// Nanoseconds of the modification time (< 10^9).
    pub mtime_nsec: u32,
    /// File or directory.
    pub kind: Kind,
    /// Permission bits (the source's, minus every write bit).
    pub perm: u16,
    /// Link count: 1 for files; 1 for directories too, the "subdirectory count unknown" value
    /// (as btrfs reports), since counting subdirectories would cost O(children).
    pub nlink: u32,
    /// Preferred I/O size in bytes (`st_blksize`).
    pub blksize: u32,
}

impl Attr {
    /// The attributes the mount shows for inode `ino` of `kind`: `size` bytes (directories
    /// 4096), blocks counted in whole 4 KiB pages, the modification time `mtime_sec` +
    /// `mtime_nsec` (clamped below 10^9), the permission bits of `mode` minus every write
    /// bit, one link, `st_blksize` [`native::BLKSIZE`].
    pub fn shown(
        ino: u64,
        kind: Kind,
        size: u64,
        mtime_sec: i64,
        mtime_nsec: u32,
        mode: u32,
    ) -> Attr {
        let size = if kind == Kind::Dir { 4096 } else { size };
        Attr {
            ino,
            size,
            blocks: size.div_ceil(4096) * 8,
            mtime_sec,
            mtime_nsec: mtime_nsec.min(999_999_999),
            kind,
            perm: (mode & 0o7555) as u16,
            nlink: 1,
            blksize: native::BLKSIZE,
        }
    }
}

/// One directory entry as a listing returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Inode of the entry.
    pub ino: u64,
    /// Offset to pass to continue after this entry.
    pub next_offset: u64,
    /// File or directory.
    pub kind: Kind,
    /// Name within the directory.
    pub name: Cow<'a, [u8]>,
}

/// Figures for `statfs(2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Total size in `bsize` blocks.
    pub blocks: u64,
    /// Number of inodes (files and directories).
    pub files: u64,
    /// Block size, bytes.
    pub bsize: u32,
    /// Longest name, bytes.
    pub namelen: u32,
}

/// Index of a storage object among a catalog's [`Catalog::objects`] (defined by the storage
/// layer, which reads objects by it).
pub use crate::storage::ObjectId;

/// A storage object a catalog's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Where it is (a local path today).
    pub path: PathBuf,
    /// Its size, bytes.
    pub len: u64,
    /// End of the sample data inside it (read-ahead and warm stop here), bytes.
    pub data_end: u64,
    /// Every sample's stored bytes start at a multiple of this, bytes (a pack's `--align`;
    /// 1 where the format promises nothing), so the bytes from a sample's end up to the next
    /// multiple hold no other sample's bytes (the pack's padding and zip headers).
    pub align: u64,
}

/// How a file's content is made from its stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// The stored bytes are the content.
    Identity,
    /// The stored bytes are a JPEG; the content is this decoded view of it.
    Decode(ViewGeom),
    /// The stored bytes are raw RGB pixels (row-major, `width`×`height`×3); the content is the
    /// view's header (PPM or `.npy`) followed by them, unchanged (`geom.denom` is 1).
    Pixels(ViewGeom),
    /// Nothing is stored: the content is made file `id` of the mount's frame server (a video
    /// frame's view, a column's `.npy`: [`crate::video`]).
    Made(u32),
}

/// Where the bytes of one file come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    /// The catalog record the bytes belong to (a view's JPEG record).
    pub record: u32,
    /// The storage object holding them.
    pub object: ObjectId,
    /// Byte range of the stored bytes inside the object.
    pub range: Range<u64>,
    /// CRC-32 (IEEE, as zip) the stored bytes must match before any of them is served;
    /// `None` when the index does not know it (a foreign dataset indexed with `--verify
    /// lazy`): the CRC-32 of the first read is recorded and every later read must match it.
    pub crc32: Option<u32>,
    /// What turns the stored bytes into the file's content.
    pub transform: Transform,
}

impl Extent {
    /// Length of the stored bytes.
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// True when no bytes are stored (an empty file).
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

/// What files exist and where their bytes come from. Implementations are immutable once built
/// and shared by every FUSE thread.
pub trait Catalog: Send + Sync {
    /// Attributes of `ino`. Errors: [`FsError::NotFound`].
    fn getattr(&self, ino: u64) -> Result<Attr, FsError>;

    /// Looks up `name` in directory `parent` (`.` and `..` included).
    /// Errors: [`FsError::NotFound`], [`FsError::NotDir`].
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError>;

    /// Lists directory `ino` from `offset` (0 = from the start; `.` and `..` first), calling
    /// `add` per entry until it returns true (full). Errors: [`FsError::NotFound`],
    /// [`FsError::NotDir`].
    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), FsError>;

    /// Where the bytes of file `ino` come from. Errors: [`FsError::NotFound`],
    /// [`FsError::IsDir`], [`FsError::Corrupt`] (the recorded range lies outside the data).
    fn extent(&self, ino: u64) -> Result<Extent, FsError>;

    /// The file after `ino` in storage order (the order its bytes lie in the objects), `None`
    /// after the last one. Read-ahead and push-ahead walk it.
    fn next_file(&self, ino: u64) -> Option<u64>;

    /// Path of `ino` from the mount root, for log messages (e.g. `n01440764/x.JPEG`).
    fn path_of(&self, ino: u64) -> String;

    /// Figures for `statfs`.
    fn statfs(&self) -> FsStats;

    /// Number of records: record numbers are `0..records()` (per-record bitsets are this long).
    fn records(&self) -> u64;

    /// Number of files (samples).
    fn files(&self) -> u64;

    /// The storage objects extents refer to, by [`ObjectId`].
    fn objects(&self) -> &[ObjectInfo];

    /// The decoded views this catalog shows.
    fn views(&self) -> Views;

    /// Whether each extent's CRC-32 is checked before its bytes are served (false for a
    /// loose directory's files, which are their own originals).
    fn checks(&self) -> bool {
        true
    }

    /// The catalog's storage was opened for writing (the mount's read lease broke). A catalog
    /// that can tell a real change returns true and, from then on, stops reading storage that
    /// may be truncated under it and checks before each request that the storage is unchanged:
    /// once it changed, every request answers [`FsError::Corrupt`] and the log says why, once.
    /// Returns false where it cannot tell (the caller then gives up the lease all the same).
    fn opened_for_writing(&self) -> bool {
        false
    }
}

/// What the inode numbers of `c` name, in 32 bits: CRC-32 over every record's inode, kind,
/// size, modification time and path, and every file's stored range and checksum. A daemon
/// that takes over a connection serves the inodes the kernel got from the one before; it may
/// do so only when this is equal (a directory changed since the mount, a remote object
/// replaced: the numbers would name other files, or mix two versions' bytes).
pub fn fingerprint(c: &dyn Catalog) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for ino in 1..=c.records() {
        let Ok(a) = c.getattr(ino) else {
            h.update(&ino.to_le_bytes());
            continue;
        };
        h.update(&a.ino.to_le_bytes());
        h.update(&[a.kind as u8]);
        h.update(&a.size.to_le_bytes());
        h.update(&a.mtime_sec.to_le_bytes());
        h.update(&a.mtime_nsec.to_le_bytes());
        h.update(c.path_of(ino).as_bytes());
        h.update(&[0]);
        if let Ok(e) = c.extent(ino) {
            h.update(&e.range.start.to_le_bytes());
            h.update(&e.range.end.to_le_bytes());
            h.update(&e.crc32.unwrap_or(0).to_le_bytes());
        }
    }
    h.finalize()
}
