//! The daemon's filesystem logic: the [`Namespace`] plus the services around the read path —
//! statistics, read-ahead in pack order, page-cache residency checks, pinning, whole-pack warm,
//! decoded views ([`crate::decode`]) and the hidden control directory. Free of FUSE types: the adaptor in [`crate::fuse`] only
//! translates, and tests can drive a `Server` directly.

use crate::control::{self, Snapshots};
use crate::decode::{DecodeOptions, Decoder};
use crate::format::index::Kind;
use crate::namespace::{Attr, DirEntry, FsError, FsStats, Namespace, ROOT_INO};
use crate::pagecache::{self, Pinner, Prefetchd};
use crate::prefetch::Prefetcher;
use crate::stats::{Op, Stats};
use crate::warm::Warmer;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How the daemon serves, from `loosefs mount` options.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest read-ahead window in pack order, bytes (0 disables).
    pub prefetch_max: u64,
    /// Bytes of the pack to pin (mlock), from the start; `Some(u64::MAX)` for all.
    pub pin: Option<u64>,
    /// Start a whole-pack warm at mount.
    pub warm: bool,
    /// Keep a sample's pack pages cached after serving it (default: drop them, since the
    /// mount's page cache now holds the same bytes).
    pub keep_pack_cache: bool,
    /// Mountpoint (for stats).
    pub mountpoint: String,
    /// FUSE threads (for stats).
    pub threads: usize,
    /// Decode pool and cache, used when the namespace serves decoded views.
    pub decode: DecodeOptions,
}

/// Largest read buffer a FUSE thread keeps between requests, bytes (a FUSE read is at most
/// 1 MiB with the default `max_pages`).
const MAX_KEPT_BUF: usize = 1 << 20;

thread_local! {
    /// Per-thread read buffer: at most one request (or one check chunk) per FUSE thread.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Callback that puts a file's whole content into the kernel's page cache for its inode.
pub type Store = Box<dyn Fn(u64, &[u8]) -> std::io::Result<()> + Send + Sync>;

/// Samples larger than this are not pushed ahead (the kernel's own read-ahead does well on
/// them), bytes.
const MAX_PUSH_SAMPLE: u64 = 1 << 20;
/// Bytes pushed per run at most.
const PUSH_BYTES: u64 = 16 << 20;

/// Callback that drops the kernel's cached pages of one inode of the mount.
pub type Invalidate = Box<dyn Fn(u64) + Send + Sync>;

/// A pack being served.
pub struct Server {
    ns: Arc<Namespace>,
    decoder: Option<Decoder>,
    /// Counters and latency histograms.
    pub stats: Stats,
    prefetch: Prefetcher,
    prefetchd: Prefetchd,
    warm: Arc<Warmer>,
    pin: Arc<Pinner>,
    snaps: Snapshots,
    opts: ServerOptions,
    started: Instant,
    invalidate: OnceLock<Invalidate>,
    pusher: OnceLock<std::sync::mpsc::SyncSender<u64>>,
    /// One bit per record: pushed into the kernel's cache since the last drop-cache.
    pushed: Vec<std::sync::atomic::AtomicU64>,
}

impl Server {
    /// Serves `ns`. Starts pinning and warming when asked (the caller has checked the pin budget).
    pub fn new(ns: Namespace, opts: ServerOptions) -> Server {
        let data_end = ns.pack().totals().data_end;
        let records = ns.pack().totals().records;
        pagecache::random_access(ns.pack().map());
        let ns = Arc::new(ns);
        let pin: Arc<Pinner> = Arc::default();
        let decoder = ns.views().any().then(|| {
            let (ns2, pin2, keep) = (ns.clone(), pin.clone(), opts.keep_pack_cache);
            let release = Box::new(move |r: &std::ops::Range<u64>| {
                release_pack_pages(&ns2, &pin2, keep, r);
            });
            Decoder::new(ns.clone(), opts.decode, release)
                .inspect_err(|e| log::error!("cannot start the decode threads: {e}"))
                .ok()
        });
        let s = Server {
            prefetch: Prefetcher::new(data_end, opts.prefetch_max),
            prefetchd: Prefetchd::start(ns.pack().map_arc()),
            ns,
            decoder: decoder.flatten(),
            stats: Stats::default(),
            warm: Arc::default(),
            pin,
            snaps: Snapshots::default(),
            opts,
            started: Instant::now(),
            invalidate: OnceLock::new(),
            pusher: OnceLock::new(),
            pushed: std::iter::repeat_with(|| std::sync::atomic::AtomicU64::new(0))
                .take((records as usize).div_ceil(64))
                .collect(),
        };
        if let Some(bytes) = s.opts.pin {
            s.pin
                .start(s.ns.pack().map_arc(), bytes.min(s.ns.pack().file_len()));
        }
        if s.opts.warm {
            s.start_warm();
        }
        s
    }

    /// Installs the kernel page-cache invalidation used by `drop-cache`.
    pub fn set_invalidate(&self, f: Invalidate) {
        let _ = self.invalidate.set(f);
    }

    /// The namespace served.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    fn control_dir_attr() -> Attr {
        Attr {
            ino: control::DIR_INO,
            size: 4096,
            blocks: 8,
            mtime_sec: 0,
            mtime_nsec: 0,
            kind: Kind::Dir,
            perm: 0o555,
            nlink: 1,
            blksize: 4096,
        }
    }

    fn control_file_attr(ino: u64, size: u64) -> Attr {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            mtime_sec: now,
            mtime_nsec: 0,
            kind: Kind::File,
            perm: 0o444,
            nlink: 1,
            blksize: 4096,
        }
    }

    /// Looks up `name` in `parent`. The flag is true for volatile entries (control files) that
    /// the kernel must not cache.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<(Attr, bool), FsError> {
        let t0 = Instant::now();
        let r = if parent == ROOT_INO && name == control::DIR_NAME {
            Ok((Self::control_dir_attr(), false))
        } else if parent == control::DIR_INO {
            let name = std::str::from_utf8(name).map_err(|_| FsError::NotFound)?;
            let content = self.run_control(name).ok_or(FsError::NotFound)?;
            let size = content.len() as u64;
            let ino = self.snaps.insert(content);
            Ok((Self::control_file_attr(ino, size), true))
        } else if control::is_control(parent) {
            Err(FsError::NotDir)
        } else {
            self.ns.lookup(parent, name).map(|a| (a, false))
        };
        self.finish(Op::Lookup, t0, r)
    }

    /// Attributes of `ino`, with the volatile flag as for [`Server::lookup`].
    pub fn getattr(&self, ino: u64) -> Result<(Attr, bool), FsError> {
        let t0 = Instant::now();
        let r = if ino == control::DIR_INO {
            Ok((Self::control_dir_attr(), false))
        } else if control::is_control(ino) {
            let size = self.snaps.get(ino).map_or(0, |c| c.len() as u64);
            Ok((Self::control_file_attr(ino, size), true))
        } else {
            self.ns.getattr(ino).map(|a| (a, false))
        };
        self.finish(Op::Getattr, t0, r)
    }

    /// Attributes of an entry being listed by READDIRPLUS (not counted as a request).
    pub fn listing_attr(&self, ino: u64) -> Result<Attr, FsError> {
        if control::is_control(ino) {
            let size = self.snaps.get(ino).map_or(0, |c| c.len() as u64);
            return Ok(if ino == control::DIR_INO {
                Self::control_dir_attr()
            } else {
                Self::control_file_attr(ino, size)
            });
        }
        self.ns.getattr(ino)
    }

    /// Lists directory `ino` from `offset`, calling `add` per entry until it returns true (full).
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), FsError> {
        let t0 = Instant::now();
        let r = if ino == control::DIR_INO {
            let mut entries = vec![
                DirEntry {
                    ino,
                    next_offset: 1,
                    kind: Kind::Dir,
                    name: b"."[..].into(),
                },
                DirEntry {
                    ino: ROOT_INO,
                    next_offset: 2,
                    kind: Kind::Dir,
                    name: b".."[..].into(),
                },
            ];
            for (k, n) in control::LISTED.iter().enumerate() {
                entries.push(DirEntry {
                    ino: control::listed_ino(k),
                    next_offset: k as u64 + 3,
                    kind: Kind::File,
                    name: n.as_bytes().into(),
                });
            }
            for e in entries.into_iter().skip(offset as usize) {
                if add(e) {
                    break;
                }
            }
            Ok(())
        } else if control::is_control(ino) {
            Err(FsError::NotDir)
        } else {
            self.ns.readdir(ino, offset).map(|entries| {
                for e in entries {
                    if add(e) {
                        break;
                    }
                }
            })
        };
        self.finish(Op::Readdir, t0, r)
    }

    /// Reads up to `size` bytes of `ino` at `offset` and hands them to `reply`: before
    /// returning, or later from a decode thread for a decoded view not yet decoded.
    pub fn read(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        reply: impl FnOnce(Result<&[u8], FsError>) + Send + 'static,
    ) {
        let t0 = Instant::now();
        if let Some(t) = self.ns.view(ino) {
            match &self.decoder {
                Some(d) => d.read(t, offset, size, Box::new(reply)),
                None => reply(Err(FsError::Corrupt(
                    "the decode threads are not running".into(),
                ))),
            }
            self.stats.done(Op::Read, t0);
            return;
        }
        if control::is_control(ino) {
            let content = self.snaps.get(ino);
            let out = match &content {
                Some(c) => {
                    let s = (offset as usize).min(c.len());
                    let e = (s + size as usize).min(c.len());
                    Ok(&c[s..e])
                }
                None => Err(FsError::NotFound),
            };
            reply(out);
            self.stats.done(Op::Control, t0);
            return;
        }
        let range = self.ns.data_range(ino);
        if let Some(range) = &range {
            if offset == 0 && self.is_pushed(ino) {
                // The kernel asked for a sample it was given: its cache was dropped
                // (drop_caches, memory pressure). Forget what was pushed so pushing resumes.
                self.pushed.iter().for_each(|w| w.store(0, Relaxed));
                self.stats.push_resets.fetch_add(1, Relaxed);
            }
            if self.before_read(range, offset, size) {
                self.push_after(ino);
            }
        }
        READ_BUF.with_borrow_mut(|buf| {
            let out = self.ns.read(ino, offset, size, buf);
            self.account(&out);
            if let (Ok(b), Some(range)) = (&out, &range) {
                if offset + b.len() as u64 >= range.end - range.start {
                    self.mark_pushed(ino); // now in the kernel's cache: nothing to push
                }
                self.after_read(range, offset..offset + b.len() as u64);
            }
            reply(out);
            // A check of a large sample may have grown the buffer; keep at most 1 MiB per thread.
            if buf.capacity() > MAX_KEPT_BUF {
                *buf = Vec::new();
            }
        });
        self.stats.done(Op::Read, t0);
    }

    fn account(&self, out: &Result<&[u8], FsError>) {
        match out {
            Ok(b) => {
                self.stats.bytes_served.fetch_add(b.len() as u64, Relaxed);
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Relaxed);
            }
        }
    }

    /// Once bytes `served` of the sample stored at pack bytes `range` have been served, their
    /// pack pages are dropped (unless pinned or `--keep-pack-cache`): the kernel now holds them
    /// in the mount's own page cache, and keeping the pack's copy too would cache every sample
    /// twice. Each READ drops only what it served: the kernel sends the READs of one file
    /// concurrently, and dropping the whole sample when its last chunk is served could drop
    /// pages an earlier chunk's READ has not read yet.
    fn after_read(&self, range: &std::ops::Range<u64>, served: std::ops::Range<u64>) {
        let r = range.start + served.start..range.start + served.end;
        if release_pack_pages(&self.ns, &self.pin, self.opts.keep_pack_cache, &r)
            && r.end >= range.end
        {
            self.stats.samples_evicted.fetch_add(1, Relaxed);
        }
    }

    /// Residency accounting and read-ahead for a read of `[offset, offset+size)` of the sample
    /// stored at pack bytes `range`. Only the first read of a sample (offset 0) counts for the
    /// streams, as a read of the whole sample: the kernel reads ahead inside a file itself, and
    /// the several READs of one large sample are not a walk through the pack.
    /// Returns true when the read continues an established stream (it falls in read-ahead the
    /// stream already issued: at least the third sample in a row).
    fn before_read(&self, range: &std::ops::Range<u64>, offset: u64, size: u32) -> bool {
        let s = range.start + offset.min(range.end - range.start);
        let e = s.saturating_add(u64::from(size)).min(range.end);
        if s >= e {
            return false;
        }
        let map = self.ns.pack().map();
        if pagecache::resident(map, &(s..e)) {
            self.stats.page_cache_hits.fetch_add(1, Relaxed);
        } else {
            self.stats.page_cache_misses.fetch_add(1, Relaxed);
            // One batch of I/O for the rest of the sample instead of page-by-page faults.
            pagecache::will_need(map, &(s..range.end));
        }
        if offset != 0 {
            return false;
        }
        self.walk(range)
    }

    /// Feeds a whole-sample read (or push) of pack bytes `range` to the stream detector and
    /// issues the read-ahead it advises. Returns true when it continues an established stream.
    fn walk(&self, range: &std::ops::Range<u64>) -> bool {
        let advice = self.prefetch.on_read(range.start, range.end);
        if advice.hit {
            self.stats.prefetch_hits.fetch_add(1, Relaxed);
        }
        if let Some(r) = advice.prefetch {
            self.prefetchd.request(r.clone());
            self.stats.prefetch_requests.fetch_add(1, Relaxed);
            self.stats
                .prefetch_bytes
                .fetch_add(r.end - r.start, Relaxed);
        }
        advice.hit
    }

    /// Starts the push-ahead thread: while a reader walks the pack in order, the samples after
    /// the one it reads are pushed into the kernel's page cache of their inodes (`store`, i.e.
    /// FUSE_NOTIFY_STORE), so its next opens and reads are served by the kernel with no round
    /// trip to the daemon. Up to `files` samples ahead (0 disables).
    pub fn start_push(self: &Arc<Self>, files: usize, store: Store) {
        if files == 0 {
            return;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(64);
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("loosefs-push".into())
            .spawn(move || {
                let mut buf = Vec::new();
                for ino in rx {
                    let Some(server) = weak.upgrade() else { break };
                    server.push_run(ino, files, &store, &mut buf);
                }
            });
        if spawned.is_ok() {
            let _ = self.pusher.set(tx);
        }
    }

    fn is_pushed(&self, ino: u64) -> bool {
        let i = (ino - 1) as usize;
        self.pushed
            .get(i / 64)
            .is_some_and(|w| w.load(Relaxed) & (1u64 << (i % 64)) != 0)
    }

    /// Marks `ino` as being in the kernel's cache; returns true if it already was.
    fn mark_pushed(&self, ino: u64) -> bool {
        let i = (ino - 1) as usize;
        let bit = 1u64 << (i % 64);
        self.pushed
            .get(i / 64)
            .is_none_or(|w| w.fetch_or(bit, Relaxed) & bit != 0)
    }

    fn push_after(&self, ino: u64) {
        if let Some(tx) = self.pusher.get() {
            let _ = tx.try_send(ino); // a full queue means the pusher is busy: skip
        }
    }

    /// Pushes up to `files` samples following `ino` in pack order (at most [`PUSH_BYTES`]).
    fn push_run(&self, ino: u64, files: usize, store: &Store, buf: &mut Vec<u8>) {
        self.push_samples(ino, files, store, buf);
        // A check of a large sample may have grown the buffer; keep at most MAX_KEPT_BUF.
        if buf.capacity() > MAX_KEPT_BUF {
            *buf = Vec::new();
        }
    }

    fn push_samples(&self, ino: u64, files: usize, store: &Store, buf: &mut Vec<u8>) {
        let (mut cur, mut bytes) = (ino, 0u64);
        for _ in 0..files {
            let Some(next) = self.ns.next_file(cur) else {
                return;
            };
            cur = next;
            let Some(range) = self.ns.data_range(next) else {
                continue;
            };
            // A sample in the kernel's cache is never READ by the reader: the stream moves past
            // it here, so the reader's next READ still continues the stream.
            if self.is_pushed(next) {
                self.prefetch.skip(&range);
                continue;
            }
            if self.ns.view(next).is_some() {
                continue; // its inode serves decoded pixels, not these bytes
            }
            let len = range.end - range.start;
            if len > MAX_PUSH_SAMPLE {
                continue;
            }
            match self.ns.read(next, 0, len as u32, buf) {
                Ok(data) => {
                    // Marked only once stored: a READ of a marked sample then means the
                    // kernel dropped it (see `read`), not that it raced the store.
                    if store(next, data).is_ok() {
                        self.mark_pushed(next);
                        self.prefetch.skip(&range);
                        self.stats.pushed_samples.fetch_add(1, Relaxed);
                        self.stats.pushed_bytes.fetch_add(len, Relaxed);
                    }
                }
                Err(e) => log::error!("push {}: {e}", self.ns.path_of(next)),
            }
            self.after_read(&range, 0..len);
            bytes += len;
            if bytes >= PUSH_BYTES {
                return;
            }
        }
    }

    /// `statfs` figures.
    pub fn statfs(&self) -> FsStats {
        let t0 = Instant::now();
        let s = self.ns.statfs();
        self.stats.done(Op::Statfs, t0);
        s
    }

    /// Counts an ioctl (answered ENOTTY by the adaptor).
    pub fn ioctl(&self) {
        self.stats.done(Op::Ioctl, Instant::now());
    }

    /// The kernel forgot `ino`.
    pub fn forget(&self, ino: u64) {
        if control::is_control(ino) {
            self.snaps.forget(ino);
        }
    }

    fn finish<T>(&self, op: Op, t0: Instant, r: Result<T, FsError>) -> Result<T, FsError> {
        if matches!(r, Err(FsError::Corrupt(_))) {
            self.stats.errors.fetch_add(1, Relaxed);
        }
        self.stats.done(op, t0);
        r
    }

    /// Runs control file `name`, returning its content.
    fn run_control(&self, name: &str) -> Option<Vec<u8>> {
        let v = match name {
            "stats" => self.stats_json(),
            "warm" => {
                let started = self.start_warm();
                json!({ "started": started, "warm": self.warm.status() })
            }
            "drop-cache" => self.drop_cache(),
            _ => return None,
        };
        let mut out = serde_json::to_vec_pretty(&v).ok()?;
        out.push(b'\n');
        Some(out)
    }

    fn start_warm(&self) -> bool {
        let Ok(file) = self.ns.pack().file().try_clone() else {
            return false;
        };
        let budget = self.opts.pin.map(|p| p.min(self.ns.pack().file_len()));
        self.warm
            .start(file, self.ns.pack().totals().data_end, budget)
    }

    /// Empties the caches the daemon owns and evicts the pack's unpinned pages; drops the
    /// kernel's cached pages of every file served so far.
    pub fn drop_cache(&self) -> serde_json::Value {
        let pack = self.ns.pack();
        let all = 0..pack.file_len();
        let before = pagecache::resident_bytes(pack.map(), &all);
        // Pinned pages stay (that is what pinning is for); only the rest is evicted. Round the
        // pinned prefix up to a page: the pinning thread locks whole pages.
        let pinned = self.pin.pinned.load(Relaxed).div_ceil(4096) * 4096;
        let evicted = if pinned < pack.file_len() {
            pagecache::evict(pack.map(), pack.file(), &(pinned..pack.file_len()))
        } else {
            Ok(())
        };
        self.prefetch.reset();
        self.warm.reset();
        self.pushed.iter().for_each(|w| w.store(0, Relaxed));
        let views = self.decoder.as_ref().map(|d| d.clear()).unwrap_or_default();
        let mut invalidated = 0u64;
        if let Some(inv) = self.invalidate.get() {
            for ino in self.ns.served_inodes().chain(views) {
                inv(ino);
                invalidated += 1;
            }
        }
        let after = pagecache::resident_bytes(pack.map(), &all);
        json!({
            "pack_resident_bytes_before": before,
            "pack_resident_bytes_after": after,
            "pinned_bytes": self.pin.pinned.load(Relaxed),
            "inodes_invalidated": invalidated,
            "error": evicted.err().map(|e| e.to_string()),
        })
    }

    /// The statistics report (the content of `.loosefs/stats`).
    pub fn stats_json(&self) -> serde_json::Value {
        let s = &self.stats;
        let pack = self.ns.pack();
        let lat = s.latencies();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kb = |key: &str| -> u64 {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
                * 1024
        };
        json!({
            "pack": { "path": pack.path(), "bytes": pack.file_len(), "samples": pack.totals().files,
                       "resident_bytes": pagecache::resident_bytes(pack.map(), &(0..pack.file_len())) },
            "daemon": { "pid": std::process::id(), "uptime_s": self.started.elapsed().as_secs_f64(),
                         "rss_bytes": kb("VmRSS:"), "rss_peak_bytes": kb("VmHWM:"), "locked_bytes": kb("VmLck:"),
                         "threads": self.opts.threads, "mountpoint": self.opts.mountpoint },
            "requests": lat.iter().map(|(n, l)| (n.to_string(), json!(l.count))).collect::<serde_json::Map<_, _>>(),
            "errors": s.errors.load(Relaxed),
            "bytes_served": s.bytes_served.load(Relaxed),
            "page_cache": { "hits": s.page_cache_hits.load(Relaxed), "misses": s.page_cache_misses.load(Relaxed),
                             "samples_evicted_after_serving": s.samples_evicted.load(Relaxed),
                             "keep_pack_cache": self.opts.keep_pack_cache },
            "prefetch": { "max_window_bytes": self.opts.prefetch_max, "requests": s.prefetch_requests.load(Relaxed),
                           "bytes": s.prefetch_bytes.load(Relaxed), "hits": s.prefetch_hits.load(Relaxed) },
            "push_ahead": { "samples": s.pushed_samples.load(Relaxed), "bytes": s.pushed_bytes.load(Relaxed),
                             "resets": s.push_resets.load(Relaxed) },
            "pin": { "target_bytes": self.pin.target.load(Relaxed), "pinned_bytes": self.pin.pinned.load(Relaxed) },
            "warm": self.warm.status(),
            "decode": self.decoder.as_ref().map(|d| d.stats_json()),
            "latency_us": lat.iter().map(|(n, l)| (n.to_string(), json!(l))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

/// Drops the pack pages of a sample served in full (unless `keep` or pinned): the kernel now
/// holds its bytes in the mount's page cache, and keeping the pack's copy too would cache every
/// sample twice. Only whole pages inside the sample go. Returns true when pages were dropped.
fn release_pack_pages(
    ns: &Namespace,
    pin: &Pinner,
    keep: bool,
    range: &std::ops::Range<u64>,
) -> bool {
    if keep {
        return false;
    }
    let pinned = pin.pinned.load(Relaxed);
    if range.end <= pinned {
        return false;
    }
    let r = range.start.max(pinned)..range.end;
    let _ = pagecache::evict_unmapped(ns.pack().file(), &r);
    true
}
