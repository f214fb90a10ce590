//! The stats report of a running server, and the `warm` command's answer: gathered from the
//! request counters, the read-ahead, the decoder and `/proc/self/status`.

use super::FsOptions;
use super::data::Data;
use crate::catalog::Catalog;
use crate::report::{
    DaemonReport, DropCacheReport, PackReport, PageCacheReport, Report, TransportReport,
    WarmCommandReport,
};
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// A `/proc/self/status` memory figure (`VmRSS:` etc.), bytes; 0 when unreadable.
fn status_bytes(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// What a report is gathered from: the parts of a running server.
pub(super) struct Parts<'a> {
    pub(super) catalog: &'a dyn Catalog,
    pub(super) data: &'a Data,
    pub(super) stats: &'a Stats,
    pub(super) opts: &'a FsOptions,
    pub(super) started: Instant,
    pub(super) passthrough: bool,
    pub(super) changes: Option<&'a crate::fs::changes::Changes>,
}

impl Parts<'_> {
    /// The statistics report (the content of `.loosefs/stats`).
    pub(super) fn report(&self) -> Report {
        let s = self.stats;
        let ra = &self.data.readahead.stats;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let objects = self.catalog.objects();
        let lat = s.latencies();
        let (prefetch, push_ahead, pin, warm) = self.data.readahead.report();
        Report {
            pack: PackReport {
                path: objects
                    .first()
                    .map(|o| o.path.display().to_string())
                    .unwrap_or_default(),
                bytes: objects.iter().map(|o| o.len).sum(),
                samples: self.catalog.files(),
                resident_bytes: self.data.readahead.resident_bytes(),
                reads: if self.passthrough {
                    "passthrough"
                } else {
                    "daemon"
                }
                .into(),
            },
            daemon: DaemonReport {
                pid: std::process::id(),
                uptime_s: self.started.elapsed().as_secs_f64(),
                rss_bytes: status_bytes(&status, "VmRSS:"),
                rss_peak_bytes: status_bytes(&status, "VmHWM:"),
                locked_bytes: status_bytes(&status, "VmLck:"),
                threads: self.opts.threads,
                mountpoint: self.opts.mountpoint.clone(),
                log: self.opts.log.clone(),
                transport: {
                    let t = &s.transport;
                    let uring = t.uring.load(Relaxed);
                    TransportReport {
                        kind: if uring { "uring" } else { "classic" }.into(),
                        queues: t.queues.load(Relaxed),
                        ring_threads: t.threads.load(Relaxed),
                        ring_requests: t.requests.load(Relaxed),
                    }
                },
                version: crate::report::version(),
                keeper: crate::report::KEEPER.get().cloned(),
            },
            requests: lat.iter().map(|(n, l)| (n.to_string(), l.count)).collect(),
            errors: s.errors.load(Relaxed),
            stale: s.stale.load(Relaxed),
            bytes_served: s.bytes_served.load(Relaxed),
            crc_learned: self.data.samples.learned(),
            page_cache: PageCacheReport {
                hits: ra.page_cache_hits.load(Relaxed),
                misses: ra.page_cache_misses.load(Relaxed),
                samples_evicted_after_serving: ra.samples_evicted.load(Relaxed),
                keep_pack_cache: self.data.readahead.keeps_cache(),
            },
            prefetch,
            push_ahead,
            order: self.data.readahead.order.report(),
            pin,
            warm,
            decode: self.data.decoder.as_ref().map(|d| d.report()),
            frames: self.data.frames.as_ref().map(|f| f.report()),
            remote: self.data.samples.storage().remote_report(),
            changes: self.changes.map(|c| {
                let s = &c.stats;
                crate::report::ChangesReport {
                    watched_dirs: s.watched.load(Relaxed),
                    unwatched_dirs: s.unwatched.load(Relaxed),
                    events: s.events.load(Relaxed),
                    rescans: s.rescans.load(Relaxed),
                    late_nodes: s.late_nodes.load(Relaxed),
                    late_reads: s.late_reads.load(Relaxed),
                }
            }),
            latency_us: lat.into_iter().map(|(n, l)| (n.to_string(), l)).collect(),
        }
    }

    /// Starts a whole-pack warm unless one is running (the `warm` control file).
    pub(super) fn warm(&self) -> WarmCommandReport {
        let started = self.data.readahead.start_warm();
        let (.., warm) = self.data.readahead.report();
        WarmCommandReport { started, warm }
    }
}

impl super::Fs {
    pub(super) fn parts(&self) -> Parts<'_> {
        Parts {
            catalog: self.catalog.as_ref(),
            data: &self.data,
            stats: &self.stats,
            opts: &self.opts,
            started: self.started,
            passthrough: self.passthrough(),
            changes: self.changes().map(|c| &**c),
        }
    }

    /// The statistics report (the content of `.loosefs/stats`).
    pub fn report(&self) -> crate::report::Report {
        self.parts().report()
    }

    /// Empties the caches the daemon owns and evicts the unpinned stored pages; drops the
    /// kernel's cached pages of every file served so far.
    pub fn drop_cache(&self) -> DropCacheReport {
        self.data
            .drop_cache(self.invalidate.get().map(|f| f.as_ref()))
    }
}
