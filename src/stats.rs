//! Request statistics: lock-free counters and latency histograms updated on the request path,
//! read into a [`crate::report::Report`] for `<mnt>/.loosefs/stats` and `loosefs stats`.
//!
//! Latencies go into log-linear nanosecond buckets per operation (one atomic add per request):
//! each power of two is split into [`SUB`] equal buckets, as HdrHistogram does with 3
//! significant bits, and a percentile is its bucket's midpoint, so it is within 1/16 (6.25%)
//! of the true value. The power-of-two buckets before reported 4,194.304 µs for anything
//! between 2.1 and 4.2 ms.

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
}

impl Op {
    /// All operations, in report order.
    pub const ALL: [Op; 8] = [
        Op::Lookup,
        Op::Getattr,
        Op::Readdir,
        Op::Read,
        Op::Statfs,
        Op::Ioctl,
        Op::Control,
        Op::Open,
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
        }
    }
}

/// Buckets per power of two (3 significant bits).
const SUB: usize = 8;
/// Buckets in all: exact ones for 0..SUB ns, then SUB per power of two up to 2^64 ns.
const BUCKETS: usize = SUB + (64 - 3) * SUB;

/// The bucket of `ns`: `ns` itself below [`SUB`], else `SUB` per power of two.
fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros() as usize; // 2^e <= ns, e >= 3
    let sub = ((ns >> (e - 3)) & 7) as usize;
    SUB + (e - 3) * SUB + sub
}

/// The values of bucket `b`, nanoseconds: `[low, high)`.
fn bounds_of(b: usize) -> (u64, u64) {
    if b < SUB {
        return (b as u64, b as u64 + 1);
    }
    let (e, sub) = ((b - SUB) / SUB + 3, ((b - SUB) % SUB) as u64);
    let low = (8 + sub) << (e - 3);
    (low, low.saturating_add(1 << (e - 3)))
}

/// A histogram of durations in log-linear nanosecond buckets (see the module doc).
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    /// Count and percentiles (each its bucket's midpoint, at most the maximum; µs).
    pub fn summary(&self) -> Latency {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let pct = |p: f64| -> f64 {
            if total == 0 {
                return 0.0;
            }
            let want = (p * total as f64).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (b, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want {
                    let (low, high) = bounds_of(b);
                    return (low as f64 + high as f64) / 2.0 / 1000.0;
                }
            }
            0.0
        };
        let max_us = self.max_ns.load(Relaxed) as f64 / 1000.0;
        Latency {
            count: total,
            p50_us: pct(0.50).min(max_us),
            p90_us: pct(0.90).min(max_us),
            p99_us: pct(0.99).min(max_us),
            max_us,
        }
    }
}

pub use crate::report::Latency;

/// Request counters of a running daemon (read-ahead and decode keep their own).
#[derive(Debug, Default)]
pub struct Stats {
    latency: [Histogram; Op::ALL.len()],
    /// Requests that answered an error.
    pub errors: AtomicU64,
    /// Bytes returned by READ.
    pub bytes_served: AtomicU64,
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
        let near = |got: f64, want: f64| (got - want).abs() <= want / 16.0;
        assert!(near(s.p50_us, 10.0) && near(s.p90_us, 10.0), "{s:?}");
        assert!(near(s.p99_us, 5000.0), "{s:?}");
        assert_eq!(s.max_us, 5000.0);
        assert_eq!(Histogram::default().summary().count, 0);
    }

    #[test]
    fn every_value_lies_in_its_bucket_and_buckets_tile_the_range() {
        let mut v = vec![
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            17,
            1000,
            4_194_303,
            4_194_304,
            u64::MAX,
        ];
        v.extend((0..64).map(|e| 1u64 << e));
        v.extend((1..64).map(|e| (1u64 << e) - 1));
        for ns in v {
            let (low, high) = bounds_of(bucket_of(ns));
            assert!(
                low <= ns && (ns < high || high == u64::MAX),
                "{ns}: {low}..{high}"
            );
            // A bucket is at most 1/8 of its values wide: the midpoint is within 1/16.
            assert!(high - low <= (low / 8).max(1), "{ns}: {low}..{high}");
        }
        for b in 1..BUCKETS {
            assert_eq!(bounds_of(b - 1).1, bounds_of(b).0, "bucket {b}");
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
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
