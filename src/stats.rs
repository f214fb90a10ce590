//! Request statistics: lock-free counters and latency histograms updated on the request path,
//! read into a [`crate::report::Report`] for `<mnt>/.loosefs/stats` and `loosefs stats`.
//!
//! Latencies go into 64 power-of-two nanosecond buckets per operation (one atomic add per
//! request); percentiles are read from the bucket upper bounds, so they are accurate to a
//! factor of two at worst, and exact enough to tell 10 µs from 100 µs.

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

/// A histogram of durations in power-of-two nanosecond buckets.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; 64],
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
        let b = 64 - ns.max(1).leading_zeros() as usize; // 1 ns -> bucket 1
        self.buckets[b.min(63)].fetch_add(1, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    /// Count and percentiles (upper bucket bounds, µs).
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
                    return (1u64 << b.min(63)) as f64 / 1000.0;
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
        assert!(s.p50_us >= 10.0 && s.p50_us <= 20.0, "{s:?}");
        assert!(s.p90_us >= 10.0 && s.p90_us <= 20.0, "{s:?}");
        assert!(s.p99_us >= 5000.0 && s.p99_us <= 10000.0, "{s:?}");
        assert_eq!(s.max_us, 5000.0);
        assert_eq!(Histogram::default().summary().count, 0);
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
