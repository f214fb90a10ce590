//! Request statistics: lock-free counters and latency histograms updated on the request path,
//! read into a [`crate::report::Report`] for `<mnt>/.loosefs/stats` and `loosefs stats`.
//!
//! Latencies go into one HdrHistogram per operation (the `hdrhistogram` crate, 2 significant
//! digits: percentiles within 1%), reported as percentiles and as cumulative buckets for
//! Prometheus (`loosefs stats --format prometheus`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// FUSE operations counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// LOOKUP of a name in a directory.
    Lookup,
    /// GETATTR of an inode.
    Getattr,
    /// READDIR and READDIRPLUS.
    Readdir,
    /// READ of a file's bytes.
    Read,
    /// STATFS.
    Statfs,
    /// IOCTL (Python's `isatty` on open).
    Ioctl,
    /// A read of a control file under `.loosefs/`.
    Control,
    /// OPEN: answered ENOSYS once, after which the kernel sends none (zero-message open).
    Open,
    /// WRITE and SETATTR: an announced order (`.loosefs/order`), or a change refused (EROFS).
    Write,
}

impl Op {
    /// All operations, in report order.
    pub const ALL: [Op; 9] = [
        Op::Lookup,
        Op::Getattr,
        Op::Readdir,
        Op::Read,
        Op::Statfs,
        Op::Ioctl,
        Op::Control,
        Op::Open,
        Op::Write,
    ];

    /// Name used in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Readdir => "readdir",
            Op::Read => "read",
            Op::Statfs => "statfs",
            Op::Ioctl => "ioctl",
            Op::Control => "control",
            Op::Open => "open",
            Op::Write => "write",
        }
    }
}

/// Upper bounds of the cumulative buckets a [`Latency`] reports (Prometheus `le`), µs:
/// 10 µs to 10 s in 1–2.5–5 steps, the span of a FUSE request from a page-cache hit to a
/// remote fetch that times out.
pub const BUCKET_BOUNDS_US: [f64; 19] = [
    10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6,
    2.5e6, 5e6, 1e7,
];

/// Largest duration told apart, ns (one hour); longer ones are recorded as one hour.
const HIGHEST_NS: u64 = 3_600_000_000_000;

/// A histogram of durations: an [`hdrhistogram::Histogram`] of nanoseconds with 2
/// significant digits (every percentile within 1% of the true value, 1 ns to 1 h; about
/// 40 KB), behind a mutex held for one increment per request, plus the exact sum and maximum.
#[derive(Debug)]
pub struct Histogram {
    h: Mutex<hdrhistogram::Histogram<u64>>,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            // Constant bounds within hdrhistogram's limits (low ≥ 1, high ≥ 2 × low, 2 digits):
            // it cannot fail, and every test that makes a Histogram checks so.
            h: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, HIGHEST_NS, 2)
                    .expect("1 ns..1 h with 2 significant digits"),
            ),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u128::from(HIGHEST_NS)) as u64;
        self.h
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .saturating_record(ns.max(1));
        self.sum_ns.fetch_add(ns, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    /// Count, percentiles (µs, within 1%, at most the maximum), exact sum and maximum, and
    /// the cumulative counts at [`BUCKET_BOUNDS_US`].
    pub fn summary(&self) -> Latency {
        let h = self.h.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let max_us = self.max_ns.load(Relaxed) as f64 / 1000.0;
        let pct = |q: f64| match h.is_empty() {
            true => 0.0,
            false => (h.value_at_quantile(q) as f64 / 1000.0).min(max_us),
        };
        Latency {
            count: h.len(),
            p50_us: pct(0.50),
            p90_us: pct(0.90),
            p99_us: pct(0.99),
            max_us,
            sum_us: self.sum_ns.load(Relaxed) as f64 / 1000.0,
            buckets: BUCKET_BOUNDS_US
                .iter()
                .map(|&le_us| Bucket {
                    le_us,
                    count: h.count_between(0, (le_us * 1000.0) as u64),
                })
                .collect(),
        }
    }
}

pub use crate::report::{Bucket, Latency};

/// Request counters of a running daemon (read-ahead and decode keep their own).
#[derive(Debug, Default)]
pub struct Stats {
    latency: [Histogram; Op::ALL.len()],
    /// Requests that answered an error.
    pub errors: AtomicU64,
    /// Requests answered ESTALE: bytes of a remote object replaced or removed since the mount
    /// (counted in `errors` too).
    pub stale: AtomicU64,
    /// Bytes returned by READ.
    pub bytes_served: AtomicU64,
    /// How requests reach the daemon.
    pub transport: TransportStats,
}

/// How requests reach the daemon: `/dev/fuse` (fuser's threads) or FUSE over io_uring
/// (`fuse::uring`), set by the adaptor once the ring is registered.
#[derive(Debug, Default)]
pub struct TransportStats {
    /// INIT has been answered (`offered` is then final).
    pub init_done: std::sync::atomic::AtomicBool,
    /// The kernel agreed to FUSE over io_uring at INIT.
    pub offered: std::sync::atomic::AtomicBool,
    /// The ring's queues are registered: the kernel sends requests through them.
    pub uring: std::sync::atomic::AtomicBool,
    /// Ring queues (one per possible CPU).
    pub queues: std::sync::atomic::AtomicUsize,
    /// Ring threads (each with one ring entry).
    pub threads: std::sync::atomic::AtomicUsize,
    /// Requests answered through the ring.
    pub requests: AtomicU64,
}

impl Stats {
    /// Records one request of `op` that started at `t0`.
    pub fn done(&self, op: Op, t0: Instant) {
        self.latency[op as usize].record(t0.elapsed());
    }

    /// Latency summary per operation, in [`Op::ALL`] order.
    pub fn latencies(&self) -> Vec<(&'static str, Latency)> {
        Op::ALL
            .iter()
            .map(|&op| (op.name(), self.latency[op as usize].summary()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_follow_the_distribution() {
        let h = Histogram::default();
        for _ in 0..90 {
            h.record(Duration::from_micros(10));
        }
        for _ in 0..10 {
            h.record(Duration::from_millis(5));
        }
        let s = h.summary();
        assert_eq!(s.count, 100);
        let near = |got: f64, want: f64| (got - want).abs() <= want / 100.0;
        assert!(near(s.p50_us, 10.0) && near(s.p90_us, 10.0), "{s:?}");
        assert!(near(s.p99_us, 5000.0), "{s:?}");
        assert_eq!(s.max_us, 5000.0);
        assert_eq!(s.sum_us, 90.0 * 10.0 + 10.0 * 5000.0);
        assert_eq!(Histogram::default().summary().count, 0);
    }

    #[test]
    fn buckets_are_cumulative_and_end_at_the_count() {
        let h = Histogram::default();
        for us in [1u64, 30, 30, 700, 20_000, 7_000_000_000] {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        let at = |le: f64| s.buckets.iter().find(|b| b.le_us == le).map(|b| b.count);
        assert_eq!(at(10.0), Some(1));
        assert_eq!(at(50.0), Some(3));
        assert_eq!(at(1e3), Some(4));
        assert_eq!(at(2.5e4), Some(5));
        // 7000 s is past the last bound (and recorded as one hour): only +Inf counts it.
        assert_eq!(at(1e7), Some(5));
        assert_eq!(s.count, 6);
        assert_eq!(s.max_us, HIGHEST_NS as f64 / 1000.0);
        assert!(s.buckets.windows(2).all(|w| w[0].count <= w[1].count));
    }
}

/// Logs an error at most once per [`LogLimit::INTERVAL`]: the first one at once, later ones
/// counted and reported with the next line logged. For errors that repeat with every request
/// while their cause lasts (a remote server down), so the log says why without growing with
/// the request rate.
#[derive(Debug, Default)]
pub struct LogLimit {
    last: std::sync::Mutex<Option<Instant>>,
    suppressed: std::sync::atomic::AtomicU64,
}

impl LogLimit {
    /// Least time between two lines.
    pub const INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

    /// Logs `msg()` at error level unless a line was logged less than [`Self::INTERVAL`] ago.
    pub fn log(&self, msg: impl FnOnce() -> String) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = Instant::now();
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if last.is_some_and(|t| now.duration_since(t) < Self::INTERVAL) {
            self.suppressed.fetch_add(1, Relaxed);
            return;
        }
        *last = Some(now);
        let n = self.suppressed.swap(0, Relaxed);
        if n > 0 {
            log::error!(
                "{} ({n} similar errors not logged in the last interval)",
                msg()
            );
        } else {
            log::error!("{}", msg());
        }
    }
}

/// The message a panic carried (`panic!` with a literal or a formatted string), for logging a
/// caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
