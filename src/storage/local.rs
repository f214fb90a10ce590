//! Local files as storage objects, read through the kernel's page cache: `pread` into the
//! caller's buffer (serving never grows the daemon's resident set), residency by `mincore`,
//! read-ahead hints by `madvise(WILLNEED)`, release by `posix_fadvise(DONTNEED)`, and pinning by
//! `mlock` of a shared mapping, which locks the page-cache pages themselves so neither
//! `drop_caches` nor memory pressure evicts them.
//!
//! Each mapping is advised `MADV_RANDOM` and each file `POSIX_FADV_RANDOM`: without them a cold
//! page fault, or a `pread` that the kernel takes for part of a sequential walk (consecutive
//! samples served one after the other, or pages read ahead just before), reads up to the
//! device's `read_ahead_kb` around it (8 MiB on a virtio disk), which for a shuffled or
//! block-shuffled epoch of 40 KB samples is a large over-read. Reads instead ask for exactly
//! the sample, and read-ahead across samples is explicit ([`crate::readahead`]).

use super::Storage;
use crate::storage::ObjectId;
use memmap2::{Advice, Mmap};
use nix::fcntl::PosixFadviseAdvice;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

const PAGE: u64 = 4096;

/// One open local file and its read-only shared mapping.
#[derive(Debug)]
pub struct LocalObject {
    file: File,
    map: Arc<Mmap>,
    /// Largest `will_need` request the kernel honours whole, bytes (see [`will_need_step`]).
    step: usize,
}

/// The most one `MADV_WILLNEED` (or `POSIX_FADV_WILLNEED`, or `readahead(2)`) call reads: the
/// kernel caps each at the larger of the device's read-ahead (`read_ahead_kb`) and its largest
/// request (`max_sectors_kb`) and silently drops the rest (mm/readahead.c,
/// `force_page_cache_ra`). With the common 128 KiB read-ahead a 4 MiB hint would read only
/// its first 128 KiB, so hints are sent in steps of this size. 128 KiB when the device's
/// settings cannot be read (not a block device, or no sysfs).
pub(super) fn will_need_step(file: &File) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(dev) = file.metadata().map(|m| m.dev()) else {
        return 128 << 10;
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    // A partition has no queue of its own: its disk's is one level up.
    let queue = [base.join("queue"), base.join("../queue")]
        .into_iter()
        .find(|q| q.exists());
    let read_kb = |name: &str| -> Option<usize> {
        std::fs::read_to_string(queue.as_ref()?.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let kb = read_kb("read_ahead_kb")
        .unwrap_or(0)
        .max(read_kb("max_sectors_kb").unwrap_or(0));
    (kb.clamp(128, 8192)) << 10
}

impl LocalObject {
    /// Wraps an open file and a mapping of all of it (e.g. a pack's), advising the mapping for random access.
    pub fn new(file: File, map: Arc<Mmap>) -> LocalObject {
        if let Err(e) = map.advise(Advice::Random) {
            log::warn!("madvise(MADV_RANDOM) failed: {e}");
        }
        let whole = 0..map.len() as u64;
        if let Err(e) = super::fadvise(&file, &whole, PosixFadviseAdvice::POSIX_FADV_RANDOM) {
            log::warn!("posix_fadvise(POSIX_FADV_RANDOM) failed: {e}");
        }
        let step = will_need_step(&file);
        LocalObject { file, map, step }
    }

    /// The page-aligned part of `r` inside the mapping, as offsets.
    fn pages(&self, r: &Range<u64>) -> Option<Range<usize>> {
        let start = (r.start / PAGE * PAGE) as usize;
        let end = r.end.min(self.map.len() as u64) as usize;
        (end > start).then_some(start..end)
    }
}

/// Local files served through the page cache.
#[derive(Debug)]
pub struct LocalStorage {
    objects: Vec<LocalObject>,
}

impl LocalStorage {
    /// Storage over `objects`, object `k` being [`ObjectId`] `k`.
    pub fn new(objects: Vec<LocalObject>) -> LocalStorage {
        LocalStorage { objects }
    }

    fn object(&self, obj: ObjectId) -> io::Result<&LocalObject> {
        self.objects.get(obj as usize).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no storage object {obj}"))
        })
    }
}

impl Storage for LocalStorage {
    fn len(&self, obj: ObjectId) -> u64 {
        self.object(obj).map_or(0, |o| o.map.len() as u64)
    }

    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.object(obj)?.file.read_exact_at(buf, off)
    }

    fn will_need(&self, obj: ObjectId, r: &Range<u64>) {
        let Ok(o) = self.object(obj) else { return };
        if let Some(p) = o.pages(r) {
            let mut off = p.start;
            while off < p.end {
                let len = o.step.min(p.end - off);
                let _ = o.map.advise_range(Advice::WillNeed, off, len);
                off += len;
            }
        }
    }

    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64 {
        let Ok(o) = self.object(obj) else { return 0 };
        let Some(p) = o.pages(r) else { return 0 };
        let mut vec = vec![0u8; (p.end - p.start).div_ceil(PAGE as usize)];
        // SAFETY: the address range lies inside the live mapping (clamped by `pages`) and `vec`
        // has one byte per page of it, as mincore(2) requires.
        let rc = unsafe {
            libc::mincore(
                o.map.as_ptr().add(p.start) as *mut libc::c_void,
                p.end - p.start,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return 0;
        }
        let full = vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * PAGE;
        full.min((p.end - p.start) as u64)
    }

    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        let want = r
            .end
            .min(self.len(obj))
            .saturating_sub(r.start / PAGE * PAGE);
        self.resident_bytes(obj, r) >= want
    }

    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        super::fadvise(
            &self.object(obj)?.file,
            r,
            PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
    }

    /// Pages mapped by any process survive `POSIX_FADV_DONTNEED`, so this process's page-table
    /// entries for `r` go first (`MADV_DONTNEED`), then the page-cache pages.
    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        let o = self.object(obj)?;
        if let Some(p) = o.pages(r) {
            // SAFETY: the mapping is a read-only shared map of an immutable file; MADV_DONTNEED
            // only drops page-table entries, and later accesses fault the same bytes back in.
            unsafe {
                o.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    p.start,
                    p.end - p.start,
                )?
            };
        }
        self.release(obj, r)
    }

    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        let o = self.object(obj)?;
        let Some(p) = o.pages(r) else { return Ok(()) };
        // SAFETY: the range lies inside the mapping, which lives as long as `self`; mlock reads
        // nothing through the pointer. Pages stay locked while a mapping that locked them exists.
        let rc = unsafe {
            libc::mlock(
                o.map.as_ptr().add(p.start) as *const libc::c_void,
                p.end - p.start,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
