//! Typed reports of the control files: the daemon fills them, `loosefs stats`, the bench and
//! the tests read them back with the same types (serde JSON), so no reader walks the JSON by
//! string paths. Field names are the JSON keys; sizes are bytes, times as their names say.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One cumulative histogram bucket: requests that took at most `le_us` µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Upper bound, µs.
    pub le_us: f64,
    /// Requests at or under it.
    pub count: u64,
}

/// Latency summary of one operation, µs (percentiles of an HdrHistogram with 2 significant
/// digits: within 1% of the true value, at most the maximum; see `stats.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Requests recorded.
    pub count: u64,
    /// Median, µs.
    pub p50_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Largest, µs (exact; durations over one hour count as one hour).
    pub max_us: f64,
    /// Sum of all, µs (exact).
    #[serde(default)]
    pub sum_us: f64,
    /// Cumulative counts at fixed bounds from 10 µs to 10 s (`stats::BUCKET_BOUNDS_US`);
    /// requests over the last bound are `count` minus the last bucket's.
    #[serde(default)]
    pub buckets: Vec<Bucket>,
}

/// The content of `<mnt>/.loosefs/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What is served.
    pub pack: PackReport,
    /// The serving process.
    pub daemon: DaemonReport,
    /// Requests answered, by operation name (`lookup`, `getattr`, `readdir`, `read`, `statfs`,
    /// `ioctl`, `control`).
    pub requests: BTreeMap<String, u64>,
    /// Requests answered with an error other than ENOENT/ENOTDIR/EISDIR.
    pub errors: u64,
    /// Requests answered ESTALE (counted in `errors` too): bytes of a remote object replaced
    /// or removed since the mount, which no retry brings back.
    #[serde(default)]
    pub stale: u64,
    /// Bytes returned by READ.
    pub bytes_served: u64,
    /// CRC-32s learned at samples' first reads (a foreign dataset indexed with `--verify
    /// lazy` whose format stores no checksum): later reads must match them.
    #[serde(default)]
    pub crc_learned: u64,
    /// Residency of the stored bytes when READs arrived.
    pub page_cache: PageCacheReport,
    /// Read-ahead in storage order.
    pub prefetch: PrefetchReport,
    /// Samples pushed into the kernel's cache ahead of in-order readers.
    pub push_ahead: PushReport,
    /// Read-ahead along announced epoch orders.
    #[serde(default)]
    pub order: OrderReport,
    /// The pinned prefix.
    pub pin: PinReport,
    /// The whole-pack warm.
    pub warm: WarmStatus,
    /// Decoded views, when served.
    pub decode: Option<DecodeReport>,
    /// The remote object and its block cache, for a pack at a URL.
    #[serde(default)]
    pub remote: Option<RemoteReport>,
    /// Changes noticed in a loose directory while mounted (`None` for packs and datasets).
    #[serde(default)]
    pub changes: Option<ChangesReport>,
    /// Video frames served (`--decode frames`), when served.
    #[serde(default)]
    pub frames: Option<FramesReport>,
    /// Latency per operation name.
    pub latency_us: BTreeMap<String, Latency>,
}

/// The `frames` section: video frames decoded a GOP at a time ([`crate::video::frames`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FramesReport {
    /// GOPs decoded.
    pub gops: u64,
    /// Frames decoded in them.
    pub frames: u64,
    /// GOPs that failed to decode.
    pub failures: u64,
    /// READs answered from the GOP cache.
    pub hits: u64,
    /// READs that started a decode.
    pub misses: u64,
    /// READs that waited for a decode under way.
    pub joined: u64,
    /// GOPs decoded ahead of a reader.
    pub ahead: u64,
    /// Bytes of pixels in the GOP cache now.
    pub cached_bytes: u64,
    /// The GOP cache's budget, bytes (`--decode-cache`).
    pub budget_bytes: u64,
    /// Threads decoding GOPs (`--decode-threads`).
    #[serde(default)]
    pub threads: u64,
}

/// The `changes` section of a loose directory mount (`crate::fs::changes`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesReport {
    /// Directories watched (inotify).
    pub watched_dirs: u64,
    /// Directories that could not be watched (`fs.inotify.max_user_watches`).
    pub unwatched_dirs: u64,
    /// Change events handled.
    pub events: u64,
    /// Comparisons of the whole tree with the mount's snapshot (one at start, one per lost
    /// event queue).
    pub rescans: u64,
    /// Files and directories added or replaced since the mount that are held now.
    pub late_nodes: u64,
    /// Reads served from them.
    pub late_reads: u64,
}

/// The `pack` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackReport {
    /// Path of the pack (the first storage object).
    pub path: String,
    /// Size of the storage objects.
    pub bytes: u64,
    /// Files served.
    pub samples: u64,
    /// Bytes of the storage objects in the page cache now.
    pub resident_bytes: u64,
    /// How files' bytes reach readers: `daemon` (READs answered by the daemon) or
    /// `passthrough` (the kernel reads a loose directory's original files itself; the
    /// daemon sees one OPEN per file and no READ).
    #[serde(default)]
    pub reads: String,
}

/// The `remote` section: GETs of a remote pack and its block cache.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteReport {
    /// The object's URL.
    pub url: String,
    /// The ETag every GET is pinned to (`If-Match`).
    pub etag: String,
    /// GETs completed (opening included).
    pub gets: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// GETs that failed after their retries (or found the object replaced).
    pub failed_gets: u64,
    /// Cache blocks fetched, evicted, and found damaged and fetched again.
    pub blocks_fetched: u64,
    /// Blocks evicted to keep within the cache size.
    pub blocks_evicted: u64,
    /// Cached blocks whose CRC-32C did not match (fetched again).
    pub blocks_damaged: u64,
    /// Bytes of blocks cached now.
    pub cached_bytes: u64,
    /// The cache's size limit for this pack, bytes.
    pub cache_limit_bytes: u64,
    /// The cache directory of this object.
    pub cache_dir: String,
    /// True when mounted `--offline`: served from the block cache alone, no request made.
    #[serde(default)]
    pub offline: bool,
    /// GETs of exact sample ranges (a sparse announced order) completed.
    #[serde(default)]
    pub exact_gets: u64,
    /// Bytes those GETs received (also counted in `bytes_received`).
    #[serde(default)]
    pub exact_bytes_received: u64,
    /// Bytes of reads served from exact ranges.
    #[serde(default)]
    pub exact_bytes_served: u64,
    /// Bytes of exact ranges held in memory now, in flight included (at most 512 MiB).
    #[serde(default)]
    pub exact_held_bytes: u64,
}

/// The `daemon` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonReport {
    /// Process id.
    pub pid: u32,
    /// Seconds since the mount.
    pub uptime_s: f64,
    /// Resident set (VmRSS).
    pub rss_bytes: u64,
    /// Peak resident set (VmHWM).
    pub rss_peak_bytes: u64,
    /// Locked memory (VmLck).
    pub locked_bytes: u64,
    /// FUSE threads.
    pub threads: usize,
    /// Where it is mounted.
    pub mountpoint: String,
    /// Its log file (`-`: the stderr it was started with).
    #[serde(default)]
    pub log: String,
    /// How requests reach it.
    #[serde(default)]
    pub transport: TransportReport,
    /// The binary serving: `VERSION (build CRC)`, the CRC-32 of the executable's bytes in hex,
    /// so two builds of one version differ (`loosefs restart` after an upgrade shows the new
    /// one).
    #[serde(default)]
    pub version: String,
    /// The keeper holding the mount's connection (`None`: the mount ends with this daemon).
    #[serde(default)]
    pub keeper: Option<KeeperReport>,
}

/// The `daemon.keeper` section: the process that keeps a mount across daemon deaths
/// (`crate::mount::keeper`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeeperReport {
    /// The keeper's pid (`loosefs restart` signals it).
    pub pid: u32,
    /// Daemons the keeper started after the first (deaths and restarts).
    pub restarts: u32,
    /// How the daemon before this one ended (`killed by signal 9`, `replaced by loosefs
    /// restart`); empty for the first daemon.
    pub last_end: String,
}

/// This process's keeper, set once by a daemon that has one.
pub static KEEPER: std::sync::OnceLock<KeeperReport> = std::sync::OnceLock::new();

/// `VERSION (build CRC)` of the running executable ([`DaemonReport::version`]), read once.
pub fn version() -> String {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        // Streamed: the executable (with its debug information) is far larger than what
        // the daemon otherwise holds.
        let crc = std::fs::File::open("/proc/self/exe").and_then(|mut f| {
            use std::io::Read;
            let mut h = crc32fast::Hasher::new();
            let mut buf = vec![0u8; 256 << 10];
            loop {
                match f.read(&mut buf)? {
                    0 => return Ok(h.finalize()),
                    n => h.update(&buf[..n]),
                }
            }
        });
        let build = crc.map_or_else(|_| "unknown".into(), |c| format!("{c:08x}"));
        format!("{} (build {build})", env!("CARGO_PKG_VERSION"))
    })
    .clone()
}

/// The `daemon.transport` section: how the kernel's requests reach the daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportReport {
    /// `uring` (FUSE over io_uring) or `classic` (`/dev/fuse` reads and writes).
    pub kind: String,
    /// Ring queues (one per possible CPU; 0 for `classic`).
    pub queues: usize,
    /// Ring threads, each with one ring entry (0 for `classic`).
    pub ring_threads: usize,
    /// Requests answered through the ring.
    pub ring_requests: u64,
}

/// The `page_cache` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageCacheReport {
    /// READs whose stored bytes were all resident.
    pub hits: u64,
    /// READs that waited for at least one page from the device.
    pub misses: u64,
    /// Samples whose stored pages were dropped after being served in full.
    pub samples_evicted_after_serving: u64,
    /// `--keep-pack-cache`.
    pub keep_pack_cache: bool,
}

/// The `prefetch` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchReport {
    /// Largest read-ahead window.
    pub max_window_bytes: u64,
    /// Read-ahead requests issued.
    pub requests: u64,
    /// Bytes asked for (each byte at most once until it is served).
    pub bytes: u64,
    /// Bytes read ahead and later served (to a READ or pushed).
    #[serde(default)]
    pub served_bytes: u64,
    /// Bytes read ahead and not served: dropped unused, or still waiting for their reader.
    #[serde(default)]
    pub unserved_bytes: u64,
    /// READs that fell inside a range already read ahead.
    pub hits: u64,
}

/// The `order` section: read-ahead along announced epoch orders (`<mnt>/.loosefs/order`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderReport {
    /// Bytes read ahead along one order and not yet served, at most (`--order-window-mb`).
    pub window_max_bytes: u64,
    /// Orders live now (announced, neither finished, replaced nor abandoned).
    pub live: u64,
    /// Orders announced since the mount.
    pub announced: u64,
    /// Samples in the live orders.
    pub samples: u64,
    /// Announced paths that named no file of the mount (not read ahead).
    pub unresolved_paths: u64,
    /// Samples read ahead along an order.
    pub read_ahead: u64,
    /// Bytes read ahead along an order.
    pub read_ahead_bytes: u64,
    /// Bytes read ahead and not yet served now (the memory the orders hold).
    pub window_bytes: u64,
    /// Samples of an order read for the first time.
    pub served: u64,
    /// Samples of an order the kernel held whole already: not read.
    #[serde(default)]
    pub cached: u64,
    /// Samples read ahead and released unread (their order was replaced or abandoned).
    pub released_unread: u64,
    /// First reads of a sample while an order was live that were off it (in no live order, or
    /// far beyond what was read ahead).
    pub left: u64,
    /// Orders abandoned because reads did not follow them.
    pub abandoned: u64,
}

/// The `push_ahead` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushReport {
    /// Samples pushed.
    pub samples: u64,
    /// Bytes pushed.
    pub bytes: u64,
    /// Times the kernel asked for a pushed sample (its copy was dropped) and pushing restarted.
    pub resets: u64,
}

/// The `pin` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinReport {
    /// Bytes to pin.
    pub target_bytes: u64,
    /// Bytes pinned so far.
    pub pinned_bytes: u64,
}

/// State of a warm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WarmState {
    /// Never started, or reset by drop-cache.
    Idle,
    /// Under way.
    Running,
    /// Finished.
    Done,
    /// Stopped by a read error (logged).
    Failed,
}

impl WarmState {
    /// The name used in reports: `idle`, `running`, `done`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            WarmState::Idle => "idle",
            WarmState::Running => "running",
            WarmState::Done => "done",
            WarmState::Failed => "failed",
        }
    }
}

/// Warm progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmStatus {
    /// Where it stands.
    pub state: WarmState,
    /// The contiguous prefix read.
    pub bytes_done: u64,
    /// Bytes to read (the budget or the sample data, whichever is smaller).
    pub bytes_total: u64,
    /// Throughput so far, MB/s (10^6 bytes).
    pub mb_per_s: f64,
    /// True when the budget was smaller than the sample data.
    pub limited_by_memory: bool,
}

/// The `decode` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeReport {
    /// Views served.
    pub views: ViewsReport,
    /// Decode threads.
    pub threads: usize,
    /// Files decoded ahead of an in-order reader.
    pub ahead_files: usize,
    /// Images decoded.
    pub decodes: u64,
    /// Of those, by the fallback decoder.
    pub fallback_decodes: u64,
    /// Of those, with a libjpeg warning (pixels kept).
    pub warning_decodes: u64,
    /// READs answered EIO because the sample could not be decoded.
    pub failures: u64,
    /// Damaged JPEGs (truncated or corrupt scans) refused, as Pillow refuses them.
    pub damaged_refused: u64,
    /// `--decode-accept-damaged`: libjpeg's recovery of damaged JPEGs is served.
    pub accept_damaged: bool,
    /// READs answered from the decoded cache.
    pub hits: u64,
    /// READs that started a decode.
    pub misses: u64,
    /// READs that waited for a decode under way.
    pub joined: u64,
    /// Decodes started ahead of an in-order reader.
    pub decoded_ahead: u64,
    /// The decoded cache.
    pub cache: CacheFigures,
    /// Time per decode.
    pub decode_us: Latency,
}

/// Which views a mount serves (`--decode`, `--decoded-only`, `--decode-max-side`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewsReport {
    /// `.npy` views.
    pub npy: bool,
    /// PPM views.
    pub ppm: bool,
    /// JPEGs hidden.
    pub decoded_only: bool,
    /// Longer side at least this after DCT scaling, pixels.
    pub max_side: Option<u32>,
}

/// Figures of the decoded cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheFigures {
    /// Budget, bytes of pixels.
    pub budget_bytes: u64,
    /// Bytes of pixels cached now.
    pub bytes: u64,
    /// Images cached now.
    pub entries: u64,
    /// Images evicted since the mount.
    pub evictions: u64,
    /// Decodes under way.
    pub in_flight: u64,
}

/// The content of `<mnt>/.loosefs/drop-cache` (the command's result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropCacheReport {
    /// Stored bytes in the page cache before.
    pub pack_resident_bytes_before: u64,
    /// Stored bytes in the page cache after (pinned pages stay).
    pub pack_resident_bytes_after: u64,
    /// Bytes pinned.
    pub pinned_bytes: u64,
    /// Inodes whose kernel-cached pages were dropped.
    pub inodes_invalidated: u64,
    /// Why eviction failed, if it did.
    pub error: Option<String>,
}

/// The content of `<mnt>/.loosefs/warm` (the command's result).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmCommandReport {
    /// False when a warm was already running.
    pub started: bool,
    /// Progress.
    pub warm: WarmStatus,
}
