//! A remote object as storage: bytes come from ranged GETs ([`ObjectClient`]) into a local
//! block cache, and every read is served from the cache file, so once a block is there the
//! object behaves as a local pack (page cache, `mincore`, `mlock`, the same read-ahead).
//!
//! The cache of one object (one URL at one ETag) is a directory holding `data`, a sparse file
//! the object's size where each fetched block sits at its own offset, and `blocks`, a table
//! of one 16-byte entry per block (`LFB1`, the block's CRC-32C, its length, the CRC-32C of
//! those 12 bytes). A block is written before its entry; an entry is trusted only after the
//! block's bytes match its CRC on first use in a mount, so a crash (entry on disk, data lost)
//! costs a refetch, never wrong bytes. Blocks are evicted by CLOCK within the cache size, their
//! space returned with `fallocate(PUNCH_HOLE)`. Eviction bumps [`Storage::generation`], which
//! makes the read path check samples' CRCs again.
//!
//! Fetching: the blocks a read lacks are claimed (single flight: a block being fetched is
//! waited for, not fetched twice), runs of adjacent missing blocks become one GET of at most
//! [`MERGE`] bytes, and the GETs of one read run concurrently within the client's limit.
//! [`Storage::will_need`] starts the same fetches without waiting: read-ahead in pack order
//! (the one in [`crate::readahead`]) becomes concurrent GETs.

use super::Storage;
use super::local::{LocalObject, LocalStorage};
use super::object::ObjectClient;
use crate::catalog::ObjectId;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::{Arc, Condvar, Mutex};

/// Block size of the cache, bytes: the unit fetched, checked and evicted. 1 MiB, as
/// mountpoint-s3's disk cache: a shuffled read of a 110 KB sample fetches ~1 MiB, while
/// read-ahead and warm merge adjacent blocks into large GETs.
pub const BLOCK: u64 = 1 << 20;
/// Largest GET, bytes: adjacent missing blocks are merged up to this (mountpoint-s3 uses
/// 8 MiB parts; larger GETs keep per-request overhead and request rates low).
pub const MERGE: u64 = 16 << 20;
/// Smallest cache size used, bytes (a smaller `--cache-size` is raised to it): two merged
/// GETs. A cache smaller than the read-ahead window (`--prefetch-max-mb`, 64 MiB) evicts blocks
/// fetched ahead before they are read, which is correct but fetches them twice.
pub const MIN_CACHE: u64 = 2 * MERGE;

const ENTRY: u64 = 16;
/// Name of the marker a clean close leaves in the cache directory.
const CLEAN: &str = "clean";
const MAGIC: &[u8; 4] = b"LFB1";

const MISSING: u8 = 0;
const FETCHING: u8 = 1;
/// Present from an earlier mount: its CRC is checked before first use.
const UNCHECKED: u8 = 2;
const PRESENT: u8 = 3;
const EVICTING: u8 = 4;

/// The block cache of one remote object, and the object's client.
pub struct RemoteStorage {
    c: Arc<Cache>,
}

struct Cache {
    client: Arc<ObjectClient>,
    len: u64,
    data: File,
    table: File,
    /// The cache file as a local object (page cache verbs, pin).
    local: LocalStorage,
    state: Vec<AtomicU8>,
    crc: Vec<AtomicU32>,
    /// CLOCK reference bits.
    referenced: Vec<AtomicBool>,
    /// Reads in progress per block (an evictor skips a block being read).
    readers: Vec<AtomicU32>,
    pinned: Vec<AtomicBool>,
    hand: Mutex<usize>,
    used: AtomicU64,
    limit: u64,
    generation: AtomicU64,
    /// Held while damaged blocks are fetched again.
    refetching: Mutex<()>,
    /// Set by a close: no block is stored after it.
    closed: std::sync::RwLock<bool>,
    /// Failed read-ahead fetches are logged at most once per interval.
    fetch_log: crate::stats::LogLimit,
    /// Threads writing into the directory, joined at close.
    writers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Waiters for blocks being fetched.
    wait: (Mutex<()>, Condvar),
    /// Counters: blocks fetched, blocks evicted, cached blocks failing their CRC.
    pub fetched: AtomicU64,
    /// Blocks evicted.
    pub evicted: AtomicU64,
    /// Cached blocks found damaged (CRC mismatch) and fetched again.
    pub damaged: AtomicU64,
    /// The cache directory.
    dir: PathBuf,
    /// Holds the cache directory's lock for the life of the mount.
    _lock: File,
}

impl std::fmt::Debug for RemoteStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStorage")
            .field("client", &self.c.client)
            .field("len", &self.c.len)
            .field("limit", &self.c.limit)
            .finish()
    }
}

/// The exclusive lock of an object's cache directory, held for the life of a mount.
#[derive(Debug)]
pub struct DirLock(File);

/// Makes and locks the cache directory `dir`, and removes temp files a killed writer left.
/// Errors: the directory cannot be made, or another mount holds it (after waiting 10 s for
/// one that is exiting).
pub fn lock_dir(dir: &Path) -> io::Result<DirLock> {
    std::fs::create_dir_all(dir)?;
    let lock = File::create(dir.join("lock"))?;
    // A mount of the same object that was just unmounted may still be exiting: wait a
    // little for its lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match nix::fcntl::Flock::lock(
            lock.try_clone()?,
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        ) {
            Ok(l) => {
                // The lock lives as long as the open file description, which `lock` keeps.
                std::mem::forget(l);
                break;
            }
            Err((_, e)) if std::time::Instant::now() >= deadline => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "the block cache {} is in use by another mount ({e}); give another --cache-dir",
                        dir.display()
                    ),
                ));
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    // Temp files of a writer killed mid-way (a crash).
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_name().to_string_lossy().starts_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(DirLock(lock))
}

/// The cache directory of an object: `<root>/<xxh3(url)>-<xxh3(etag, version)>`.
pub fn cache_dir(root: &Path, url: &str, etag: &str, version: Option<&str>) -> PathBuf {
    use xxhash_rust::xxh3::xxh3_64;
    let v = format!("{etag}\0{}", version.unwrap_or(""));
    root.join(format!(
        "{:016x}-{:016x}",
        xxh3_64(url.as_bytes()),
        xxh3_64(v.as_bytes())
    ))
}

/// The default cache root: `$LOOSEFS_CACHE_DIR/blocks`, else `~/.cache/loosefs/blocks`.
pub fn default_root() -> PathBuf {
    std::env::var_os("LOOSEFS_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/loosefs")))
        .unwrap_or_else(|| PathBuf::from("/var/cache/loosefs"))
        .join("blocks")
}

fn entry_bytes(crc: u32, len: u32) -> [u8; ENTRY as usize] {
    let mut e = [0u8; ENTRY as usize];
    e[..4].copy_from_slice(MAGIC);
    e[4..8].copy_from_slice(&crc.to_le_bytes());
    e[8..12].copy_from_slice(&len.to_le_bytes());
    let c = crc32c::crc32c(&e[..12]);
    e[12..].copy_from_slice(&c.to_le_bytes());
    e
}

fn parse_entry(e: &[u8]) -> Option<(u32, u32)> {
    let ok = e.len() == ENTRY as usize
        && &e[..4] == MAGIC
        && crc32c::crc32c(&e[..12]).to_le_bytes() == e[12..16];
    ok.then(|| {
        (
            u32::from_le_bytes(e[4..8].try_into().unwrap()),
            u32::from_le_bytes(e[8..12].try_into().unwrap()),
        )
    })
}

impl RemoteStorage {
    /// The storage of the opened object of `client` (see [`ObjectClient::open_tail`]) with
    /// its block cache in `dir`, locked by `lock` (blocks of an earlier mount are kept),
    /// holding at most `limit` bytes of blocks.
    ///
    /// Errors: the directory cannot be written.
    pub fn open(
        client: Arc<ObjectClient>,
        dir: &Path,
        limit: u64,
        lock: DirLock,
    ) -> io::Result<RemoteStorage> {
        let pin = client
            .pin()
            .cloned()
            .ok_or_else(|| io::Error::other("remote object not opened"))?;
        let lock = lock.0;
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.join(name))
        };
        let data = open("data")?;
        let table = open("blocks")?;
        let len = pin.size;
        let nblocks = len.div_ceil(BLOCK) as usize;
        if data.metadata()?.len() != len {
            data.set_len(len)?;
        }
        let mut raw = vec![0u8; nblocks * ENTRY as usize];
        let have = table.metadata()?.len() as usize;
        if have > 0 {
            let n = have.min(raw.len());
            table.read_exact_at(&mut raw[..n], 0)?;
        }
        if have != raw.len() {
            table.set_len(raw.len() as u64)?;
        }
        let state: Vec<AtomicU8> = (0..nblocks).map(|_| AtomicU8::new(MISSING)).collect();
        let crc: Vec<AtomicU32> = (0..nblocks).map(|_| AtomicU32::new(0)).collect();
        // After a clean close every entry's block is on disk: trusted as is. Otherwise (a
        // crash, a kill) each is checked before first use. The marker goes before serving, so a
        // crash of this mount leaves none.
        let clean = dir.join(CLEAN);
        let trusted = clean.exists();
        if trusted {
            std::fs::remove_file(&clean)?;
            File::open(dir)?.sync_all()?;
        }
        let kept = if trusted { PRESENT } else { UNCHECKED };
        let mut used = 0;
        for (b, e) in raw.chunks(ENTRY as usize).enumerate() {
            if let Some((c, l)) = parse_entry(e)
                && u64::from(l) == BLOCK.min(len - b as u64 * BLOCK)
            {
                state[b].store(kept, Relaxed);
                crc[b].store(c, Relaxed);
                used += 1;
            }
        }
        let meta = serde_json::json!({
            "url": client.url(), "etag": pin.etag, "version": pin.version,
            "size": len, "block": BLOCK,
        });
        let _ = std::fs::write(dir.join("object.json"), meta.to_string());
        // SAFETY: a read-only shared map of the cache file, which only this process writes
        // (the directory is locked); bytes of a block are read only once it is complete.
        let map = unsafe { memmap2::Mmap::map(&data)? };
        let local = LocalStorage::new(vec![LocalObject::new(data.try_clone()?, Arc::new(map))]);
        let s = Cache {
            client,
            len,
            data,
            table,
            local,
            state,
            crc,
            referenced: (0..nblocks).map(|_| AtomicBool::new(false)).collect(),
            readers: (0..nblocks).map(|_| AtomicU32::new(0)).collect(),
            pinned: (0..nblocks).map(|_| AtomicBool::new(false)).collect(),
            hand: Mutex::new(0),
            used: AtomicU64::new(used),
            limit: limit.max(MIN_CACHE) / BLOCK,
            generation: AtomicU64::new(0),
            refetching: Mutex::new(()),
            closed: std::sync::RwLock::new(false),
            writers: Mutex::new(Vec::new()),
            fetch_log: crate::stats::LogLimit::default(),
            wait: (Mutex::new(()), Condvar::new()),
            fetched: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            damaged: AtomicU64::new(0),
            dir: dir.to_path_buf(),
            _lock: lock,
        };
        // A smaller cache size than last time: evict down to it now.
        while s.used.load(Relaxed) > s.limit {
            if !s.evict_one() {
                break;
            }
        }
        Ok(RemoteStorage { c: Arc::new(s) })
    }

    /// The object's client.
    pub fn client(&self) -> &Arc<ObjectClient> {
        &self.c.client
    }

    /// Bytes of blocks cached now.
    pub fn cached_bytes(&self) -> u64 {
        self.c.used.load(Relaxed) * BLOCK
    }

    /// The cache size limit, bytes.
    pub fn limit(&self) -> u64 {
        self.c.limit()
    }

    /// Keeps `w` (a thread writing into the cache directory) to be joined before the cache
    /// closes.
    pub fn join_on_close(&self, w: std::thread::JoinHandle<()>) {
        if let Ok(mut v) = self.c.writers.lock() {
            v.push(w);
        }
    }

    /// Waits for the threads given to [`RemoteStorage::join_on_close`].
    pub fn join_writers(&self) {
        let ws = self.c.writers.lock().map(|mut v| std::mem::take(&mut *v));
        for w in ws.unwrap_or_default() {
            let _ = w.join();
        }
    }

    /// Blocks fetched, evicted, and found damaged (CRC-32C mismatch) since opened.
    pub fn counters(&self) -> (u64, u64, u64) {
        (
            self.c.fetched.load(Relaxed),
            self.c.evicted.load(Relaxed),
            self.c.damaged.load(Relaxed),
        )
    }
}

impl Cache {
    fn limit(&self) -> u64 {
        self.limit * BLOCK
    }

    fn blocks(&self, r: &Range<u64>) -> Range<usize> {
        let end = r.end.min(self.len);
        if end <= r.start {
            return 0..0;
        }
        (r.start / BLOCK) as usize..end.div_ceil(BLOCK) as usize
    }

    fn block_range(&self, b: usize) -> Range<u64> {
        let s = b as u64 * BLOCK;
        s..(s + BLOCK).min(self.len)
    }

    /// Claims the missing blocks of `blocks` for fetching by this caller; returns them as
    /// runs of adjacent blocks of at most [`MERGE`] bytes.
    fn claim(&self, blocks: Range<usize>) -> Vec<Range<usize>> {
        let mut runs: Vec<Range<usize>> = Vec::new();
        let per = (MERGE / BLOCK) as usize;
        for b in blocks {
            if self.state[b]
                .compare_exchange(MISSING, FETCHING, SeqCst, SeqCst)
                .is_ok()
            {
                match runs.last_mut() {
                    Some(r) if r.end == b && r.len() < per => r.end = b + 1,
                    _ => runs.push(b..b + 1),
                }
            }
        }
        runs
    }

    /// Fetches the claimed run `run` and stores it; on failure the blocks go back to missing.
    async fn fetch(&self, run: Range<usize>) -> io::Result<()> {
        let r = self.block_range(run.start).start..self.block_range(run.end - 1).end;
        let res = match self.client.get(r.clone()).await {
            Ok(bytes) => self.store(run.clone(), &bytes),
            Err(e) => Err(e),
        };
        if res.is_err() {
            // Blocks stored before the failure stay; the others go back to missing.
            for b in run {
                let _ = self.state[b].compare_exchange(FETCHING, MISSING, SeqCst, SeqCst);
            }
        }
        let _g = self.wait.0.lock();
        self.wait.1.notify_all();
        res
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
        let start = self.block_range(run.start).start;
        for b in run {
            let br = self.block_range(b);
            let chunk = &bytes[(br.start - start) as usize..(br.end - start) as usize];
            self.make_room();
            self.data.write_all_at(chunk, br.start)?;
            let c = crc32c::crc32c(chunk);
            self.table
                .write_all_at(&entry_bytes(c, chunk.len() as u32), b as u64 * ENTRY)?;
            self.crc[b].store(c, Relaxed);
            self.referenced[b].store(true, Relaxed);
            self.state[b].store(PRESENT, SeqCst);
            self.used.fetch_add(1, Relaxed);
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

    /// Evicts blocks until one more fits (CLOCK). A cache whose every block is pinned or
    /// being read grows past its limit by the blocks in flight.
    fn make_room(&self) {
        while self.used.load(Relaxed) >= self.limit {
            if !self.evict_one() {
                return;
            }
        }
    }

    /// Evicts one block chosen by CLOCK; false if none can be (after two sweeps).
    fn evict_one(&self) -> bool {
        let n = self.state.len();
        if n == 0 {
            return false;
        }
        let Ok(mut hand) = self.hand.lock() else {
            return false;
        };
        for _ in 0..2 * n {
            let b = *hand;
            *hand = (*hand + 1) % n;
            let s = self.state[b].load(SeqCst);
            if (s != PRESENT && s != UNCHECKED) || self.pinned[b].load(Relaxed) {
                continue;
            }
            if self.referenced[b].swap(false, Relaxed) {
                continue;
            }
            if self.drop_block(b, s) {
                return true;
            }
        }
        false
    }

    /// Drops block `b` (in state `s`) from the cache unless it is being read.
    fn drop_block(&self, b: usize, s: u8) -> bool {
        if self.state[b]
            .compare_exchange(s, EVICTING, SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
        if self.readers[b].load(SeqCst) > 0 {
            self.state[b].store(s, SeqCst);
            return false;
        }
        self.generation.fetch_add(1, SeqCst);
        let _ = self
            .table
            .write_all_at(&[0u8; ENTRY as usize], b as u64 * ENTRY);
        let r = self.block_range(b);
        let _ = nix::fcntl::fallocate(
            &self.data,
            nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            r.start as i64,
            (r.end - r.start) as i64,
        );
        self.used.fetch_sub(1, Relaxed);
        self.evicted.fetch_add(1, Relaxed);
        self.state[b].store(MISSING, SeqCst);
        true
    }

    /// Makes every block of `r` present, fetching what is missing (waiting for fetches of
    /// others), and marks them as being read so none is evicted until [`Self::unhold`].
    fn hold(&self, r: &Range<u64>) -> io::Result<Range<usize>> {
        let blocks = self.blocks(r);
        // Held first: a block fetched here cannot be evicted before it is read.
        for b in blocks.clone() {
            self.readers[b].fetch_add(1, SeqCst);
        }
        let res = self.hold_held(&blocks);
        if res.is_err() {
            self.unhold(blocks.clone());
        }
        res.map(|()| blocks)
    }

    fn hold_held(&self, blocks: &Range<usize>) -> io::Result<()> {
        for _ in 0..3 {
            let runs = self.claim(blocks.clone());
            if !runs.is_empty() {
                let results = self.client.runtime().block_on(futures::future::join_all(
                    runs.into_iter().map(|run| self.fetch(run)),
                ));
                for res in results {
                    res?;
                }
            }
            // Wait for blocks others are fetching; one whose fetch failed is claimed again.
            let mut missing = false;
            for b in blocks.clone() {
                // The lock is taken only for a block being fetched (a read of present blocks,
                // the common case, takes none).
                if self.state[b].load(SeqCst) == FETCHING {
                    let mut g = self
                        .wait
                        .0
                        .lock()
                        .map_err(|_| io::Error::other("poisoned"))?;
                    while self.state[b].load(SeqCst) == FETCHING {
                        g = self
                            .wait
                            .1
                            .wait_timeout(g, std::time::Duration::from_millis(50))
                            .map_err(|_| io::Error::other("poisoned"))?
                            .0;
                    }
                }
                let s = self.state[b].load(SeqCst);
                missing |= s != PRESENT && s != UNCHECKED;
            }
            if !missing {
                self.check_unchecked(blocks.clone())?;
                // A damaged block may be being fetched again by another reader: wait for it.
                if blocks
                    .clone()
                    .all(|b| self.state[b].load(SeqCst) == PRESENT)
                {
                    return Ok(());
                }
            }
        }
        Err(io::Error::other(format!(
            "{}: blocks {}..{} could not be fetched (three fetches by other readers failed)",
            self.client.url(),
            blocks.start,
            blocks.end
        )))
    }

    /// Fetches the blocks of `r` again and writes them over the cached ones, unless another
    /// reader did so since generation `seen`. Bumps the generation: every sample is checked
    /// again.
    fn refetch(&self, r: &Range<u64>, seen: u64) -> io::Result<()> {
        let Ok(_g) = self.refetching.lock() else {
            return Err(io::Error::other("poisoned"));
        };
        if self
            .generation
            .compare_exchange(seen, seen + 1, SeqCst, SeqCst)
            .is_err()
        {
            return Ok(());
        }
        let blocks = self.blocks(r);
        let whole = self.block_range(blocks.start).start..self.block_range(blocks.end - 1).end;
        let bytes = self.client.get_blocking(whole.clone())?;
        for b in blocks {
            let br = self.block_range(b);
            let chunk = &bytes[(br.start - whole.start) as usize..(br.end - whole.start) as usize];
            self.data.write_all_at(chunk, br.start)?;
            let c = crc32c::crc32c(chunk);
            self.table
                .write_all_at(&entry_bytes(c, chunk.len() as u32), b as u64 * ENTRY)?;
            self.crc[b].store(c, Relaxed);
        }
        Ok(())
    }

    fn unhold(&self, blocks: Range<usize>) {
        for b in blocks {
            self.referenced[b].store(true, Relaxed);
            self.readers[b].fetch_sub(1, SeqCst);
        }
    }

    /// Checks blocks kept from an earlier mount against their CRC before first use; a damaged
    /// one is fetched again.
    fn check_unchecked(&self, blocks: Range<usize>) -> io::Result<()> {
        for b in blocks {
            if self.state[b].load(SeqCst) != UNCHECKED {
                continue;
            }
            let r = self.block_range(b);
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            self.data.read_exact_at(&mut buf, r.start)?;
            if crc32c::crc32c(&buf) == self.crc[b].load(Relaxed) {
                let _ = self.state[b].compare_exchange(UNCHECKED, PRESENT, SeqCst, SeqCst);
                continue;
            }
            log::warn!(
                "{}: cached block {b} is damaged (CRC-32C mismatch); fetching it again",
                self.client.url()
            );
            self.damaged.fetch_add(1, Relaxed);
            if self.state[b]
                .compare_exchange(UNCHECKED, FETCHING, SeqCst, SeqCst)
                .is_ok()
            {
                self.used.fetch_sub(1, Relaxed);
                self.client.runtime().block_on(self.fetch(b..b + 1))?;
            }
        }
        Ok(())
    }

    /// Fetches every missing block of the whole object, `parallel` GETs of [`MERGE`] at a
    /// time, waiting for them (the download of `--warm` and `pin`).
    fn fetch_all(&self, r: &Range<u64>) -> io::Result<()> {
        let runs = self.claim(self.blocks(r));
        let results = self.client.runtime().block_on(futures::future::join_all(
            runs.into_iter().map(|run| self.fetch(run)),
        ));
        results.into_iter().collect::<io::Result<Vec<()>>>()?;
        Ok(())
    }
}

impl Storage for RemoteStorage {
    fn len(&self, obj: ObjectId) -> u64 {
        if obj == 0 { self.c.len } else { 0 }
    }

    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if obj != 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such object"));
        }
        let end = off + buf.len() as u64;
        if end > self.c.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "bytes {off}..{end} past the end of the object ({})",
                    self.c.len
                ),
            ));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let held = self.c.hold(&(off..end))?;
        let res = self.c.data.read_exact_at(buf, off);
        self.c.unhold(held);
        res
    }

    fn will_need(&self, obj: ObjectId, r: &Range<u64>) {
        if obj != 0 {
            return;
        }
        let blocks = self.c.blocks(r);
        let runs = self.c.claim(blocks.clone());
        if runs.is_empty() {
            // Kept from an earlier mount: check them ahead of the reader, once the kernel
            // has been asked for their pages (large asynchronous reads, as for a local pack).
            if blocks
                .clone()
                .any(|b| self.c.state[b].load(Relaxed) == UNCHECKED)
            {
                let whole =
                    self.c.block_range(blocks.start).start..self.c.block_range(blocks.end - 1).end;
                self.c.local.will_need(0, &whole);
                let me = self.c.clone();
                self.c.client.runtime().spawn_blocking(move || {
                    if let Err(e) = me.check_unchecked(blocks) {
                        log::warn!("checking cached blocks failed: {e}");
                    }
                });
            } else {
                self.c.local.will_need(0, r);
            }
            return;
        }
        for run in runs {
            let me = self.c.clone();
            self.c.client.runtime().spawn(async move {
                if let Err(e) = me.fetch(run).await {
                    me.fetch_log.log(|| format!("read-ahead fetch failed: {e}"));
                }
            });
        }
    }

    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64 {
        if obj != 0 {
            return 0;
        }
        self.c.local.resident_bytes(0, r)
    }

    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        obj == 0
            && self
                .c
                .blocks(r)
                .all(|b| matches!(self.c.state[b].load(Relaxed), PRESENT | UNCHECKED))
            && self.c.local.resident(0, r)
    }

    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        self.c.local.release(obj, r)
    }

    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        for b in self.c.blocks(r) {
            let br = self.c.block_range(b);
            let whole = br.start >= r.start && br.end <= r.end;
            let s = self.c.state[b].load(SeqCst);
            if whole && (s == PRESENT || s == UNCHECKED) && !self.c.pinned[b].load(Relaxed) {
                self.c.drop_block(b, s);
            }
        }
        self.c.local.evict(obj, r)
    }

    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        let blocks = self.c.blocks(r);
        if blocks.len() as u64 > self.c.limit {
            return Err(io::Error::other(format!(
                "cannot pin {} bytes: the block cache holds at most {} (--cache-size)",
                r.end - r.start,
                self.c.limit()
            )));
        }
        for b in blocks.clone() {
            self.c.pinned[b].store(true, Relaxed);
        }
        self.c.fetch_all(r)?;
        let held = self.c.hold(r)?;
        self.c.unhold(held);
        self.c.local.pin(obj, r)
    }

    fn generation(&self) -> u64 {
        self.c.generation.load(SeqCst)
    }

    fn refetch(&self, obj: ObjectId, r: &Range<u64>, seen: u64) -> bool {
        if obj != 0 || r.is_empty() {
            return false;
        }
        match self.c.refetch(r, seen) {
            Ok(()) => true,
            Err(e) => {
                log::error!("fetching bytes {}..{} again failed: {e}", r.start, r.end);
                false
            }
        }
    }

    fn close(&self) {
        self.join_writers();
        if let Err(e) = self.c.close() {
            log::warn!(
                "block cache {}: cannot close cleanly ({e}); its blocks will be checked at the next mount",
                self.c.dir.display()
            );
        }
    }

    fn remote_report(&self) -> Option<crate::report::RemoteReport> {
        let c = &self.c;
        let st = &c.client.stats;
        Some(crate::report::RemoteReport {
            url: c.client.url().to_string(),
            etag: c.client.pin().map(|p| p.etag.clone()).unwrap_or_default(),
            gets: st.gets.load(Relaxed),
            bytes_received: st.bytes.load(Relaxed),
            failed_gets: st.failed.load(Relaxed),
            blocks_fetched: c.fetched.load(Relaxed),
            blocks_evicted: c.evicted.load(Relaxed),
            blocks_damaged: c.damaged.load(Relaxed),
            cached_bytes: c.used.load(Relaxed) * BLOCK,
            cache_limit_bytes: c.limit(),
            cache_dir: c.dir.display().to_string(),
        })
    }

    fn warm_ahead(&self) -> u64 {
        // Enough merged GETs to fill every request slot.
        MERGE * self.c.client.max_requests() as u64
    }

    fn warm_budget(&self) -> Option<u64> {
        Some(self.c.limit())
    }
}

impl Cache {
    /// Stops storing blocks, makes every stored block and entry durable, then leaves the
    /// clean marker (itself made durable) that lets the next mount trust the table.
    fn close(&self) -> io::Result<()> {
        let mut closed = self
            .closed
            .write()
            .map_err(|_| io::Error::other("poisoned"))?;
        if *closed {
            return Ok(());
        }
        *closed = true;
        self.data.sync_data()?;
        self.table.sync_data()?;
        File::create(self.dir.join(CLEAN))?.sync_all()?;
        File::open(&self.dir)?.sync_all()
    }
}

/// Bytes `dir`'s files hold on disk (sparse blocks not counted).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// The budget of the whole cache root and this object's share of it, bytes: `asked`
/// (`--cache-size`) or, by default, what the root already holds plus the file system's free
/// space less 5% of its size (mountpoint-s3's default floor); the object's share is that, at
/// most its own size.
pub fn cache_budget(root: &Path, len: u64, asked: Option<u64>) -> (u64, u64) {
    let budget = asked.unwrap_or_else(|| {
        let held: u64 = std::fs::read_dir(root)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| disk_bytes(&e.path()))
                    .sum()
            })
            .unwrap_or(0);
        nix::sys::statvfs::statvfs(root)
            .map(|s| {
                let free = s.blocks_available() * s.fragment_size();
                let total = s.blocks() * s.fragment_size();
                (free + held).saturating_sub(total / 20)
            })
            .unwrap_or(u64::MAX)
    });
    let share = len.div_ceil(BLOCK).saturating_mul(BLOCK).min(budget);
    (budget, share)
}

/// Keeps the cache root within `budget` bytes once the object cached in `keep` holds its
/// `share`: other objects' directories (other URLs, or older versions of this one) that no
/// mount holds are removed, least recently used first (their block table's mtime), until the
/// rest fits beside the share. Failures are logged and skipped.
pub fn prune(root: &Path, keep: &Path, budget: u64, share: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    let mut others: Vec<(i64, PathBuf, u64)> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p != keep)
        .map(|p| {
            let t = std::fs::metadata(p.join("blocks")).map_or(0, |m| m.mtime());
            let b = disk_bytes(&p);
            (t, p, b)
        })
        .collect();
    let mut total: u64 = others.iter().map(|o| o.2).sum();
    others.sort();
    for (_, p, bytes) in others {
        if total.saturating_add(share) <= budget {
            break;
        }
        // A directory locked by a live mount stays (one just unmounted may take a moment to
        // let go).
        let Ok(mut lock) = File::open(p.join("lock")) else {
            continue;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let _l = loop {
            match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(l) => break Some(l),
                Err((f, _)) if std::time::Instant::now() < deadline => {
                    lock = f;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(_) => break None,
            }
        };
        if _l.is_none() {
            continue;
        }
        match std::fs::remove_dir_all(&p) {
            Ok(()) => {
                log::info!("block cache: removed {} ({bytes} bytes)", p.display());
                total -= bytes;
            }
            Err(e) => log::warn!("block cache: cannot remove {}: {e}", p.display()),
        }
    }
}
