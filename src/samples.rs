//! Checked reads of stored sample bytes: a catalog [`Extent`] read from [`Storage`], the whole
//! sample checked against its CRC-32 the first time any part of it is served. A sample that
//! fails answers [`FsError::Corrupt`] (EIO) every time and none of its bytes is ever served;
//! it is logged once with its path, and later requests fail at once without reading it again.
//! A sample whose CRC-32 the index does not know (a foreign dataset indexed with `--verify
//! lazy`) has the CRC-32 of its first read recorded; every later check must match it.
//! Bytes are read into the caller's buffer rather than copied out of a mapping, so serving a
//! pack does not grow the daemon's resident set.

use crate::catalog::{Catalog, Extent, FsError};
use crate::ino::Bitset;
use crate::storage::Storage;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// Samples up to this size are checked and served with one read; larger ones are checked in
/// chunks of this size, bytes.
pub const CHECK_CHUNK: usize = 16 << 20;

/// The stored samples of one catalog, read from one storage.
pub struct Samples {
    catalog: Arc<dyn Catalog>,
    storage: Arc<dyn Storage>,
    /// Records whose bytes matched their CRC-32 under the current storage generation.
    verified: Bitset,
    /// Records served at least once since the mount (never cleared: `drop-cache` drops the
    /// kernel's pages of each).
    served: Bitset,
    /// The storage generation `verified` was filled under.
    generation: AtomicU64,
    /// Read errors are logged at most once per interval (a server outage fails every read).
    io_log: crate::stats::LogLimit,
    /// Records whose bytes did not match their CRC-32.
    failed: Bitset,
    /// Whether samples are checked at all ([`Catalog::checks`]).
    checks: bool,
    /// Per record, the CRC-32 learned at the first read of a sample whose index has none:
    /// 0 = not yet, else `1 << 32 | crc`. Made at the first such sample (8 bytes per record).
    learned: OnceLock<Box<[AtomicU64]>>,
    /// CRC-32s learned so far.
    learned_count: AtomicU64,
}

impl Samples {
    /// Serves the files of `catalog` from `storage`.
    pub fn new(catalog: Arc<dyn Catalog>, storage: Arc<dyn Storage>) -> Samples {
        Samples {
            verified: Bitset::new(catalog.records()),
            served: Bitset::new(catalog.records()),
            generation: AtomicU64::new(0),
            io_log: crate::stats::LogLimit::default(),
            failed: Bitset::new(catalog.records()),
            checks: catalog.checks(),
            learned: OnceLock::new(),
            learned_count: AtomicU64::new(0),
            catalog,
            storage,
        }
    }

    /// The catalog served.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// The storage read from.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Up to `size` bytes of the stored bytes of file `ino` from `offset`; see
    /// [`Samples::read_extent`].
    pub fn read<'b>(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        buf: &'b mut Vec<u8>,
    ) -> Result<&'b [u8], FsError> {
        self.read_extent(&self.catalog.extent(ino)?, offset, size, buf)
    }

    /// Up to `size` bytes of the stored bytes of `ext` from `offset` (empty at or past the
    /// end), read into `buf` (reused across calls; it grows to at most the larger of the
    /// request and [`CHECK_CHUNK`]). Errors: [`FsError::Corrupt`] for a failed check,
    /// [`FsError::Io`] for a read the storage could not make.
    pub fn read_extent<'b>(
        &self,
        ext: &Extent,
        offset: u64,
        size: u32,
        buf: &'b mut Vec<u8>,
    ) -> Result<&'b [u8], FsError> {
        let len = ext.len();
        let start = offset.min(len);
        let end = offset.saturating_add(u64::from(size)).min(len);
        let io = |e: std::io::Error| {
            let why = format!("cannot read its stored bytes: {e}");
            if e.kind() == std::io::ErrorKind::StaleNetworkFileHandle {
                self.io_log
                    .log(|| format!("{}: {why}; answering ESTALE", self.path(ext)));
                return FsError::Stale(why);
            }
            self.io_log
                .log(|| format!("{}: {why}; answering EIO", self.path(ext)));
            FsError::Io(why)
        };
        if self.failed.contains(ext.record) {
            return Err(FsError::Corrupt("failed its CRC-32 check (logged)".into()));
        }
        // Checks made under an older storage generation do not count: cached bytes may have
        // been fetched again since (a remote block cache evicts).
        let generation = self.storage.generation();
        if self.generation.swap(generation, Relaxed) != generation {
            self.verified.clear();
        }
        if !self.checks {
            // The bytes are the original file's (a loose directory): served as read.
            buf.resize((end - start) as usize, 0);
            self.storage
                .read_at(ext.object, ext.range.start + start, buf)
                .map_err(io)?;
            if !self.served.contains(ext.record) {
                self.served.insert(ext.record);
            }
            return Ok(&buf[..]);
        }
        if self.verified.contains(ext.record) {
            buf.resize((end - start) as usize, 0);
            self.storage
                .read_at(ext.object, ext.range.start + start, buf)
                .map_err(io)?;
            if self.storage.generation() == generation {
                return Ok(&buf[..]);
            }
        }
        for attempt in 0..2 {
            let seen = self.storage.generation();
            let crc = self.whole_crc(ext, buf).map_err(io)?;
            if self.matches(ext, crc) {
                if !self.served.contains(ext.record) {
                    self.served.insert(ext.record);
                }
                if self.storage.generation() == seen {
                    self.verified.insert(ext.record);
                }
                break;
            }
            if attempt == 0 && self.storage.refetch(ext.object, &ext.range, seen) {
                log::warn!(
                    "{}: CRC-32 {crc:08x} does not match {}; fetching it again",
                    self.path(ext),
                    self.expected(ext)
                );
                continue;
            }
            return Err(self.fail(ext, crc));
        }
        if len <= CHECK_CHUNK as u64 {
            // `buf` holds the whole sample.
            buf.copy_within(start as usize..end as usize, 0);
            buf.truncate((end - start) as usize);
            return Ok(&buf[..]);
        }
        buf.resize((end - start) as usize, 0);
        self.storage
            .read_at(ext.object, ext.range.start + start, buf)
            .map_err(io)?;
        Ok(&buf[..])
    }

    /// The local file holding exactly the stored bytes of `ext`, for the kernel to read itself
    /// (FUSE passthrough), when the storage has one and the bytes need no check (a loose
    /// directory's file: [`crate::catalog::Catalog::checks`] is false). Counts it served.
    /// Errors: [`FsError::Io`] when the file cannot be opened or changed since the mount
    /// (logged, at most once per 10 s).
    pub fn backing(&self, ext: &Extent) -> Result<Option<Arc<std::fs::File>>, FsError> {
        if self.checks {
            return Ok(None);
        }
        match self.storage.backing_file(ext.object, &ext.range) {
            None => Ok(None),
            Some(Ok(f)) => {
                if !self.served.contains(ext.record) {
                    self.served.insert(ext.record);
                }
                Ok(Some(f))
            }
            Some(Err(e)) => {
                let why = format!("cannot open its file: {e}");
                self.io_log
                    .log(|| format!("{}: {why}; answering EIO", self.path(ext)));
                Err(FsError::Io(why))
            }
        }
    }

    /// CRC-32 of the whole sample of `ext`; leaves the whole sample in `buf` when it is at
    /// most [`CHECK_CHUNK`] bytes.
    fn whole_crc(&self, ext: &Extent, buf: &mut Vec<u8>) -> std::io::Result<u32> {
        let len = ext.len();
        if len <= CHECK_CHUNK as u64 {
            buf.resize(len as usize, 0);
            self.storage.read_at(ext.object, ext.range.start, buf)?;
            return Ok(crc32fast::hash(buf));
        }
        let mut h = crc32fast::Hasher::new();
        let mut off = 0;
        while off < len {
            let n = (len - off).min(CHECK_CHUNK as u64) as usize;
            buf.resize(n, 0);
            self.storage
                .read_at(ext.object, ext.range.start + off, buf)?;
            h.update(buf);
            off += n as u64;
        }
        Ok(h.finalize())
    }

    fn path(&self, ext: &Extent) -> String {
        self.catalog.path_of(crate::ino::record_ino(ext.record))
    }

    /// Whether `crc` (of the whole sample just read) is the one `ext` must have: the index's,
    /// or for a sample whose index has none the one learned at its first read (learned now if
    /// this is the first).
    fn matches(&self, ext: &Extent, crc: u32) -> bool {
        if let Some(want) = ext.crc32 {
            return crc == want;
        }
        let records = self.catalog.records();
        let table = self
            .learned
            .get_or_init(|| (0..records).map(|_| AtomicU64::new(0)).collect());
        let Some(slot) = table.get(ext.record as usize) else {
            return false;
        };
        let v = 1 << 32 | u64::from(crc);
        match slot.compare_exchange(0, v, std::sync::atomic::Ordering::AcqRel, Acquire) {
            Ok(_) => {
                self.learned_count.fetch_add(1, Relaxed);
                true
            }
            Err(old) => old == v,
        }
    }

    /// What `ext`'s CRC-32 was expected to be, for messages.
    fn expected(&self, ext: &Extent) -> String {
        if let Some(want) = ext.crc32 {
            return format!("the index ({want:08x})");
        }
        let learned = (self.learned.get())
            .and_then(|t| t.get(ext.record as usize))
            .map_or(0, |v| v.load(Acquire));
        format!("the one of its first read ({:08x})", learned as u32)
    }

    /// CRC-32s learned at first reads so far (samples whose index has none).
    pub fn learned(&self) -> u64 {
        self.learned_count.load(Relaxed)
    }

    /// Marks the sample of `ext` failed (logged once) and says why.
    fn fail(&self, ext: &Extent, crc: u32) -> FsError {
        let why = format!("CRC-32 {crc:08x} does not match {}", self.expected(ext));
        if !self.failed.insert(ext.record) {
            log::error!("{}: {why}; answering EIO", self.path(ext));
        }
        FsError::Corrupt(why)
    }

    /// Records whose bytes have been served (checked) since the mount, whatever the storage
    /// generation since.
    pub fn served(&self) -> impl Iterator<Item = u32> + '_ {
        self.served.iter()
    }
}
