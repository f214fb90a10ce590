//! Issuing an order's read-ahead: the order thread takes the next batch of every live order,
//! sorted into storage order and merged, and asks the storage for it (whole units for dense
//! orders, exact ranges for sparse ones).

use super::{Order, OrderShared, PAGE};
use crate::catalog::ObjectId;
use crate::ino::record_ino;
use crate::readahead::ledger::Ledger;
use crate::samples::Samples;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;

/// A batch to read ahead: storage ranges in storage order, whether the live orders are
/// sparse, and the samples and bytes it holds.
struct Batch {
    ranges: Vec<(ObjectId, Range<u64>)>,
    sparse: bool,
    samples: u64,
    bytes: u64,
}

/// The next batch to read ahead, over every live order: for each order with at least a
/// quarter of what it may hold free, the next unserved positions up to what it may hold, as
/// storage ranges sorted into storage order and merged where they share a page. Orders served
/// in full (by the kernel's cache) are dropped.
fn next_batch(inner: &OrderShared, samples: &Samples) -> Batch {
    let catalog = samples.catalog();
    let stats = &inner.stats;
    let (mut out, mut bytes) = (Vec::new(), 0u64);
    let mut s = inner.lock();
    let super::OrderState { orders, owner, .. } = &mut *s;
    for o in orders.iter_mut() {
        let allowed = o.allowed(inner.window);
        if o.outstanding_n > 0 && allowed - o.outstanding.min(allowed) < allowed / 4 {
            continue;
        }
        while o.issued < o.records.len() && o.outstanding < allowed {
            let (p, r) = (o.issued, o.records[o.issued]);
            o.issued += 1;
            if inner.held.contains(r) {
                if o.serve(p) {
                    stats.cached.fetch_add(1, Relaxed);
                }
                continue;
            }
            if o.is_served(p) {
                continue;
            }
            // A position that does not own its record (a repeat, or a sample another order
            // read ahead) is left to the owner: served here as far as this order goes.
            if owner.get(r as usize) != Some(&(u64::from(o.id) << 32 | p as u64)) {
                o.serve(p);
                continue;
            }
            let Ok(ext) = catalog.extent(record_ino(r)) else {
                continue;
            };
            o.outstanding += ext.len();
            o.outstanding_n += 1;
            bytes += ext.len();
            out.push((ext.object, ext.range));
        }
    }
    while let Some(k) = s.orders.iter().position(Order::done) {
        s.remove(k);
    }
    inner.live.store(!s.orders.is_empty(), Relaxed);
    let sparse = inner.sparse(&s);
    drop(s);
    Batch {
        samples: out.len() as u64,
        bytes,
        ranges: merge(out),
        sparse,
    }
}

/// Sorts `ranges` into storage order and merges those that share a page.
pub(super) fn merge(mut ranges: Vec<(ObjectId, Range<u64>)>) -> Vec<(ObjectId, Range<u64>)> {
    ranges.sort_by_key(|(o, r)| (*o, r.start));
    let mut out: Vec<(ObjectId, Range<u64>)> = Vec::with_capacity(ranges.len());
    for (obj, r) in ranges {
        match out.last_mut() {
            Some((o, last)) if *o == obj && r.start <= last.end.next_multiple_of(PAGE) => {
                last.end = last.end.max(r.end);
            }
            _ => out.push((obj, r)),
        }
    }
    out
}

/// The order thread: on each wake, reads ahead batches until every order's window is full.
pub(super) fn run(inner: &OrderShared, samples: &Samples, ledgers: &[Ledger], wake: &Receiver<()>) {
    while wake.recv().is_ok() {
        let ticket = inner.ticket.load(Relaxed);
        issue(inner, samples, ledgers);
        let mut done = inner.issued.0.lock().unwrap_or_else(|p| p.into_inner());
        *done = (*done).max(ticket);
        inner.issued.1.notify_all();
    }
}

/// Reads ahead batches until every order's window is full (nothing with a window of 0).
fn issue(inner: &OrderShared, samples: &Samples, ledgers: &[Ledger]) {
    if inner.window == 0 {
        return;
    }
    let storage = samples.storage();
    loop {
        let batch = next_batch(inner, samples);
        if batch.ranges.is_empty() {
            break;
        }
        let sparse = batch.sparse;
        // Exact ranges go to the storage per object, in storage order.
        let mut exact: Vec<Range<u64>> = Vec::new();
        let mut exact_obj = None;
        for (obj, r) in batch.ranges {
            let Some(ledger) = ledgers.get(obj as usize) else {
                continue;
            };
            if sparse && exact_obj != Some(obj) {
                if let Some(o) = exact_obj {
                    storage.will_need_exact(o, &std::mem::take(&mut exact));
                }
                exact_obj = Some(obj);
            }
            let spans = ledger.claim(&r, ledger.pass_of(&r));
            if sparse {
                // The sample's own bytes and the pages claimed for it: a page shared with a
                // neighbour read ahead earlier is fetched again rather than split between two,
                // and a sample whose every page was claimed before (a tiny one between two
                // neighbours) is still asked (the storage skips bytes it holds).
                let a = spans.first().map_or(r.start, |x| x.start.min(r.start));
                let b = spans.last().map_or(r.end, |x| x.end.max(r.end));
                exact.push(a..b);
                continue;
            }
            for span in spans {
                storage.will_need(obj, &span);
            }
        }
        if let Some(o) = exact_obj {
            storage.will_need_exact(o, &exact);
        }
        // Counted once asked for: a reader waiting for its sample to be read ahead (a test)
        // then finds it asked.
        inner.stats.read_ahead.fetch_add(batch.samples, Relaxed);
        (inner.stats.read_ahead_bytes).fetch_add(batch.bytes, Relaxed);
    }
}
