//! How blocks get into the cache: claimed runs fetched by GETs and stored (block, then its
//! entry), blocks kept from an earlier mount checked once before first use, reads holding
//! their blocks against eviction, and the fallback to memory when the disk is full.

use super::blocks::State;
use super::{BLOCK, BlockCacheShared};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;

/// Bytes received but not stored (the cache's file system is full): `(object range, bytes)`.
pub(super) type Unstored = (Range<u64>, bytes::Bytes);

/// The blocks a read holds against eviction, and the bytes of those that could not be stored.
pub(super) struct Held {
    /// The blocks held (each block's reader count raised).
    pub blocks: Range<usize>,
    /// Bytes of blocks that could not be stored, to be copied over the file's holes.
    pub memory: Vec<Unstored>,
}

fn disk_full(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
    )
}

impl BlockCacheShared {
    /// Fetches the claimed run `run` and stores it. Returns the bytes when they could not be
    /// stored (a full disk, or bytes not all served: the blocks go back to missing and the
    /// caller serves them from memory). On a failed GET every block of the run goes back to
    /// missing.
    pub(super) async fn fetch(&self, run: Range<usize>) -> io::Result<Option<Unstored>> {
        let r = self.blocks.run_bytes(&run);
        let res = match self.source.get(r.clone()).await {
            // Bytes that hold a gap for an object gone (one of a run laid end to end) are
            // served from memory, never stored: a later mount of the same listing must not
            // find them as that object's bytes.
            Ok(bytes) if self.source.check_served(&r).is_err() => Ok(Some((r, bytes))),
            Ok(bytes) => match self.store(run.clone(), &bytes) {
                Ok(()) => Ok(None),
                Err(e) if disk_full(&e) => Ok(Some((r, bytes))),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if !matches!(res, Ok(None)) {
            // Blocks stored before a failure stay; the others go back to missing.
            for b in run {
                self.blocks.slot(b).cas(State::Fetching, State::Missing);
            }
        }
        self.notify();
        res
    }

    pub(super) fn notify(&self) {
        let _g = self.wait.0.lock();
        self.wait.1.notify_all();
    }

    /// Writes fetched bytes of `run` into the cache: each block's data, then its entry.
    fn store(&self, run: Range<usize>, bytes: &[u8]) -> io::Result<()> {
        let closed = self
            .closed
            .read()
            .map_err(|_| io::Error::other("poisoned"))?;
        if *closed {
            return Err(io::Error::other("the block cache is closed"));
        }
        let start = self.blocks.bytes(run.start).start;
        for b in run {
            let br = self.blocks.bytes(b);
            let chunk = &bytes[(br.start - start) as usize..(br.end - start) as usize];
            // Counted in `used` from here; given back if it cannot be stored.
            self.make_room();
            let c = crc32c::crc32c(chunk);
            let stored = self
                .write_block(br.start, chunk)
                .and_then(|()| self.table.set(b, c, chunk.len() as u32));
            if let Err(e) = stored {
                self.blocks.used.fetch_sub(1, Relaxed);
                return Err(e);
            }
            let slot = self.blocks.slot(b);
            slot.crc.store(c, Relaxed);
            slot.referenced.store(true, Relaxed);
            slot.set(State::Present);
            self.fetched.fetch_add(1, Relaxed);
        }
        // Start writing the run back now: pages left dirty would be written back later in the
        // way of reads (releasing a served sample's pages, `POSIX_FADV_DONTNEED`, writes dirty
        // pages first).
        let len = bytes.len() as i64;
        // SAFETY: sync_file_range only reads the fd and the range; no memory is passed.
        let rc = unsafe {
            libc::sync_file_range(
                std::os::fd::AsRawFd::as_raw_fd(&self.data),
                start as i64,
                len,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if rc != 0 {
            log::debug!("sync_file_range: {}", io::Error::last_os_error());
        }
        Ok(())
    }

    /// Writes one block's bytes at `off`. When the file system is full, the cache keeps at
    /// most what it holds now (logged once), evicts a block and tries once more.
    fn write_block(&self, off: u64, chunk: &[u8]) -> io::Result<()> {
        match self.data.write_all_at(chunk, off) {
            Err(e) if disk_full(&e) => {
                let used = self.blocks.used.load(Relaxed);
                self.blocks.limit.fetch_min(used.max(1), Relaxed);
                if !self.full_logged.swap(true, Relaxed) {
                    log::warn!(
                        "block cache {}: its file system is full ({e}); the cache now keeps at most {} MiB, and blocks that cannot be stored are served from memory",
                        self.dir.path().display(),
                        (used.max(1) * BLOCK) >> 20
                    );
                }
                if self.evict_one() {
                    self.data.write_all_at(chunk, off)
                } else {
                    Err(e)
                }
            }
            r => r,
        }
    }

    /// Makes every block of `r` present (fetching what is missing, waiting for fetches and
    /// checks of others) or served from memory, and holds them so none is evicted until
    /// [`super::blocks::Blocks::unhold`].
    pub(super) fn hold(&self, r: &Range<u64>) -> io::Result<Held> {
        let blocks = self.blocks.covering(r);
        // Held first: a block fetched here cannot be evicted before it is read.
        self.blocks.hold(blocks.clone());
        match self.hold_held(&blocks) {
            Ok(memory) => Ok(Held { blocks, memory }),
            Err(e) => {
                self.blocks.unhold(blocks);
                Err(e)
            }
        }
    }

    fn hold_held(&self, blocks: &Range<usize>) -> io::Result<Vec<Unstored>> {
        let mut memory: Vec<Unstored> = Vec::new();
        for _ in 0..3 {
            let runs = self.blocks.claim(blocks.clone());
            if !runs.is_empty() {
                let results = self.source.runtime().block_on(futures::future::join_all(
                    runs.into_iter().map(|run| self.fetch(run)),
                ));
                for res in results {
                    memory.extend(res?);
                }
            }
            memory.extend(self.check_unchecked(blocks.clone())?);
            self.wait_busy(blocks.clone())?;
            let served = |b: usize| {
                let start = b as u64 * BLOCK;
                self.blocks.slot(b).state() == State::Present
                    || memory.iter().any(|(r, _)| r.contains(&start))
            };
            if blocks.clone().all(served) {
                return Ok(memory);
            }
        }
        Err(io::Error::other(format!(
            "{}: blocks {}..{} could not be fetched (three fetches by other readers failed)",
            self.source.url(),
            blocks.start,
            blocks.end
        )))
    }

    /// Waits while another caller fetches or checks a block of `blocks`. The lock is taken
    /// only for such a block (a read of present blocks, the common case, takes none).
    fn wait_busy(&self, blocks: Range<usize>) -> io::Result<()> {
        for b in blocks {
            if !self.blocks.slot(b).state().busy() {
                continue;
            }
            let mut g = self
                .wait
                .0
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            while self.blocks.slot(b).state().busy() {
                g = self
                    .wait
                    .1
                    .wait_timeout(g, std::time::Duration::from_millis(50))
                    .map_err(|_| io::Error::other("poisoned"))?
                    .0;
            }
        }
        Ok(())
    }

    /// Checks blocks kept from an earlier mount against their CRC before first use. Each block
    /// is claimed (Unchecked → Checking) by one checker, so a damaged block is logged, counted
    /// and fetched once however many readers reach it at once.
    pub(super) fn check_unchecked(&self, blocks: Range<usize>) -> io::Result<Vec<Unstored>> {
        let mut memory = Vec::new();
        for b in blocks {
            let slot = self.blocks.slot(b);
            if !slot.cas(State::Unchecked, State::Checking) {
                continue;
            }
            let r = self.blocks.bytes(b);
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            let read = self.data.read_exact_at(&mut buf, r.start);
            if read.is_ok() && crc32c::crc32c(&buf) == slot.crc.load(Relaxed) {
                slot.set(State::Present);
                self.notify();
                continue;
            }
            log::warn!(
                "{}: cached block {b} is damaged ({}); fetching it again",
                self.source.url(),
                read.err()
                    .map_or("CRC-32C mismatch".to_string(), |e| e.to_string())
            );
            self.damaged.fetch_add(1, Relaxed);
            self.blocks.used.fetch_sub(1, Relaxed);
            slot.set(State::Fetching);
            memory.extend(self.source.runtime().block_on(self.fetch(b..b + 1))?);
        }
        Ok(memory)
    }
}
