//! Storage: how the bytes of storage objects are read, and the page-cache verbs the read path
//! needs around those reads. A [`Storage`] knows nothing of files, samples or formats: it reads
//! byte ranges of the objects a catalog names ([`crate::catalog::ObjectId`]) and says what is
//! cached. [`local::LocalStorage`] serves local files through the kernel's page cache; [`block_cache::BlockCache`]
//! (ranged GETs of an [`object_source::ObjectSource`] into a local block cache) answers the same
//! calls; [`chunks`] serves compressed chunks decompressed.

pub mod block_cache;
pub mod chunks;
pub mod files;
pub mod local;
pub mod object;

/// The root of loosefs's caches on this machine: `$LOOSEFS_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/loosefs` (the XDG base directory spec), else `~/.cache/loosefs`, else
/// `/var/cache/loosefs`. The block cache of remote objects is `blocks/` under it, the kept
/// indexes of foreign sources `index/`.
pub fn cache_root() -> std::path::PathBuf {
    use std::path::PathBuf;
    std::env::var_os("LOOSEFS_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("loosefs")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/loosefs")))
        .unwrap_or_else(|| PathBuf::from("/var/cache/loosefs"))
}

use nix::fcntl::PosixFadviseAdvice;
use std::io;
use std::ops::Range;

/// Index of a storage object (a pack file, a shard, a remote object) among those a storage
/// reads: a catalog's objects (`crate::catalog::Catalog::objects`) in their order.
pub type ObjectId = u32;

/// `posix_fadvise(2)` over bytes `r` of `file` (nix's safe wrapper): the page-cache verb both
/// local files and compressed chunks' files use. Errors: the kernel's (bad fd, bad advice).
pub(crate) fn fadvise(
    file: &std::fs::File,
    r: &Range<u64>,
    advice: PosixFadviseAdvice,
) -> io::Result<()> {
    let len = r.end.saturating_sub(r.start);
    // A length of 0 means "to the end of the file" to posix_fadvise: an empty range (a read at
    // the end of a sample) must advise nothing, not release the rest of the pack.
    if len == 0 {
        return Ok(());
    }
    nix::fcntl::posix_fadvise(file, r.start as i64, len as i64, advice).map_err(io::Error::from)
}

/// Reads from `r` until `buf` is full or the input ends (`Interrupted` retried); returns the
/// bytes read, fewer than `buf.len()` only at the end of the input. (`Read::read_exact` fails
/// at an early end, which the callers need to tell apart: a short last piece, a stream shorter
/// than declared.) Errors: the reader's.
pub fn read_full(r: &mut dyn io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads byte ranges of storage objects and manages their cached copies. Ranges are clamped to
/// the object; verbs that only advise (will-need, release) never fail the read path.
pub trait Storage: Send + Sync {
    /// Size of object `obj`, bytes (0 for an unknown object).
    fn len(&self, obj: ObjectId) -> u64;

    /// Fills `buf` from byte `off` of `obj`. Errors: I/O errors, or a range past the end
    /// (`UnexpectedEof`).
    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Asks for `r` to be brought into the cache asynchronously (no wait).
    fn will_need(&self, obj: ObjectId, r: &Range<u64>);

    /// Asks for exactly the bytes of `ranges` (sorted, disjoint, of object `obj`), each to be
    /// read soon and once, without waiting: for a sparse announced order, where a storage
    /// whose unit is larger than a sample (a remote block cache's 1 MiB blocks) would bring
    /// mostly bytes nobody reads. Default: [`Storage::will_need`] of each.
    fn will_need_exact(&self, obj: ObjectId, ranges: &[Range<u64>]) {
        for r in ranges {
            self.will_need(obj, r);
        }
    }

    /// Cached bytes of `r`, counted in whole pages.
    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64;

    /// Whether every page of `r` is cached.
    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool;

    /// Drops the cached copy of `r` once it has been served (whole pages inside `r` only; pages
    /// in use elsewhere or pinned stay).
    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()>;

    /// Evicts the cached copy of `r` entirely, including this process's own mappings of it, so
    /// the next read goes to the device. `r` must not overlap a pinned range.
    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()>;

    /// Pins `r` in memory (it stays cached whatever the memory pressure) for the life of the
    /// storage. Errors: the pin is refused (e.g. `RLIMIT_MEMLOCK`, `ENOMEM`).
    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()>;

    /// Changes whenever cached bytes may have been replaced by bytes fetched again (a remote
    /// block cache evicts): samples checked before must be checked again. Local files: 0.
    fn generation(&self) -> u64 {
        0
    }

    /// Fetches the bytes around `r` again (they failed a check after being read under
    /// [`Storage::generation`] `seen`), unless another reader already did since; true if
    /// the next read may give other bytes (a remote object). Local files: false (a re-read
    /// gives the same bytes).
    fn refetch(&self, _obj: ObjectId, _r: &Range<u64>, _seen: u64) -> bool {
        false
    }

    /// Called once when the mount ends: a remote block cache makes its blocks durable and
    /// marks itself clean. Local files: nothing.
    fn close(&self) {}

    /// GET and block-cache counters, for remote storage.
    fn remote_report(&self) -> Option<crate::report::RemoteReport> {
        None
    }

    /// Bytes a whole-object warm asks ahead of its reads (`will_need`), for storage whose
    /// reads are worth overlapping (a remote object: GETs in flight cover the link's
    /// bandwidth-delay product). Local files: 0 (the warm's own reads keep the disk busy).
    fn warm_ahead(&self) -> u64 {
        0
    }

    /// The local file whose bytes are exactly `r` of `obj`, at the same offsets from its
    /// start, when there is one (a loose directory's file): the kernel can then serve the
    /// file's reads from it directly (FUSE passthrough). `None`: no such file (a sample inside
    /// a pack, a remote object). Errors: the file cannot be opened or changed since the mount.
    fn backing_file(
        &self,
        _obj: ObjectId,
        _r: &Range<u64>,
    ) -> Option<io::Result<std::sync::Arc<std::fs::File>>> {
        None
    }

    /// The ranges of `[0, end)` of `obj` in the order a whole-object warm reads them, when
    /// another order than front to back suits the device (a loose directory's files in the
    /// order of their first block on the disk). `None`: front to back.
    fn warm_plan(&self, _obj: ObjectId, _end: u64) -> Option<Vec<Range<u64>>> {
        None
    }

    /// Bytes a whole-object warm may bring in (None: as much as fits in memory).
    fn warm_budget(&self) -> Option<u64> {
        None
    }
}
