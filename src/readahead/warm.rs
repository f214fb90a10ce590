//! Whole-object warm: streams a storage object's sample data sequentially into its cache on
//! background threads, so a shuffled first epoch runs from memory instead of random reads.
//!
//! Four threads take 8 MiB steps front to back from a shared counter (several requests in
//! flight: a virtual or network disk streams several times faster with four outstanding reads
//! than with one; `docs/DESIGN.md` has the figures). Progress is the contiguous prefix done. It
//! stops at a budget: the pinned size when pinning, else what fits in `MemAvailable` at the
//! start less a margin, so warming never pushes the trainer's memory out.
//!
//! Listings come first: each step is read in 2 MiB parts, and while a lookup or a listing is
//! being served ([`Warmer::foreground`]) only the first warm thread goes on, so the index reads
//! of the listing that starts an epoch wait behind at most 2 MiB of warm reads in the device's
//! queue (a throttled or slow disk serves its queue in order) instead of four 8 MiB ones.
//! Sample READs do not hold the warm back: on a disk limited in operations per second, a warm
//! that yields to every random miss stretches the epoch (`docs/DESIGN.md` has the figures).

use crate::catalog::ObjectId;
use crate::memory::{MEMORY_MARGIN, mem_available};
use crate::storage::Storage;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const STEP: usize = 8 << 20;
/// Bytes per read within a step: large enough that a disk limited in operations per second
/// still streams (150 MB/s at 200 IOPS is 750 KB per operation), small enough that a listing
/// waits little behind one (16 ms at 125 MiB/s).
const PART: usize = 2 << 20;
/// Concurrent reads while warming.
const READERS: usize = 4;

pub use crate::report::{WarmState, WarmStatus};

/// Background warmer of one storage object.
#[derive(Debug, Default)]
pub struct Warmer {
    state: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    limited: AtomicBool,
    started: Mutex<Option<(Instant, Option<Instant>)>>,
    /// Lookups and listings being served now.
    busy: AtomicU64,
}

/// Marks a lookup or listing as being served while it lives (see [`Warmer::foreground`]).
#[derive(Debug)]
pub struct Foreground<'a>(&'a AtomicU64);

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const FAILED: u8 = 3;

impl Warmer {
    /// Starts warming `[0, data_end)` of each `(obj, data_end)` of `parts`, in that order,
    /// unless a warm is already running. Returns false if one was running. `budget` caps the
    /// bytes read (None: memory-derived budget).
    pub fn start(
        self: &Arc<Self>,
        storage: Arc<dyn Storage>,
        parts: Vec<(ObjectId, u64)>,
        budget: Option<u64>,
    ) -> bool {
        let data_end: u64 = parts.iter().map(|p| p.1).sum();
        if self
            .state
            .compare_exchange(IDLE, RUNNING, Relaxed, Relaxed)
            .is_err()
            && self
                .state
                .compare_exchange(DONE, RUNNING, Relaxed, Relaxed)
                .is_err()
            && self
                .state
                .compare_exchange(FAILED, RUNNING, Relaxed, Relaxed)
                .is_err()
        {
            return false;
        }
        let mem = mem_available().map_or(u64::MAX, |a| a.saturating_sub(MEMORY_MARGIN));
        let limit = budget.unwrap_or(mem).min(data_end);
        self.limited.store(limit < data_end, Relaxed);
        self.total.store(limit, Relaxed);
        self.done.store(0, Relaxed);
        if let Ok(mut s) = self.started.lock() {
            *s = Some((Instant::now(), None));
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("loosefs-warm".into())
            .spawn(move || {
                // (object, offset, length) of every step, the objects one after the other,
                // each in the order its storage asks (front to back by default), up to the
                // limit.
                let mut plan = Vec::new();
                let mut left = limit;
                for &(obj, end) in &parts {
                    let ranges = storage.warm_plan(obj, end);
                    for r in ranges.unwrap_or_else(|| std::iter::once(0..end).collect()) {
                        let mut off = r.start;
                        while off < r.end && left > 0 {
                            let n = (STEP as u64).min(r.end - off).min(left);
                            plan.push((obj, off, n as usize));
                            off += n;
                            left -= n;
                        }
                    }
                }
                // The plan may skip bytes (a loose directory's padding between files).
                me.total
                    .store(plan.iter().map(|p| p.2 as u64).sum(), Relaxed);
                let steps = plan.len() as u64;
                let next = AtomicU64::new(0);
                let finished = Mutex::new(vec![false; steps as usize]);
                let failed = AtomicBool::new(false);
                std::thread::scope(|s| {
                    for t in 0..READERS {
                        let (next, failed, finished, storage, me, plan) =
                            (&next, &failed, &finished, &storage, &me, &plan);
                        s.spawn(move || {
                            let mut buf = vec![0u8; PART];
                            loop {
                                let k = next.fetch_add(1, Relaxed);
                                if k >= steps || failed.load(Relaxed) {
                                    return;
                                }
                                let (obj, off, n) = plan[k as usize];
                                let ahead = storage.warm_ahead();
                                if ahead > 0 {
                                    let end = (off + ahead).min(storage.len(obj));
                                    storage.will_need(obj, &(off..end));
                                }
                                let mut part = 0;
                                while part < n {
                                    while t > 0 && me.busy.load(Relaxed) > 0 {
                                        std::thread::sleep(std::time::Duration::from_millis(2));
                                    }
                                    let len = PART.min(n - part);
                                    let at = off + part as u64;
                                    if let Err(e) = storage.read_at(obj, at, &mut buf[..len]) {
                                        log::error!("warm: read at {at} failed: {e}");
                                        failed.store(true, Relaxed);
                                        return;
                                    }
                                    part += len;
                                }
                                // Progress = the contiguous prefix of finished steps.
                                if let Ok(mut f) = finished.lock() {
                                    f[k as usize] = true;
                                    let prefix: u64 = f
                                        .iter()
                                        .zip(plan.iter())
                                        .take_while(|(d, _)| **d)
                                        .map(|(_, p)| p.2 as u64)
                                        .sum();
                                    me.done.store(prefix, Relaxed);
                                }
                            }
                        });
                    }
                });
                if failed.load(Relaxed) {
                    me.state.store(FAILED, Relaxed);
                    return;
                }
                if let Ok(mut s) = me.started.lock() {
                    if let Some((t0, _)) = *s {
                        *s = Some((t0, Some(Instant::now())));
                    }
                }
                me.state.store(DONE, Relaxed);
                log::info!("warm: {limit} bytes read");
            });
        if spawned.is_err() {
            self.state.store(FAILED, Relaxed);
        }
        true
    }

    /// Notes that a lookup or listing is being served until the guard is dropped: warm threads
    /// but one hold back meanwhile.
    pub fn foreground(&self) -> Foreground<'_> {
        self.busy.fetch_add(1, Relaxed);
        Foreground(&self.busy)
    }

    /// Whether a warm is running.
    pub fn running(&self) -> bool {
        self.state.load(Relaxed) == RUNNING
    }

    /// Current progress.
    pub fn status(&self) -> WarmStatus {
        let done = self.done.load(Relaxed);
        let secs = self
            .started
            .lock()
            .ok()
            .and_then(|s| *s)
            .map_or(0.0, |(t0, end)| {
                end.unwrap_or_else(Instant::now)
                    .duration_since(t0)
                    .as_secs_f64()
            });
        WarmStatus {
            state: match self.state.load(Relaxed) {
                RUNNING => WarmState::Running,
                DONE => WarmState::Done,
                FAILED => WarmState::Failed,
                _ => WarmState::Idle,
            },
            bytes_done: done,
            bytes_total: self.total.load(Relaxed),
            mb_per_s: if secs > 0.0 {
                done as f64 / 1e6 / secs
            } else {
                0.0
            },
            limited_by_memory: self.limited.load(Relaxed),
        }
    }

    /// Resets progress after a `drop-cache` (a running warm keeps going).
    pub fn reset(&self) {
        if self.state.load(Relaxed) != RUNNING {
            self.state.store(IDLE, Relaxed);
            self.done.store(0, Relaxed);
        }
    }
}

impl super::ReadAhead {
    /// Starts a warm of every object's sample data, in object order, unless one is running
    /// (budget: the pin when pinning, else free memory). Returns false if one was running.
    pub fn start_warm(&self) -> bool {
        let objects = self.samples.catalog().objects();
        if objects.is_empty() {
            return false;
        }
        let total: u64 = objects.iter().map(|o| o.len).sum();
        let budget = self
            .opts
            .pin
            .map(|p| p.min(total))
            .or_else(|| self.samples.storage().warm_budget());
        let parts = objects
            .iter()
            .enumerate()
            .map(|(k, o)| (k as ObjectId, o.data_end))
            .collect();
        let storage = self.samples.storage().clone();
        self.warm.start(storage, parts, budget)
    }

    /// Marks a lookup or listing as being served while the guard lives: a running warm gives
    /// way (see the module doc).
    pub fn foreground(&self) -> Foreground<'_> {
        self.warm.foreground()
    }
}
