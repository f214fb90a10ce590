//! Many local files as one storage object: the files of a loose dataset directory, served in
//! place. File `k` holds bytes `bases[k] .. bases[k] + len` of object 0, every base a multiple
//! of the page size, so each page of the object belongs to one file (or to the padding after
//! one) and the page-cache verbs map page for page onto the files: `posix_fadvise` WILLNEED and
//! DONTNEED per file, residency by `mincore` of a short-lived mapping of the file's range,
//! pinning by `mlock` of a mapping kept for the life of the storage. Padding reads as zeros.
//!
//! Files are opened on first use (with `O_NOATIME` where allowed) and kept in a bounded LRU of
//! open descriptors ([`OPEN_FILES`]). A file opened is checked against what the walk recorded
//! (inode, size, modification time), and every read, passthrough open and pin of a kept one
//! asks its path again: a file rewritten, replaced or removed since the mount answers an error
//! naming it, so its old and new bytes are never mixed. Page-cache advice (residency,
//! will-need, release) goes through a kept descriptor unchecked: it reads no bytes, and
//! checking cost a path lookup per call, three per READ.

use super::Storage;
use crate::storage::ObjectId;
use memmap2::{Mmap, MmapOptions};
use nix::fcntl::PosixFadviseAdvice;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

const PAGE: u64 = 4096;

/// Open descriptors kept at most (well under the common soft `RLIMIT_NOFILE` of 1024, which
/// FUSE's cloned channels and the index share).
pub const OPEN_FILES: usize = 256;

/// What the walk recorded of a file: a use that finds anything else refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Inode number (a file replaced by rename has another).
    pub ino: u64,
    /// Size, bytes.
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
}

impl Stamp {
    /// The stamp of `m`.
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            ino: m.ino(),
            len: m.len(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        }
    }
}

/// One file of the set: where it lies in object 0 and what it was at the walk.
#[derive(Debug, Clone)]
pub struct SetFile {
    /// Path relative to the root.
    pub rel: PathBuf,
    /// First byte of the file in object 0 (a multiple of the page size).
    pub base: u64,
    /// The file as walked.
    pub stamp: Stamp,
}

/// The files of a directory tree as one storage object (object 0).
pub struct FileSet {
    root: PathBuf,
    /// Sorted by `base`.
    files: Vec<SetFile>,
    len: u64,
    open: Mutex<lru::LruCache<usize, Arc<File>>>,
    pins: Mutex<Vec<Mmap>>,
    step: usize,
    /// Files whose change was logged (each is logged once).
    reported: Vec<AtomicBool>,
}

impl std::fmt::Debug for FileSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSet")
            .field("root", &self.root)
            .field("files", &self.files.len())
            .field("len", &self.len)
            .finish()
    }
}

impl FileSet {
    /// The files `files` under `root`, laid out at their `base`s (increasing, page-aligned,
    /// not overlapping). Errors: a base that is not so (`InvalidInput`).
    pub fn new(root: &Path, files: Vec<SetFile>) -> io::Result<FileSet> {
        let mut end = 0;
        for f in &files {
            if f.base % PAGE != 0 || f.base < end {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: misplaced at byte {}", f.rel.display(), f.base),
                ));
            }
            end = f.base + f.stamp.len;
        }
        let step = File::open(root).map_or(128 << 10, |f| super::local::will_need_step(&f));
        let reported = (0..files.len()).map(|_| AtomicBool::new(false)).collect();
        Ok(FileSet {
            root: root.to_path_buf(),
            files,
            len: end.next_multiple_of(PAGE),
            open: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(OPEN_FILES).expect("non-zero"),
            )),
            pins: Mutex::default(),
            step,
            reported,
        })
    }

    /// The files, in storage order.
    pub fn files(&self) -> &[SetFile] {
        &self.files
    }

    /// The file `k`, open and checked against its stamp. Errors: it cannot be opened, or it
    /// changed since the walk (the message names it and says what changed).
    pub fn file(&self, k: usize) -> io::Result<Arc<File>> {
        let (file, kept) = self.descriptor(k)?;
        if kept {
            // A kept descriptor still reads the file it opened: the path is asked whether that
            // is still the file there (not replaced by a rename, not removed).
            let f = &self.files[k];
            let now = std::fs::symlink_metadata(self.root.join(&f.rel)).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{} was removed since the mount ({e})", f.rel.display()),
                )
            });
            self.check(k, now.map(|m| Stamp::of(&m)))?;
        }
        Ok(file)
    }

    /// A descriptor of file `k` and whether it was kept from an earlier use. One opened now
    /// is checked against the stamp (`fstat`); a kept one is not: page-cache advice through
    /// a descriptor of a file replaced since reaches only the old file's pages, and every
    /// read goes through [`FileSet::file`]. Errors: as [`FileSet::file`] for a new one.
    fn descriptor(&self, k: usize) -> io::Result<(Arc<File>, bool)> {
        let kept = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&k)
            .cloned();
        if let Some(file) = kept {
            return Ok((file, true));
        }
        let path = self.root.join(&self.files[k].rel);
        let file = open_original(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let file = Arc::new(file);
        self.check(k, file.metadata().map(|m| Stamp::of(&m)))?;
        (self.open.lock().unwrap_or_else(|p| p.into_inner())).put(k, file.clone());
        Ok((file, false))
    }

    /// Compares what file `k` is `now` with its stamp; a difference (or `now`'s error) drops
    /// its kept descriptor, is logged once per file and becomes the error returned.
    fn check(&self, k: usize, now: io::Result<Stamp>) -> io::Result<()> {
        let f = &self.files[k];
        let err = match now {
            Ok(now) if now == f.stamp => return Ok(()),
            Ok(now) => io::Error::other(format!(
                "{} changed since the mount ({}); its new content is served under its name once the change is seen (a new open)",
                f.rel.display(),
                changes(&f.stamp, &now)
            )),
            Err(e) => e,
        };
        self.open.lock().unwrap_or_else(|p| p.into_inner()).pop(&k);
        if !self.reported[k].swap(true, Relaxed) {
            log::warn!("{err}; the mount's first version of it answers EIO");
        }
        Err(err)
    }

    /// The files' indices in the order of their first block on the device (FIEMAP, Linux's
    /// `FS_IOC_FIEMAP`, through the `fiemap` crate), files without one (empty, inline, or on a
    /// file system without FIEMAP) first in storage order. `None` when no file has a known
    /// block: storage order is as good as any.
    pub fn physical_order(&self) -> Option<Vec<usize>> {
        let first_block = |k: usize| -> Option<u64> {
            let path = self.root.join(&self.files[k].rel);
            let file = open_original(&path).ok()?;
            let ext = fiemap::Fiemap::new(file).next()?.ok()?;
            let unknown = fiemap::FiemapExtentFlags::UNKNOWN;
            (!ext.fe_flags.intersects(unknown)).then_some(ext.fe_physical)
        };
        let mut keyed: Vec<(Option<u64>, usize)> =
            (0..self.files.len()).map(|k| (first_block(k), k)).collect();
        if keyed.iter().all(|(b, _)| b.is_none()) {
            return None;
        }
        keyed.sort_unstable();
        Some(keyed.into_iter().map(|(_, k)| k).collect())
    }

    /// The file whose bytes are exactly `r` of object 0 (what a passthrough open serves).
    pub fn whole(&self, r: &Range<u64>) -> Option<usize> {
        // Empty files share their base with the file after them.
        let first = self.files.partition_point(|f| f.base < r.start);
        (first..self.files.len())
            .take_while(|&k| self.files[k].base == r.start)
            .find(|&k| self.files[k].stamp.len == r.end - r.start)
    }

    /// The pieces of `r` that lie in files: (file, range inside it, offset of the piece
    /// inside `r`), in order.
    fn pieces(&self, r: &Range<u64>) -> impl Iterator<Item = (usize, Range<u64>, u64)> + '_ {
        let r = r.clone();
        let first = (self.files).partition_point(|f| f.base + f.stamp.len <= r.start);
        (self.files.iter().enumerate().skip(first))
            .take_while(move |(_, f)| f.base < r.end)
            .filter_map(move |(k, f)| {
                let (s, e) = (r.start.max(f.base), r.end.min(f.base + f.stamp.len));
                (s < e).then(|| (k, s - f.base..e - f.base, s - r.start))
            })
    }

    /// `f(file, range)` for every file piece of `r` through its descriptor (unchecked when
    /// kept: page-cache advice, see [`FileSet::descriptor`]), stopping at the first error.
    fn advise(
        &self,
        r: &Range<u64>,
        mut f: impl FnMut(&File, &Range<u64>) -> io::Result<()>,
    ) -> io::Result<()> {
        for (k, fr, _) in self.pieces(r) {
            f(&self.descriptor(k)?.0, &fr)?;
        }
        Ok(())
    }
}

/// Opens the original file at `path` for reading, with `O_NOATIME` where allowed (it needs the
/// file's owner or `CAP_FOWNER`; without it the open is retried plain), never through a
/// symbolic link (`O_NOFOLLOW`: ELOOP), and never waiting: `O_NONBLOCK`, so a FIFO put in a
/// file's place (whose open would wait for a writer, holding the daemon and its reader) opens
/// at once and is refused as not a regular file, as a device or socket is.
///
/// Errors: those of `open(2)`; `InvalidInput` for anything but a regular file.
pub fn open_original(path: &Path) -> io::Result<File> {
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
    };
    regular_only(open(libc::O_NOATIME).or_else(|_| open(0))?)
}

/// `f` if it is a regular file; else `InvalidInput` (a FIFO, device or socket opened in a
/// file's place, without waiting thanks to `O_NONBLOCK`).
fn regular_only(f: File) -> io::Result<File> {
    if !f.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or socket stands in its place)",
        ));
    }
    Ok(f)
}

/// Opens `rel` (a relative path of the tree) below the directory `root` without ever leaving
/// it: `openat2(2)` from `root`'s descriptor with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so no
/// component — not only the last, as `O_NOFOLLOW` checks — may be a symbolic link or `..` out
/// of the tree. A directory of the tree swapped for a link to elsewhere while mounted is then
/// refused (ELOOP, EXDEV) instead of followed. `flags` are the open flags (`O_PATH | O_NOFOLLOW`
/// gives a descriptor of a trailing link itself, for its metadata).
///
/// Errors: those of the open; ENOSYS on kernels before 5.6 (no `openat2`).
fn beneath(root: &Path, rel: &Path, flags: nix::fcntl::OFlag) -> io::Result<std::os::fd::OwnedFd> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let top = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)?;
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    nix::fcntl::openat2(&top, rel, how).map_err(io::Error::from)
}

/// [`open_original`] of `rel` below `root`, never through a symbolic link or out of the tree
/// (see [`beneath`]). Errors: those of [`open_original`], and ELOOP/EXDEV where a component
/// is a link.
pub fn open_original_beneath(root: &Path, rel: &Path) -> io::Result<File> {
    use nix::fcntl::OFlag;
    let base = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    let fd = beneath(root, rel, base | OFlag::O_NOATIME).or_else(|_| beneath(root, rel, base))?;
    regular_only(File::from(fd))
}

/// The metadata of `rel` below `root` (of a trailing symbolic link itself), never resolved
/// through a link or out of the tree (see [`beneath`]): a path through a link is NotFound, as
/// the walk leaves links out.
pub fn metadata_beneath(root: &Path, rel: &Path) -> io::Result<std::fs::Metadata> {
    use nix::fcntl::OFlag;
    match beneath(root, rel, OFlag::O_PATH | OFlag::O_NOFOLLOW) {
        Ok(fd) => File::from(fd).metadata(),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EXDEV)) => {
            Err(io::Error::new(io::ErrorKind::NotFound, e))
        }
        Err(e) => Err(e),
    }
}

/// One entry of a directory listed by [`read_dir_beneath`].
pub struct DirEntry {
    /// Its name.
    pub name: Vec<u8>,
    /// Its inode number.
    pub ino: u64,
    /// Whether it is a directory (`None`: the file system did not say).
    pub is_dir: Option<bool>,
}

/// The entries of the directory `rel` below `root` (no `.` and `..`), never listed through a
/// symbolic link or out of the tree (see [`beneath`]).
pub fn read_dir_beneath(root: &Path, rel: &Path) -> io::Result<Vec<DirEntry>> {
    use nix::fcntl::OFlag;
    let fd = beneath(
        root,
        rel,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
    )?;
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(io::Error::from)?;
    let mut out = Vec::new();
    for e in dir.iter() {
        let e = e.map_err(io::Error::from)?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push(DirEntry {
            name: name.to_vec(),
            ino: e.ino(),
            is_dir: e.file_type().map(|t| t == nix::dir::Type::Directory),
        });
    }
    Ok(out)
}

/// What differs between two stamps, for messages.
fn changes(was: &Stamp, now: &Stamp) -> String {
    let mut d = Vec::new();
    if was.ino != now.ino {
        d.push("replaced".to_string());
    }
    if was.len != now.len {
        d.push(format!("{} bytes, now {}", was.len, now.len));
    }
    if was.mtime_ns != now.mtime_ns {
        d.push("modified".to_string());
    }
    d.join(", ")
}

/// A read-only mapping of whole pages around bytes `r` of `file`, and where `r` starts in it.
fn map_pages(file: &File, r: &Range<u64>) -> io::Result<Option<(Mmap, usize)>> {
    let start = r.start / PAGE * PAGE;
    if r.end <= start {
        return Ok(None);
    }
    // SAFETY: a read-only shared map of a file the set checks against its stamp; it is only
    // given to mincore/mlock, never read through while the file could shrink under it.
    let map = unsafe {
        MmapOptions::new()
            .offset(start)
            .len((r.end - start) as usize)
            .map(file)?
    };
    Ok(Some((map, (r.start - start) as usize)))
}

impl Storage for FileSet {
    fn len(&self, obj: ObjectId) -> u64 {
        if obj == 0 { self.len } else { 0 }
    }

    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = off.saturating_add(buf.len() as u64);
        if obj != 0 || end > self.len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.fill(0);
        for (k, fr, at) in self.pieces(&(off..end)) {
            let at = at as usize;
            let n = (fr.end - fr.start) as usize;
            let f = self.file(k)?;
            f.read_exact_at(&mut buf[at..at + n], fr.start)?;
            // Checked after the read too: a rewrite in place during it (same inode, new
            // mtime or size) would have given bytes of two versions.
            self.check(k, f.metadata().map(|m| Stamp::of(&m)))?;
        }
        Ok(())
    }

    fn will_need(&self, obj: ObjectId, r: &Range<u64>) {
        if obj != 0 {
            return;
        }
        let step = self.step as u64;
        let _ = self.advise(r, |f, fr| {
            let mut s = fr.start;
            while s < fr.end {
                let e = (s + step).min(fr.end);
                let _ = super::fadvise(f, &(s..e), PosixFadviseAdvice::POSIX_FADV_WILLNEED);
                s = e;
            }
            Ok(())
        });
    }

    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64 {
        if obj != 0 {
            return 0;
        }
        let mut total = 0;
        let _ = self.advise(r, |f, fr| {
            let Some((map, _)) = map_pages(f, fr)? else {
                return Ok(());
            };
            let mut vec = vec![0u8; map.len().div_ceil(PAGE as usize)];
            // SAFETY: the address range is the live mapping `map` and `vec` has one byte per
            // page of it, as mincore(2) requires.
            let rc = unsafe {
                libc::mincore(
                    map.as_ptr() as *mut libc::c_void,
                    map.len(),
                    vec.as_mut_ptr(),
                )
            };
            if rc == 0 {
                let pages = vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
                total += (pages * PAGE).min(map.len() as u64);
            }
            Ok(())
        });
        total
    }

    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        let want: u64 = (self.pieces(r))
            .map(|(_, fr, _)| fr.end - fr.start / PAGE * PAGE)
            .sum();
        self.resident_bytes(obj, r) >= want
    }

    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        if obj != 0 {
            return Ok(());
        }
        for (k, fr, _) in self.pieces(r) {
            // A file's last page goes too: nothing else lies in it.
            let end = if fr.end >= self.files[k].stamp.len {
                fr.end.next_multiple_of(PAGE)
            } else {
                fr.end
            };
            super::fadvise(
                &self.descriptor(k)?.0,
                &(fr.start..end),
                PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )?;
        }
        Ok(())
    }

    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        if obj != 0 {
            return Ok(());
        }
        self.advise(r, |f, fr| {
            super::fadvise(
                f,
                &(fr.start / PAGE * PAGE..fr.end.next_multiple_of(PAGE)),
                PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )
        })
    }

    /// Each file piece of `r` is mapped and locked; the mappings live as long as the storage
    /// (one per file piece: the process's map count, `vm.max_map_count`, bounds the files a
    /// pin can hold, 65,530 by default).
    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        if obj != 0 {
            return Ok(());
        }
        let mut maps = Vec::new();
        for (k, fr, _) in self.pieces(r) {
            // Checked: a lock faults the pages in.
            if let Some((map, _)) = map_pages(&*self.file(k)?, &fr)? {
                map.lock()?;
                maps.push(map);
            }
        }
        self.pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(maps);
        Ok(())
    }

    /// The files in the order of their first block on the device ([`FileSet::physical_order`]):
    /// on a disk that seeks, a warm in that order reads front to back whatever order the
    /// directory tree put them in.
    fn warm_plan(&self, obj: ObjectId, end: u64) -> Option<Vec<Range<u64>>> {
        if obj != 0 {
            return None;
        }
        let order = self.physical_order()?;
        let ranges = order.into_iter().filter_map(|k| {
            let f = &self.files[k];
            let e = (f.base + f.stamp.len).min(end);
            (f.base < e).then_some(f.base..e)
        });
        Some(ranges.collect())
    }

    fn backing_file(&self, obj: ObjectId, r: &Range<u64>) -> Option<io::Result<Arc<File>>> {
        if obj != 0 {
            return None;
        }
        self.whole(r).map(|k| self.file(k))
    }
}

#[cfg(test)]
mod tests;
