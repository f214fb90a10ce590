//! Exact ranges: the bytes of the samples a sparse announced order will read, fetched alone
//! (not their whole [`super::BLOCK`]s) into memory and served from there, so a rank reading
//! 1/N of the samples receives about 1/N of the object instead of nearly every block.
//!
//! Ranges closer than [`GAP`] share a GET (at most [`super::MERGE`] bytes). What is held is
//! bounded by [`HELD_MAX`]: a range read is kept after its read (the kernel reads a sample in
//! several READs after the whole-sample read that checks its CRC) until room is needed, least
//! recently used first; ranges never read (an abandoned order) go only once no read one is
//! left. Nothing here is written to the block cache: the ranges are not whole blocks, and the
//! next epoch's order is another.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Ranges whose gap is at most this many bytes share one GET: a gap costs its bytes, a GET
/// a round trip (at 100 MB/s and 50 ms, 16 KiB is 0.3% of a round trip's worth of bytes).
pub const GAP: u64 = 16 << 10;
/// Most bytes held in memory, bytes: twice the default order window (`--order-window-mb`,
/// 256 MiB), so ranges read ahead and ranges just read both fit. Past it a run is read ahead
/// as whole blocks.
pub const HELD_MAX: u64 = 512 << 20;

/// Longest a read waits for an exact range in flight before reading its blocks instead: past
/// the default GET budget (`--retry-timeout` 120 s plus `--request-timeout` 60 s), so it
/// matters only when a GET never ends (its runtime stopped).
const WAIT_MAX: Duration = Duration::from_secs(300);

/// One GET's bytes.
#[derive(Debug)]
struct ExactGet {
    end: u64,
    /// None while the GET is in flight.
    data: Option<Bytes>,
    /// Bytes asked for and not read yet (sorted, disjoint).
    unread: Vec<Range<u64>>,
    /// When it was last read (a tick of [`ExactRanges::tick`]).
    used: u64,
}

#[derive(Debug, Default)]
struct ExactRanges {
    /// By start offset; entries never overlap.
    entries: BTreeMap<u64, ExactGet>,
    held: u64,
    tick: u64,
}

/// Exact ranges held in memory for one object; see the module note.
#[derive(Debug)]
pub(super) struct Exact {
    state: Mutex<ExactRanges>,
    filled: Condvar,
    cap: AtomicU64,
    /// Entries now (a read skips the lock when there are none).
    count: AtomicU64,
    /// GETs of exact ranges completed, and their bytes.
    pub gets: AtomicU64,
    pub bytes: AtomicU64,
    /// Bytes of reads served from here.
    pub served: AtomicU64,
}

/// Removes `r` from the sorted, disjoint ranges `v`.
fn subtract(v: &mut Vec<Range<u64>>, r: &Range<u64>) {
    let mut out = Vec::with_capacity(v.len() + 1);
    for x in v.drain(..) {
        if x.end <= r.start || x.start >= r.end {
            out.push(x);
            continue;
        }
        if x.start < r.start {
            out.push(x.start..r.start);
        }
        if x.end > r.end {
            out.push(r.end..x.end);
        }
    }
    *v = out;
}

/// Groups sorted `ranges` into runs: neighbours at most [`GAP`] apart, a run at most `max`
/// bytes (a range longer than `max` is a run of its own). Returns each run's span and ranges.
pub(super) fn runs(ranges: &[Range<u64>], max: u64) -> Vec<(Range<u64>, Vec<Range<u64>>)> {
    let mut out: Vec<(Range<u64>, Vec<Range<u64>>)> = Vec::new();
    for r in ranges.iter().filter(|r| !r.is_empty()) {
        match out.last_mut() {
            Some((span, parts))
                if r.start >= span.start
                    && r.start <= span.end.saturating_add(GAP)
                    && r.end.max(span.end) - span.start <= max =>
            {
                span.end = span.end.max(r.end);
                parts.push(r.clone());
            }
            _ => out.push((r.clone(), vec![r.clone()])),
        }
    }
    out
}

impl Exact {
    /// Lowers (or raises) the most bytes held to `cap`; entries beyond it go as room is next
    /// needed.
    pub(super) fn set_cap(&self, cap: u64) {
        self.cap.store(cap, Relaxed);
    }

    /// An empty holder of at most `cap` bytes.
    pub(super) fn new(cap: u64) -> Exact {
        Exact {
            state: Mutex::default(),
            filled: Condvar::new(),
            cap: AtomicU64::new(cap),
            count: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ExactRanges> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes held now (in flight included).
    pub(super) fn held(&self) -> u64 {
        self.lock().held
    }

    /// The start of an entry holding all of `r`. Entries may overlap by the pages neighbours
    /// share, so a few entries starting before `r` are looked at.
    fn covering(s: &ExactRanges, r: &Range<u64>) -> Option<u64> {
        s.entries
            .range(..=r.start)
            .rev()
            .take(4)
            .find(|(_, e)| e.end >= r.end)
            .map(|(&k, _)| k)
    }

    /// Whether an entry holds (or is fetching) every byte of `r`.
    pub(super) fn covers(&self, r: &Range<u64>) -> bool {
        self.count.load(Relaxed) > 0 && Self::covering(&self.lock(), r).is_some()
    }

    /// Takes room for `n` more bytes, dropping entries whose bytes were all read (least
    /// recently read first), then others not in flight; false when there is no such room.
    fn make_room(&self, s: &mut ExactRanges, n: u64) -> bool {
        while s.held + n > self.cap.load(Relaxed) {
            let victim = s
                .entries
                .iter()
                .filter(|(_, e)| e.data.is_some())
                .min_by_key(|(_, e)| (!e.unread.is_empty(), e.used))
                .map(|(&k, _)| k);
            let Some(k) = victim else {
                return false;
            };
            if let Some(e) = s.entries.remove(&k) {
                s.held -= e.end - k;
                self.count.fetch_sub(1, Relaxed);
            }
        }
        s.held += n;
        true
    }

    /// Claims the runs of `ranges` (sorted, of one object) that no entry covers yet, each
    /// an entry in flight the caller fetches and hands to [`Exact::fill`]. Returns the runs
    /// claimed, and the ranges left out for want of room (to be read ahead some other way).
    pub(super) fn claim(
        &self,
        ranges: &[Range<u64>],
        max: u64,
    ) -> (Vec<Range<u64>>, Vec<Range<u64>>) {
        let mut s = self.lock();
        let fresh: Vec<Range<u64>> = ranges
            .iter()
            .filter(|r| Self::covering(&s, r).is_none())
            .cloned()
            .collect();
        let (mut claimed, mut left) = (Vec::new(), Vec::new());
        for (span, parts) in runs(&fresh, max) {
            if s.entries.contains_key(&span.start) || !self.make_room(&mut s, span.end - span.start)
            {
                left.extend(parts);
                continue;
            }
            s.tick += 1;
            let used = s.tick;
            s.entries.insert(
                span.start,
                ExactGet {
                    end: span.end,
                    data: None,
                    unread: parts,
                    used,
                },
            );
            self.count.fetch_add(1, Relaxed);
            claimed.push(span);
        }
        (claimed, left)
    }

    /// Hands in the answer to the GET of the claimed run starting at `start`: its bytes, or
    /// a failure (the entry is dropped; its reads fetch their blocks).
    pub(super) fn fill(&self, start: u64, res: &io::Result<Bytes>) {
        let mut s = self.lock();
        let ok = match res {
            Ok(b) => match s.entries.get_mut(&start) {
                Some(e) if e.data.is_none() && b.len() as u64 == e.end - start => {
                    e.data = Some(b.clone());
                    self.gets.fetch_add(1, Relaxed);
                    self.bytes.fetch_add(b.len() as u64, Relaxed);
                    true
                }
                _ => false,
            },
            Err(_) => false,
        };
        if !ok && let Some(e) = s.entries.remove(&start) {
            s.held -= e.end - start;
            self.count.fetch_sub(1, Relaxed);
        }
        drop(s);
        self.filled.notify_all();
    }

    /// Fills `buf` with the bytes at `off` when one entry holds them all (waiting for its
    /// GET when in flight); false when none does (the caller reads the block cache).
    pub(super) fn read(&self, off: u64, buf: &mut [u8]) -> bool {
        if self.count.load(Relaxed) == 0 || buf.is_empty() {
            return false;
        }
        let r = off..off + buf.len() as u64;
        let deadline = std::time::Instant::now() + WAIT_MAX;
        let mut s = self.lock();
        loop {
            let Some(k) = Self::covering(&s, &r) else {
                return false;
            };
            let e = &s.entries[&k];
            if let Some(d) = &e.data {
                let at = (off - k) as usize;
                buf.copy_from_slice(&d[at..at + buf.len()]);
                s.tick += 1;
                let tick = s.tick;
                if let Some(e) = s.entries.get_mut(&k) {
                    subtract(&mut e.unread, &r);
                    e.used = tick;
                }
                self.served.fetch_add(buf.len() as u64, Relaxed);
                return true;
            }
            // In flight: every GET ends (answer, failure or timeout) and fills its entry. The
            // bounded wait only re-checks the entry; past WAIT_MAX the read goes to the blocks.
            if std::time::Instant::now() >= deadline {
                return false;
            }
            s = self
                .filled
                .wait_timeout(s, Duration::from_secs(1))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Drops the entries overlapping `r` that hold their bytes (they failed a check: the next
    /// read fetches the blocks again).
    pub(super) fn forget(&self, r: &Range<u64>) {
        let mut s = self.lock();
        let keys: Vec<u64> = s
            .entries
            .range(..r.end)
            .filter(|(_, e)| e.end > r.start && e.data.is_some())
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            if let Some(e) = s.entries.remove(&k) {
                s.held -= e.end - k;
                self.count.fetch_sub(1, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_within_the_gap_share_a_run_and_runs_stay_under_the_limit() {
        let r = [0..100, 100 + GAP..200 + GAP, 300 + 3 * GAP..400 + 3 * GAP];
        let got = runs(&r, 1 << 20);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 0..200 + GAP);
        assert_eq!(got[0].1.len(), 2);
        let got = runs(&[0..600, 600..1200, 1200..1800], 1000);
        assert_eq!(
            got.iter().map(|g| g.0.clone()).collect::<Vec<_>>(),
            [0..600, 600..1200, 1200..1800]
        );
    }

    #[test]
    fn subtracting_leaves_the_parts_outside() {
        let mut v = vec![0..10, 20..30];
        subtract(&mut v, &(5..25));
        assert_eq!(v, [0..5, 25..30]);
        subtract(&mut v, &(0..100));
        assert!(v.is_empty());
    }

    #[test]
    fn held_bytes_stay_within_the_cap_dropping_read_entries_first() {
        let x = Exact::new(1000);
        let (c, left) = x.claim(&[0..400, 100_000..100_400], 1 << 20);
        assert_eq!((c.len(), left.len()), (2, 0));
        // No room while both are in flight.
        let late = 200_000..200_400;
        let (c2, left2) = x.claim(std::slice::from_ref(&late), 1 << 20);
        assert!(c2.is_empty());
        assert_eq!(left2, vec![late.clone()]);
        x.fill(0, &Ok(Bytes::from(vec![1u8; 400])));
        x.fill(100_000, &Ok(Bytes::from(vec![2u8; 400])));
        let mut b = vec![0u8; 400];
        assert!(x.read(100_000, &mut b));
        assert_eq!(b, vec![2u8; 400]);
        // The entry read goes first although the other was used earlier.
        let (c3, _) = x.claim(std::slice::from_ref(&late), 1 << 20);
        assert_eq!(c3, vec![late]);
        assert!(!x.read(100_000, &mut b));
        assert!(x.read(0, &mut b[..100]));
        assert!(x.held() <= 1000);
    }

    /// Rounds of random claims (filled with the right bytes, a failure or a short answer),
    /// reads and forgets over a 4 MiB object: every read answered from memory gives the
    /// object's bytes, and what is held never passes the cap.
    #[test]
    fn random_claims_reads_and_forgets_keep_bytes_right_and_memory_bounded() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        let len = 4u64 << 20;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let cap = 1u64 << 20;
        let x = Exact::new(cap);
        let mut served = 0;
        for _ in 0..300 {
            let mut ranges: Vec<Range<u64>> = (0..next(6) + 1)
                .map(|_| {
                    let s = next(len - 1);
                    s..(s + next(200_000) + 1).min(len)
                })
                .collect();
            ranges.sort_by_key(|r| r.start);
            ranges.dedup_by(|b, a| b.start < a.end);
            let (claimed, _) = x.claim(&ranges, 256 << 10);
            for span in claimed {
                let bytes = Bytes::copy_from_slice(&data[span.start as usize..span.end as usize]);
                match next(10) {
                    0 => x.fill(span.start, &Err(io::Error::other("503"))),
                    1 => x.fill(span.start, &Ok(bytes.slice(..bytes.len() / 2))),
                    _ => x.fill(span.start, &Ok(bytes)),
                }
            }
            assert!(x.held() <= cap, "{} held", x.held());
            for r in &ranges {
                let s = r.start + next(r.end - r.start);
                let e = (s + next(r.end - s) + 1).min(r.end);
                let mut buf = vec![0u8; (e - s) as usize];
                if x.read(s, &mut buf) {
                    assert_eq!(buf, &data[s as usize..e as usize]);
                    served += 1;
                }
            }
            if next(4) == 0 {
                let s = next(len);
                x.forget(&(s..s + next(500_000)));
            }
        }
        assert!(served > 100, "{served} reads served from memory");
    }

    #[test]
    fn a_failed_get_drops_its_entry_and_reads_fall_through() {
        let x = Exact::new(1 << 20);
        x.claim(std::slice::from_ref(&(0..400)), 1 << 20);
        x.fill(0, &Err(io::Error::other("503")));
        let mut b = [0u8; 10];
        assert!(!x.read(0, &mut b));
        assert_eq!(x.held(), 0);
        // A short answer is refused the same way.
        x.claim(std::slice::from_ref(&(0..400)), 1 << 20);
        x.fill(0, &Ok(Bytes::from(vec![0u8; 10])));
        assert!(!x.read(0, &mut b));
    }
}
