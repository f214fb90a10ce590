//! Announced epoch order: a sampler tells the mount in which order the coming epoch's files
//! will be read (`<mnt>/.loosefs/order`), and read-ahead follows that order instead of
//! guessing it from storage offsets, so a shuffled epoch is read ahead as well as an in-order
//! one.
//!
//! An order is a list of catalog records in read order (a view's path names its JPEG's
//! record). One thread reads ahead along every live order: the next positions, up to a window
//! of bytes read ahead and not yet served (`--order-window-mb`), are sorted into storage order,
//! merged where they share a page, and asked from the storage all at once, so the device or
//! link sees a deep queue of large requests instead of one miss per reader. A sample leaves the
//! window when it is first read (or pushed, or opened under passthrough); its pages are then
//! released as every served sample's are. New batches start once a quarter of the window is
//! free, so each batch is large enough to sort well. A sample the kernel holds whole already
//! (read in full earlier, and not forgotten since) is not read: a warm epoch costs nothing.
//!
//! The window opens as the order proves right: an order may hold [`RAMP_START`] bytes plus
//! twice the bytes it read ahead that were then read, up to the full window. A right order
//! reaches the full window within its first window's bytes; a wrong one stays near the start
//! (measured on the 30k set, 4 readers: a full 256 MiB first window cost a wrong hint 15%).
//!
//! Orders are kept per announcing process: an announcement replaces that process's previous
//! order (the next epoch), and other processes' orders stay (other ranks sharing the mount).
//! A record belongs to the order that announced it last.
//!
//! A wrong or stale order costs at most its first window: every sample's first read is
//! checked, and one is *off* the order when its record is in no live order, or lies far beyond
//! what was read ahead for it. When most of the last [`HISTORY`] first reads were off, every
//! live order is abandoned: what it read ahead and nobody read is released, and read-ahead
//! falls back to the stream detector alone.
//!
//! Sparse orders (the live orders name fewer than 90% of the files, as a rank of a
//! DistributedSampler does, even one of 2) are asked of the storage as exact ranges
//! ([`crate::storage::Storage::will_need_exact`]): a remote block cache then fetches the
//! samples alone, not the 1 MiB blocks around them, most of whose bytes the rank never reads.

use super::ledger::Ledger;
use crate::catalog::Extent;
use crate::ino::{Bitset, record_ino};
use crate::report::OrderReport;
use crate::samples::Samples;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard};

/// Live orders kept at most (the oldest goes first).
pub const MAX_ORDERS: usize = 16;
/// First reads the off-the-order check looks back over.
pub const HISTORY: u32 = 64;
/// A read counts as off its order when it lies this many positions, or as many as are in the
/// window if more, beyond the last position read ahead: more than a DataLoader keeps in flight
/// (workers × prefetch factor × batch size: 8 × 2 × 256).
const AHEAD_SLACK: usize = 4096;
/// Bytes two requests may be apart and still merge (they share a page).
const PAGE: u64 = 4096;
/// Bytes an order may hold before any of its read-ahead was read.
pub const RAMP_START: u64 = 8 << 20;
/// No owner in the record map.
const NONE: u64 = u64::MAX;
/// In the record map: its order was served in full (id 0 is never an order's); a later read
/// (a dropped copy, a READ that crossed the push finishing the order) is not off the order.
const FINISHED: u64 = 0;

/// Counters of the announced orders (the `order` section of the stats).
#[derive(Debug, Default)]
struct OrderStats {
    /// Orders announced.
    announced: AtomicU64,
    /// Paths announced that name no file of the mount.
    unresolved: AtomicU64,
    /// Samples read ahead along an order.
    read_ahead: AtomicU64,
    /// Bytes read ahead along an order.
    read_ahead_bytes: AtomicU64,
    /// Samples of an order read for the first time.
    served: AtomicU64,
    /// Samples of an order the kernel held already (not read).
    cached: AtomicU64,
    /// Samples read ahead and released unread (their order was replaced or abandoned).
    released: AtomicU64,
    /// First reads off every live order.
    left: AtomicU64,
    /// Orders abandoned because reads did not follow them.
    abandoned: AtomicU64,
}

/// One announced order.
#[derive(Debug)]
struct Order {
    id: u32,
    pid: u32,
    /// Records in read order.
    records: Vec<u32>,
    /// One bit per position: read (served) already.
    served: Vec<u64>,
    served_n: usize,
    /// Positions below this were read ahead, or skipped as served already.
    issued: usize,
    /// Bytes and samples read ahead and not served yet.
    outstanding: u64,
    outstanding_n: usize,
    /// Bytes read ahead and then read: what opens the window.
    earned: u64,
}

impl Order {
    fn is_served(&self, p: usize) -> bool {
        self.served
            .get(p / 64)
            .is_some_and(|w| w & (1 << (p % 64)) != 0)
    }

    fn done(&self) -> bool {
        self.served_n >= self.records.len() && self.outstanding_n == 0
    }

    /// Marks position `p` served; returns false if it was already.
    fn serve(&mut self, p: usize) -> bool {
        let (w, bit) = (p / 64, 1u64 << (p % 64));
        match self.served.get_mut(w) {
            Some(word) if *word & bit == 0 => {
                *word |= bit;
                self.served_n += 1;
                true
            }
            _ => false,
        }
    }

    /// Bytes this order may hold now (see the module doc).
    fn allowed(&self, window: u64) -> u64 {
        window.min(RAMP_START.saturating_add(self.earned.saturating_mul(2)))
    }
}

#[derive(Debug, Default)]
struct OrderState {
    orders: Vec<Order>,
    /// Per record: `id << 32 | position` of the order holding it, or [`NONE`].
    owner: Vec<u64>,
    next_id: u32,
    /// The last [`HISTORY`] first reads, one bit each (1: off the order), newest lowest.
    history: u64,
    seen: u32,
}

impl OrderState {
    fn find(&mut self, id: u32) -> Option<&mut Order> {
        self.orders.iter_mut().find(|o| o.id == id)
    }

    /// Removes order `k`: its records lose their owner ([`FINISHED`] when it was served in
    /// full); returns its positions read ahead and not served (to release).
    fn remove(&mut self, k: usize) -> Vec<u32> {
        let o = self.orders.remove(k); // not swap_remove: index 0 stays the oldest
        let mark = if o.done() { FINISHED } else { NONE };
        for (p, &r) in o.records.iter().enumerate() {
            if self.owner.get(r as usize) == Some(&(u64::from(o.id) << 32 | p as u64)) {
                self.owner[r as usize] = mark;
            }
        }
        (0..o.issued)
            .filter(|&p| !o.is_served(p))
            .map(|p| o.records[p])
            .collect()
    }
}

/// The announced orders of a mount and the thread reading ahead along them.
pub struct Orders {
    inner: Arc<OrderShared>,
    wake: SyncSender<()>,
}

struct OrderShared {
    state: Mutex<OrderState>,
    /// Records the kernel holds whole.
    held: Arc<Bitset>,
    /// Any order live (the read path's fast check).
    live: AtomicBool,
    /// Bytes read ahead and not served, per order at most.
    window: u64,
    records: usize,
    /// Files of the catalog: orders naming fewer than 90% of them are sparse.
    files: u64,
    /// Tickets of writers waiting for an order's first batch: the last taken, and the last
    /// the order thread finished a pass for (with its condition variable).
    ticket: AtomicU64,
    issued: (Mutex<u64>, std::sync::Condvar),
    stats: OrderStats,
}

impl OrderShared {
    /// Whether the live orders of `s` are sparse: together they name fewer than 90% of the
    /// catalog's files (a rank's 1/N; ranks sharing the mount add up). Blocks around samples
    /// named with density d cost 1/d of the bytes wanted: a rank of 2 read as blocks received
    /// 2.0× its share (`bench/nodes.py`), as exact ranges (neighbours in one GET) ~1.0×.
    fn sparse(&self, s: &OrderState) -> bool {
        let named: u64 = s.orders.iter().map(|o| o.records.len() as u64).sum();
        named.saturating_mul(10) < self.files.saturating_mul(9)
    }

    fn lock(&self) -> MutexGuard<'_, OrderState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Orders {
    /// The orders of a mount over `samples`, each read ahead up to `window` bytes (0: orders
    /// are accepted and counted but nothing is read ahead); starts the order thread.
    /// Records in `held` are held whole by the kernel and never read ahead.
    pub fn new(
        samples: Arc<Samples>,
        ledgers: Arc<Vec<Ledger>>,
        window: u64,
        held: Arc<Bitset>,
    ) -> Orders {
        let inner = Arc::new(OrderShared {
            held,
            state: Mutex::default(),
            live: AtomicBool::new(false),
            window,
            records: samples.catalog().records() as usize,
            files: samples.catalog().files(),
            ticket: AtomicU64::new(0),
            issued: (Mutex::new(0), std::sync::Condvar::new()),
            stats: OrderStats::default(),
        });
        let (wake, rx) = std::sync::mpsc::sync_channel(1);
        let i = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("loosefs-order".into())
            .spawn(move || run(&i, &samples, &ledgers, &rx));
        if let Err(e) = spawned {
            log::warn!("cannot start the order thread: {e}; announced orders are not read ahead");
        }
        Orders { inner, wake }
    }

    /// Starts a new, empty order announced by process `pid`, replacing that process's previous
    /// one (and the oldest order when [`MAX_ORDERS`] are live). Returns its id and the records
    /// read ahead for the orders it replaced and never read, whose pages the caller releases.
    pub fn announce(&self, pid: u32) -> (u32, Vec<u32>) {
        let mut s = self.inner.lock();
        if s.owner.len() != self.inner.records {
            s.owner = vec![NONE; self.inner.records];
        }
        let mut unread = Vec::new();
        while let Some(k) = (s.orders.iter().position(|o| o.pid == pid))
            .or_else(|| (s.orders.len() >= MAX_ORDERS).then_some(0))
        {
            unread.extend(s.remove(k));
        }
        s.next_id = s.next_id.wrapping_add(1).max(1);
        let id = s.next_id;
        s.orders.push(Order {
            id,
            pid,
            records: Vec::new(),
            served: Vec::new(),
            served_n: 0,
            issued: 0,
            outstanding: 0,
            outstanding_n: 0,
            earned: 0,
        });
        (s.history, s.seen) = (0, 0);
        self.inner.live.store(true, Relaxed);
        self.inner.stats.announced.fetch_add(1, Relaxed);
        self.note_released(unread.len());
        (id, unread)
    }

    /// Appends `records` to order `id` (a no-op once it was replaced or abandoned). True when
    /// these are the order's first records.
    pub fn extend(&self, id: u32, records: &[u32]) -> bool {
        let mut s = self.inner.lock();
        let OrderState { orders, owner, .. } = &mut *s;
        let issued: Vec<(u32, usize)> = orders.iter().map(|o| (o.id, o.issued)).collect();
        let Some(o) = orders.iter_mut().find(|o| o.id == id) else {
            return false;
        };
        let first = o.records.is_empty() && !records.is_empty();
        for &r in records {
            let Some(slot) = owner.get_mut(r as usize) else {
                continue;
            };
            // A record read ahead for once is owned by that position until it is served:
            // an earlier position of this order (a sampler with replacement repeats
            // samples), or one another order has issued already, keeps it, and this
            // position is skipped by the read-ahead. Otherwise the position issued would
            // never be served and would hold its window forever.
            let (held_by, at) = ((*slot >> 32) as u32, (*slot & u64::from(u32::MAX)) as usize);
            let keep = *slot != NONE
                && *slot != FINISHED
                && (held_by == id || issued.iter().any(|&(i, n)| i == held_by && at < n));
            if !keep {
                *slot = u64::from(id) << 32 | o.records.len() as u64;
            }
            o.records.push(r);
        }
        o.served.resize(o.records.len().div_ceil(64), 0);
        drop(s);
        let _ = self.wake.try_send(());
        first
    }

    /// Counts `n` paths that named no file.
    pub fn unresolved(&self, n: u64) {
        self.inner.stats.unresolved.fetch_add(n, Relaxed);
    }

    fn note_released(&self, n: usize) {
        self.inner.stats.released.fetch_add(n as u64, Relaxed);
    }

    /// The first read of a sample (`ext`, stored bytes): it leaves its order's window, and,
    /// when `check` (a reader's read, not a push), the reads are checked against the orders.
    /// Returns the records read ahead and never read when this read made the orders be
    /// abandoned (the caller releases their pages), and whether the read followed a live
    /// order (its read-ahead is the order's: the stream detector need not add any).
    pub fn first_read(&self, ext: &Extent, check: bool) -> (Vec<u32>, bool) {
        if !self.inner.live.load(Relaxed) {
            return (Vec::new(), false);
        }
        let stats = &self.inner.stats;
        let mut s = self.inner.lock();
        let owner = s.owner.get(ext.record as usize).copied().unwrap_or(NONE);
        let (id, p) = ((owner >> 32) as u32, (owner & u64::from(u32::MAX)) as usize);
        let mut off = owner != FINISHED;
        let mut followed = false;
        let mut finished = None;
        if let Some(o) = (owner != NONE).then(|| s.find(id)).flatten() {
            if o.serve(p) {
                stats.served.fetch_add(1, Relaxed);
                if p < o.issued {
                    o.outstanding = o.outstanding.saturating_sub(ext.len());
                    o.outstanding_n -= 1;
                    o.earned += ext.len();
                    let _ = self.wake.try_send(());
                }
            }
            off = p >= o.issued + AHEAD_SLACK.max(o.outstanding_n);
            followed = !off;
            finished = o.done().then_some(o.id);
        }
        if check {
            if off {
                stats.left.fetch_add(1, Relaxed);
            }
            s.history = (s.history << 1) | u64::from(off);
            s.seen = (s.seen + 1).min(HISTORY);
        }
        let mut unread = Vec::new();
        if let Some(k) = finished.and_then(|id| s.orders.iter().position(|o| o.id == id)) {
            unread.extend(s.remove(k));
        }
        if s.seen >= HISTORY / 2 && s.history.count_ones() * 4 > s.seen * 3 {
            let n = s.orders.len();
            stats.abandoned.fetch_add(n as u64, Relaxed);
            for k in (0..n).rev() {
                unread.extend(s.remove(k));
            }
            if n > 0 {
                log::info!(
                    "reads left the announced order ({} of the last {} first reads were off \
                     it): {n} order(s) abandoned, read-ahead follows the stream detector",
                    s.history.count_ones(),
                    s.seen
                );
            }
            (s.history, s.seen) = (0, 0);
        }
        self.inner.live.store(!s.orders.is_empty(), Relaxed);
        self.note_released(unread.len());
        (unread, followed)
    }

    /// The records of the live order holding `record` that come after it, from `skip`
    /// positions after it on, at most `n` and only those read ahead already, in read order,
    /// each with whether it was served (read, or pushed) already: what push-ahead stores into
    /// the kernel's cache ahead of a reader following the order. Empty when `record` is in no
    /// live order.
    pub fn ahead(&self, record: u32, skip: usize, n: usize) -> Vec<(u32, bool)> {
        if !self.inner.live.load(Relaxed) {
            return Vec::new();
        }
        let s = self.inner.lock();
        let owner = s.owner.get(record as usize).copied().unwrap_or(NONE);
        let (id, p) = ((owner >> 32) as u32, (owner & u64::from(u32::MAX)) as usize);
        let Some(o) = (owner != NONE)
            .then(|| s.orders.iter().find(|o| o.id == id))
            .flatten()
        else {
            return Vec::new();
        };
        let start = p.saturating_add(1 + skip).min(o.issued);
        (start..o.issued.min(start.saturating_add(n)))
            .map(|q| (o.records[q], o.is_served(q)))
            .collect()
    }

    /// Waits (at most 1 s) until the order thread has issued what was announced so far.
    fn wait_issued(&self) {
        let inner = &self.inner;
        if inner.window == 0 {
            return;
        }
        let ticket = inner.ticket.fetch_add(1, Relaxed) + 1;
        let _ = self.wake.try_send(());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut done = inner.issued.0.lock().unwrap_or_else(|p| p.into_inner());
        while *done < ticket {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            done = (inner.issued.1.wait_timeout(done, left))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Whether `record` belongs to a live order and the live orders are sparse (they name
    /// fewer than 90% of the files): its read-ahead, and a read that misses, ask for the
    /// sample's exact bytes rather than the storage's units around it.
    pub fn wants_exact(&self, record: u32) -> bool {
        if !self.inner.live.load(Relaxed) {
            return false;
        }
        let s = self.inner.lock();
        s.owner
            .get(record as usize)
            .is_some_and(|&o| o != NONE && o != FINISHED)
            && self.inner.sparse(&s)
    }

    /// The `order` section of the stats.
    pub fn report(&self) -> OrderReport {
        let st = &self.inner.stats;
        let s = self.inner.lock();
        OrderReport {
            window_max_bytes: self.inner.window,
            live: s.orders.len() as u64,
            announced: st.announced.load(Relaxed),
            samples: s.orders.iter().map(|o| o.records.len() as u64).sum(),
            unresolved_paths: st.unresolved.load(Relaxed),
            read_ahead: st.read_ahead.load(Relaxed),
            read_ahead_bytes: st.read_ahead_bytes.load(Relaxed),
            window_bytes: s.orders.iter().map(|o| o.outstanding).sum(),
            served: st.served.load(Relaxed),
            cached: st.cached.load(Relaxed),
            released_unread: st.released.load(Relaxed),
            left: st.left.load(Relaxed),
            abandoned: st.abandoned.load(Relaxed),
        }
    }
}

impl super::ReadAhead {
    /// Starts a new announced order for process `pid` (replacing its previous one) and returns
    /// its id; records follow with [`Orders::extend`].
    pub fn announce(&self, pid: u32) -> u32 {
        let (id, unread) = self.order.announce(pid);
        self.release_unread(&unread);
        id
    }

    /// Appends `records` to order `id`. When they are the order's first, waits for the order
    /// thread to ask for the first batch (their fetches started, not finished), so a reader's
    /// first read right after the announcement finds them asked for (a remote block cache
    /// would otherwise fetch its whole block).
    pub fn extend_order(&self, id: u32, records: &[u32]) {
        if self.order.extend(id, records) {
            self.order.wait_issued();
        }
    }

    /// Up to `n` records after `record` in its live announced order, read ahead and not
    /// served yet (what decode-ahead decodes for a reader following the order).
    pub fn order_ahead(&self, record: u32, n: usize) -> Vec<u32> {
        let next = self.order.ahead(record, 0, n).into_iter();
        next.filter(|&(_, served)| !served)
            .map(|(r, _)| r)
            .collect()
    }

    /// A read from storage offset `from` of `ext` missed the cache: asks for the rest of the
    /// sample, or for its exact bytes when it belongs to a sparse order (the order thread had
    /// not asked for it yet; a remote block cache would fetch the blocks around it).
    pub(super) fn ask_missing(&self, ext: &Extent, from: u64) {
        let storage = self.samples.storage();
        if self.order.wants_exact(ext.record) {
            storage.will_need_exact(ext.object, std::slice::from_ref(&ext.range));
        } else {
            storage.will_need(ext.object, &(from..ext.range.end));
        }
    }

    /// Releases the stored pages of `records`, read ahead along an order and never read (as
    /// [`super::ReadAhead::release_stored`] allows), and takes back their read-ahead marks.
    pub(super) fn release_unread(&self, records: &[u32]) {
        let catalog = self.samples.catalog();
        for &r in records {
            let Ok(ext) = catalog.extent(record_ino(r)) else {
                continue;
            };
            if let Some(l) = self.ledgers.get(ext.object as usize) {
                l.unclaim(&ext.range);
            }
            self.release_stored(ext.object, &ext.range);
        }
    }
}

mod batch;
#[cfg(test)]
use batch::merge;
use batch::run;
#[cfg(test)]
mod tests;
