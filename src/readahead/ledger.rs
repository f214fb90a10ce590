//! The read-ahead ledger of one storage object: per granule (a page, or a larger unit on very
//! large objects), whether it has been read ahead and not served yet, and in which *pass* it
//! was last served. It makes read-ahead ask for each granule at most once per pass: never twice
//! before it is served (several streams, or a stream and a later run over the same bytes), and
//! never again in a pass that has served it already (a run's look-ahead reaching into a
//! neighbouring run read earlier in the epoch, whose pages were released after serving). It
//! also counts what read-ahead earned: bytes read ahead and later served, against all bytes
//! read ahead.
//!
//! Passes are per granule: a read of bytes whose granules were last served in pass `q - 1` is
//! in pass `q` (the first pass is 1), so each epoch over the data, or over any part of it, is
//! one pass further for the bytes it reads, without the daemon knowing where epochs begin.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

/// Most granules per ledger: the granule grows past a page on objects over 64 GiB, so that a
/// ledger stays within 18 MiB.
const MAX_GRANULES: u64 = 16 << 20;
const PAGE: u64 = 4096;

/// Read-ahead marks and serving passes of the granules of one object.
#[derive(Debug)]
pub struct Ledger {
    /// One bit per granule: read ahead and not served since.
    asked_bits: Vec<AtomicU64>,
    /// Per granule: the pass in which it was last served (0: never; wrapping).
    passes: Vec<AtomicU8>,
    /// Granule size, bytes (a power of two, at least a page).
    granule: u64,
    /// Bytes of granules read ahead, in all.
    pub asked: AtomicU64,
    /// Bytes of granules read ahead and later served.
    pub served: AtomicU64,
}

/// Whether pass `p` is before pass `q` (wrapping, within 127 passes).
fn before(p: u8, q: u8) -> bool {
    (q.wrapping_sub(p) as i8) > 0
}

impl Ledger {
    /// A ledger for an object of `len` bytes.
    pub fn new(len: u64) -> Ledger {
        let mut granule = PAGE;
        while len.div_ceil(granule) > MAX_GRANULES {
            granule *= 2;
        }
        let n = len.div_ceil(granule);
        Ledger {
            asked_bits: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            passes: (0..n).map(|_| AtomicU8::new(0)).collect(),
            granule,
            asked: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// Granules touching `r`.
    fn granules(&self, r: &Range<u64>) -> Range<u64> {
        let n = self.passes.len() as u64;
        (r.start / self.granule).min(n)..r.end.div_ceil(self.granule).min(n)
    }

    /// The pass a read of `r` belongs to: one after the oldest pass its granules were served in.
    pub fn pass_of(&self, r: &Range<u64>) -> u8 {
        let g = self.granules(r);
        let mut oldest: Option<u8> = None;
        for k in g {
            let p = self.passes[k as usize].load(Relaxed);
            oldest = Some(match oldest {
                Some(o) if !before(p, o) => o,
                _ => p,
            });
        }
        oldest.unwrap_or(0).wrapping_add(1)
    }

    /// Marks as read ahead the granules of `r` that are neither read ahead already nor served in
    /// pass `q` (or later), and returns their byte ranges (what to ask the storage for), in
    /// order, merged.
    pub fn claim(&self, r: &Range<u64>, q: u8) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = Vec::new();
        for k in self.granules(r) {
            if !before(self.passes[k as usize].load(Relaxed), q) {
                continue;
            }
            let bit = 1u64 << (k % 64);
            if self.asked_bits[(k / 64) as usize].fetch_or(bit, Relaxed) & bit != 0 {
                continue;
            }
            let (s, e) = (k * self.granule, (k + 1) * self.granule);
            match out.last_mut() {
                Some(last) if last.end == s => last.end = e,
                _ => out.push(s..e),
            }
        }
        let bytes: u64 = out.iter().map(|r| r.end - r.start).sum();
        self.asked.fetch_add(bytes, Relaxed);
        out
    }

    /// Notes that the bytes of `r` were served in the pass they belong to: granules touching
    /// them (a granule shared by two samples counts with the first served) get that pass, and
    /// those read ahead count as served.
    pub fn serve(&self, r: &Range<u64>) {
        let q = self.pass_of(r);
        let mut cleared = 0u64;
        for k in self.granules(r) {
            self.passes[k as usize].store(q, Relaxed);
            let bit = 1u64 << (k % 64);
            let w = &self.asked_bits[(k / 64) as usize];
            if w.load(Relaxed) & bit != 0 && w.fetch_and(!bit, Relaxed) & bit != 0 {
                cleared += 1;
            }
        }
        if cleared > 0 {
            self.served.fetch_add(cleared * self.granule, Relaxed);
        }
    }

    /// Takes back the read-ahead marks of the granules lying wholly inside `r`, bytes read
    /// ahead and released unread (an abandoned order): later read-ahead may ask for them again.
    pub fn unclaim(&self, r: &Range<u64>) {
        let n = self.passes.len() as u64;
        let g = r.start.div_ceil(self.granule).min(n)..(r.end / self.granule).min(n);
        let mut cleared = 0u64;
        for k in g {
            let bit = 1u64 << (k % 64);
            if self.asked_bits[(k / 64) as usize].fetch_and(!bit, Relaxed) & bit != 0 {
                cleared += 1;
            }
        }
        let _ = (self.asked).fetch_update(Relaxed, Relaxed, |a| {
            Some(a.saturating_sub(cleared * self.granule))
        });
    }

    /// Bytes read ahead and not served (yet, or ever).
    pub fn unserved(&self) -> u64 {
        self.asked
            .load(Relaxed)
            .saturating_sub(self.served.load(Relaxed))
    }

    /// Forgets every mark and pass (after `drop-cache`: the bytes read ahead are gone).
    pub fn clear(&self) {
        self.asked_bits.iter().for_each(|w| w.store(0, Relaxed));
        self.passes.iter().for_each(|p| p.store(0, Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_each_granule_once_until_served() {
        let l = Ledger::new(10 << 20);
        assert_eq!(l.claim(&(0..10_000), 1), vec![0..12_288]);
        assert_eq!(l.claim(&(5_000..20_000), 1), vec![12_288..20_480]);
        assert_eq!(l.claim(&(0..20_000), 1), Vec::<Range<u64>>::new());
        assert_eq!(l.asked.load(Relaxed), 20_480);
        l.serve(&(0..8192));
        assert_eq!(l.served.load(Relaxed), 8192);
        // Served in pass 1: not read ahead again in pass 1, but in pass 2.
        assert_eq!(l.claim(&(0..20_000), 1), Vec::<Range<u64>>::new());
        assert_eq!(l.pass_of(&(0..8192)), 2);
        assert_eq!(l.claim(&(0..20_000), 2), vec![0..8192]);
        // A partly served granule counts as served.
        l.serve(&(8200..8300));
        assert_eq!(l.served.load(Relaxed), 12_288);
        assert_eq!(l.unserved(), 28_672 - 12_288);
    }

    #[test]
    fn passes_follow_each_part_of_the_data() {
        let l = Ledger::new(1 << 20);
        // Bytes 0..64 KiB read three times, 64..128 KiB once: each part is in its own pass.
        for _ in 0..3 {
            l.serve(&(0..65_536));
        }
        l.serve(&(65_536..131_072));
        assert_eq!(l.pass_of(&(0..65_536)), 4);
        assert_eq!(l.pass_of(&(65_536..131_072)), 2);
        // A read touching a granule of a later pass belongs to the oldest pass among its own.
        assert_eq!(l.pass_of(&(60_000..131_072)), 2);
        // Wrapping: 300 passes later the order is still right.
        for _ in 0..300 {
            l.serve(&(0..4096));
        }
        assert!(before(l.passes[1].load(Relaxed), l.pass_of(&(0..4096))));
    }

    #[test]
    fn long_ranges_merge_and_clamp() {
        let l = Ledger::new(1 << 30);
        l.claim(&(4096 * 10..4096 * 20), 1);
        let got = l.claim(&(0..4096 * 200), 1);
        assert_eq!(got, vec![0..4096 * 10, 4096 * 20..4096 * 200]);
        l.serve(&(0..4096 * 200));
        assert_eq!(l.served.load(Relaxed), 4096 * 200);
        assert_eq!(l.claim(&(0..4096 * 64), 2), vec![0..4096 * 64]);
        assert!(l.claim(&((1 << 30)..(1 << 31)), 1).is_empty());
    }

    #[test]
    fn huge_objects_use_larger_granules() {
        let l = Ledger::new(1 << 40);
        assert!(l.passes.len() as u64 <= MAX_GRANULES);
        assert_eq!(l.granule, 65_536);
    }
}
