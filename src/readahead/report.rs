//! What the read-ahead reports and empties: its sections of the stats report, the bytes of
//! the stored objects cached, and drop-cache.

use super::ReadAhead;
use super::ledger::Ledger;
use super::stream::Streams;
use crate::catalog::ObjectId;
use crate::report::{DropCacheReport, PinReport, PrefetchReport, PushReport, WarmStatus};
use std::sync::atomic::Ordering::Relaxed;

impl ReadAhead {
    /// Forgets every stream, push mark and warm progress, and evicts every unpinned stored
    /// page (drop-cache). `inodes_invalidated` is left for the caller.
    pub fn drop_cache(&self) -> DropCacheReport {
        let storage = self.samples.storage();
        let objects = self.samples.catalog().objects();
        let before = self.resident_bytes();
        let mut error = None;
        for (k, o) in objects.iter().enumerate() {
            // Pinned pages stay (that is what pinning is for); only the rest is evicted.
            let pinned = self.pinned_in(k as ObjectId);
            if pinned < o.len {
                if let Err(e) = storage.evict(k as ObjectId, &(pinned..o.len)) {
                    error.get_or_insert(e.to_string());
                }
            }
        }
        self.streams.iter().for_each(Streams::reset);
        self.ledgers.iter().for_each(Ledger::clear);
        self.warm.reset();
        self.push.reset();
        DropCacheReport {
            pack_resident_bytes_before: before,
            pack_resident_bytes_after: self.resident_bytes(),
            pinned_bytes: self.pin.pinned.load(Relaxed),
            inodes_invalidated: 0,
            error,
        }
    }

    /// Whether stored pages are kept after serving (`--keep-pack-cache`).
    pub fn keeps_cache(&self) -> bool {
        self.opts.keep_cache
    }

    /// Bytes of all storage objects cached now.
    pub fn resident_bytes(&self) -> u64 {
        let storage = self.samples.storage();
        let objects = self.samples.catalog().objects();
        (0..objects.len())
            .map(|k| storage.resident_bytes(k as ObjectId, &(0..objects[k].len)))
            .sum()
    }

    /// The `prefetch`, `push_ahead`, `pin` and `warm` sections of the stats report.
    pub fn report(&self) -> (PrefetchReport, PushReport, PinReport, WarmStatus) {
        let s = &self.stats;
        (
            PrefetchReport {
                max_window_bytes: self.opts.window_max,
                requests: s.prefetch_requests.load(Relaxed),
                bytes: self.ledgers.iter().map(|l| l.asked.load(Relaxed)).sum(),
                served_bytes: self.ledgers.iter().map(|l| l.served.load(Relaxed)).sum(),
                unserved_bytes: self.ledgers.iter().map(Ledger::unserved).sum(),
                hits: s.prefetch_hits.load(Relaxed),
            },
            PushReport {
                samples: s.pushed_samples.load(Relaxed),
                bytes: s.pushed_bytes.load(Relaxed),
                resets: s.push_resets.load(Relaxed),
            },
            PinReport {
                target_bytes: self.pin.target.load(Relaxed),
                pinned_bytes: self.pin.pinned.load(Relaxed),
            },
            self.warm.status(),
        )
    }
}
