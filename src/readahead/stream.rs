//! Stream detection over storage offsets: which reads walk an object in order, and how far
//! ahead of each walk reading pays.
//!
//! A read that starts right after the previous read of a stream continues it; a read that
//! matches no stream starts a candidate stream in the least recently used slot. Streams are per
//! region of the object, not per file handle, so several DataLoader workers each walking their
//! own region are separate streams, while several readers sharing one walk (a pool taking files
//! in order, arriving a few samples out of order) are one.
//!
//! **How far ahead** is learnt from the *runs* the readers make: a run is the number of samples
//! one stream read before its slot was taken by another. A chunk-shuffling sampler makes runs
//! of 8–64 samples, a shuffled one runs of one sample, a sequential one a single endless run.
//! After a stream has read `n` samples, it reads ahead `k` more (to a sample boundary), the
//! largest `k` such that at least [`SURVIVAL`] of the recent runs that reached `n` samples
//! also reached `n + k` (the Kaplan–Meier view of run lengths), so that on average at least
//! that share of what is read ahead is served within the run. With too few runs seen to judge
//! ([`MIN_EVIDENCE`]), a stream reads ahead as many samples as it has read while it has read two,
//! twice as many from the third on, up to the cap: a run that has proven itself longer than
//! every run seen gets the full window in a few requests (on a disk limited in operations per
//! second each request counts). Streams that
//! meet (readers of one walk arriving out of order) are merged into one.
//! A stream asks again only when less than half of its look-ahead remains in front of the
//! reader, so requests grow with consumption, never with the number of reads.
//! `docs/DESIGN.md` gives the measurements behind this rule.

use std::ops::Range;
use std::sync::Mutex;

/// Number of concurrent streams tracked.
pub const STREAMS: usize = 16;
/// Largest read-ahead window, bytes (the default of `--prefetch-max-mb`).
pub const MAX_WINDOW: u64 = 64 << 20;
/// Share of recent runs that must reach a point for the bytes up to it to be read ahead.
pub const SURVIVAL: f64 = 0.9;
/// Runs that must have reached a stream's length before their lengths are trusted.
pub const MIN_EVIDENCE: u64 = 8;
/// Run lengths are counted exactly up to this many samples (the last count holds every run of
/// `BUCKETS - 1` samples or more).
const BUCKETS: usize = 1024;
/// Run counts are halved when they add up to this, so the lengths follow the current epoch.
const HISTORY: u64 = 4096;
/// How far past the end of the last read the next one may start and still continue a stream
/// (member headers and alignment padding sit between samples), bytes.
const GAP: u64 = 64 << 10;
/// Reads by other readers of the same walk may land this many samples before or after a
/// stream's end.
const OUT_OF_ORDER: u64 = 4;
/// Sample size counted at most in the tolerance, bytes.
const MAX_TOLERATED_READ: u64 = 256 << 10;

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    /// Start of the run this stream has covered.
    start: u64,
    /// End of the furthest read of this stream.
    next: u64,
    /// Read ahead up to here.
    ahead: u64,
    /// Reads seen (1 for a candidate).
    reads: u64,
    /// Bytes of those reads.
    bytes: u64,
    /// Length of the last read of this stream, bytes.
    len: u64,
    last_used: u64,
}

impl Stream {
    /// Whether a read starting at `start` continues this stream.
    fn continued_by(&self, start: u64) -> bool {
        if self.last_used == 0 {
            return false;
        }
        if self.reads < 2 {
            // A candidate (one read so far) needs the read right after it.
            return start + GAP / 2 >= self.next && start <= self.next + GAP;
        }
        let tol = GAP + OUT_OF_ORDER * self.len.min(MAX_TOLERATED_READ);
        start + tol >= self.next && start <= self.next + tol
    }
}

/// What the caller should do after a read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Advice {
    /// Range of the object to read ahead now, if any.
    pub prefetch: Option<Range<u64>>,
    /// The read fell inside a range this stream had already read ahead.
    pub hit: bool,
    /// The read continues a stream (the read before it ended right here): an in-order reader,
    /// even with read-ahead disabled.
    pub continues: bool,
    /// End of what the stream has read ahead (offset in the object; 0 when not a stream): what
    /// push-ahead may push without going past the expected end of the run.
    pub ahead: u64,
    /// The read followed a live announced order (set by the read-ahead, not the stream):
    /// the order reads ahead, and push-ahead follows it.
    pub followed: bool,
}

/// Counts of recent run lengths, in samples.
#[derive(Debug)]
struct Runs {
    hist: Vec<u64>,
    total: u64,
}

impl Runs {
    fn new() -> Runs {
        Runs {
            hist: vec![0; BUCKETS],
            total: 0,
        }
    }

    fn bucket(len: u64) -> usize {
        (len as usize).min(BUCKETS - 1)
    }

    fn record(&mut self, len: u64) {
        if len == 0 {
            return;
        }
        self.hist[Self::bucket(len)] += 1;
        self.total += 1;
        if self.total >= HISTORY {
            self.hist.iter_mut().for_each(|c| *c /= 2);
            self.total = self.hist.iter().sum();
        }
    }

    /// How many samples past `n` a run that has reached `n` samples is expected to go: the
    /// largest `k` such that at least [`SURVIVAL`] of the runs that reached `n` reached `n + k`,
    /// or `None` when fewer than [`MIN_EVIDENCE`] runs reached `n`; `u64::MAX` when the runs
    /// that reached it are longer than the counts measure.
    fn lookahead(&self, n: u64) -> Option<u64> {
        let b = Self::bucket(n);
        if b == BUCKETS - 1 {
            return None;
        }
        let reached: u64 = self.hist[b..].iter().sum();
        if reached < MIN_EVIDENCE {
            return None;
        }
        let need = (reached as f64 * SURVIVAL).ceil() as u64;
        let mut surviving = reached;
        let mut k = b;
        while k + 1 < BUCKETS {
            let after = surviving - self.hist[k];
            if after < need {
                break;
            }
            surviving = after;
            k += 1;
        }
        if k + 1 == BUCKETS {
            return Some(u64::MAX);
        }
        Some(k as u64 - b as u64)
    }
}

/// Stream detector over the offsets of one storage object.
#[derive(Debug)]
pub struct Streams {
    inner: Mutex<StreamTable>,
    max_window: u64,
    limit: u64,
}

#[derive(Debug)]
struct StreamTable {
    streams: Vec<Stream>,
    tick: u64,
    runs: Runs,
}

impl Streams {
    /// Streams over an object whose sample data ends at `limit` bytes, with look-ahead up to
    /// `max_window` bytes (0 disables read-ahead; streams are still detected).
    pub fn new(limit: u64, max_window: u64) -> Streams {
        Streams {
            inner: Mutex::new(StreamTable {
                streams: vec![Stream::default(); STREAMS],
                tick: 0,
                runs: Runs::new(),
            }),
            max_window,
            limit,
        }
    }

    /// Notes a read of object bytes `[start, end)` (one sample) and says what to read ahead.
    /// `sample_end(k, cap)` gives the object offset where the `k`-th sample after this one in
    /// storage order ends, or `cap` if that is further (the end of the last sample when there
    /// are fewer than `k`): read-ahead ends on sample boundaries.
    pub fn on_read(
        &self,
        start: u64,
        end: u64,
        sample_end: &mut dyn FnMut(u64, u64) -> u64,
    ) -> Advice {
        let Ok(mut g) = self.inner.lock() else {
            return Advice::default();
        };
        let StreamTable {
            streams,
            tick,
            runs,
        } = &mut *g;
        *tick += 1;
        let now = *tick;
        let Some(i) = streams.iter().position(|s| s.continued_by(start)) else {
            // Start a candidate stream in the least recently used slot; the run that slot
            // held has ended.
            if let Some(s) = streams.iter_mut().min_by_key(|s| s.last_used) {
                if s.last_used != 0 {
                    runs.record(s.reads);
                }
                *s = Stream {
                    start,
                    next: end,
                    ahead: end,
                    reads: 1,
                    bytes: end - start,
                    len: end - start,
                    last_used: now,
                };
            }
            return Advice::default();
        };
        let mut s = streams[i];
        s.last_used = now;
        s.len = end - start;
        s.reads += 1;
        s.bytes += end - start;
        let hit = end <= s.ahead && s.reads > 2;
        s.next = s.next.max(end);
        s.start = s.start.min(start);
        merge(streams, runs, i, &mut s);
        // Never read ahead into the run of another stream: its reader is reading it.
        let fence = streams
            .iter()
            .enumerate()
            .filter(|&(j, t)| j != i && t.last_used != 0 && t.start >= s.next)
            .map(|(_, t)| t.start)
            .min()
            .unwrap_or(u64::MAX);
        let mut advice = Advice {
            prefetch: None,
            hit,
            continues: true,
            ahead: s.ahead,
            followed: false,
        };
        if self.max_window == 0 {
            streams[i] = s;
            return advice; // detection only
        }
        // Without evidence: a pair of neighbours is common by chance in a shuffled walk, a third
        // in a row is not, so a stream reads ahead as many samples as it has read until then and
        // twice as many after.
        let k = runs
            .lookahead(s.reads)
            .unwrap_or(if s.reads > 2 { 2 * s.reads } else { s.reads });
        let cap = (s.next + self.max_window).min(self.limit).min(fence);
        // The look-ahead in bytes at the stream's mean sample size decides whether to ask; the
        // catalog is walked for the exact sample boundary only then (a walk per request, not per
        // read, since this runs under the lock every reader of the object takes).
        let estimate = k
            .saturating_mul(s.bytes / s.reads.max(1))
            .min(cap.saturating_sub(s.next));
        // Ask again only when less than half of the look-ahead remains in front of the reader.
        let remaining = s.ahead.saturating_sub(s.next);
        let from = s.ahead.max(s.next);
        // Nothing can be asked past the cap (the window, the data's end, another stream's
        // run): the catalog walk below would find nothing, on every read of the stream.
        if estimate > 0 && remaining < estimate / 2 + 1 && from < cap {
            let to = sample_end(k, cap).min(cap);
            if to > from {
                advice.prefetch = Some(from..to);
                s.ahead = to;
                advice.ahead = to;
            }
        }
        streams[i] = s;
        advice
    }

    /// Moves the stream that `range` continues (if any) past it without reading ahead: for
    /// samples pushed into the kernel's cache, which the reader will never READ.
    pub fn skip(&self, range: &Range<u64>) {
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        if let Some(s) = g
            .streams
            .iter_mut()
            .find(|s| s.reads >= 2 && s.continued_by(range.start))
        {
            s.next = s.next.max(range.end);
        }
    }

    /// Forgets every stream and run (after `drop-cache`).
    pub fn reset(&self) {
        if let Ok(mut g) = self.inner.lock() {
            g.streams.iter_mut().for_each(|s| *s = Stream::default());
            g.runs = Runs::new();
        }
    }
}

/// Merges into `s` (the stream in slot `i`) the streams it now overlaps or touches (readers of
/// one walk that arrived out of order started separate streams): one run, one look-ahead. A
/// stream that already went far past `s` from before it is a finished run (the walk's earlier
/// epoch): recorded in `runs` and dropped, not merged.
fn merge(streams: &mut [Stream], runs: &mut Runs, i: usize, s: &mut Stream) {
    for (j, t) in streams.iter_mut().enumerate() {
        if j != i && t.last_used != 0 && t.start <= s.start && t.next > s.next + GAP {
            // A stream that already went far past this one from before it: this one walks
            // its ground again (the next epoch). Its run has ended; merged, it would carry
            // this walk to its old end, where there is nothing left to read ahead.
            runs.record(t.reads);
            *t = Stream::default();
            continue;
        }
        if j != i && t.last_used != 0 && t.start <= s.next + GAP && s.start <= t.next + GAP {
            s.start = s.start.min(t.start);
            s.next = s.next.max(t.next);
            s.ahead = s.ahead.max(t.ahead);
            s.reads += t.reads;
            s.bytes += t.bytes;
            *t = Stream::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readahead::ledger::Ledger;
    use std::sync::atomic::Ordering::Relaxed;

    /// Deterministic pseudo-random numbers (splitmix64).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn shuffle<T>(&mut self, v: &mut [T]) {
            for i in (1..v.len()).rev() {
                v.swap(i, (self.next() % (i as u64 + 1)) as usize);
            }
        }
    }

    /// `sample_end` over `samples` for a read of bytes starting at `start`.
    fn ends(samples: &[Range<u64>], start: u64) -> impl FnMut(u64, u64) -> u64 + '_ {
        let i = samples.partition_point(|r| r.start < start);
        move |k, cap| {
            let j = (i as u64).saturating_add(k).min(samples.len() as u64 - 1) as usize;
            samples[j].end.min(cap)
        }
    }

    /// Feeds a read of sample `k` to `p`.
    fn read(p: &Streams, samples: &[Range<u64>], k: usize) -> Advice {
        let r = &samples[k];
        p.on_read(r.start, r.end, &mut ends(samples, r.start))
    }

    /// `n` samples laid out back to back as in a pack: sizes 8–200 KB (mean about 45 KB, like
    /// ImageNet JPEGs at bench-set scale), each after a 60-byte member header.
    fn layout(n: usize) -> Vec<Range<u64>> {
        let mut rng = Rng(42);
        let mut off = 0;
        (0..n)
            .map(|_| {
                let u = (rng.next() % 1000) as f64 / 1000.0;
                let len = (8_000.0 + 192_000.0 * u * u * u) as u64;
                off += 60;
                let r = off..off + len;
                off += len;
                r
            })
            .collect()
    }

    /// What a pass did: bytes asked for, bytes read, bytes read that had been read ahead.
    #[derive(Debug)]
    struct Pass {
        asked: u64,
        read: u64,
        covered: u64,
    }

    impl Pass {
        fn ratio(&self) -> f64 {
            self.asked as f64 / self.read as f64
        }
        fn coverage(&self) -> f64 {
            self.covered as f64 / self.read as f64
        }
    }

    /// Feeds reads of `samples` in `order` to a detector and a ledger as the read path does:
    /// the read is noted, what it advises is claimed in the ledger, then the read is served.
    fn pass(samples: &[Range<u64>], order: &[usize]) -> Pass {
        epochs(samples, &[order])
    }

    /// [`pass`] over several epochs, one detector and ledger throughout.
    fn epochs(samples: &[Range<u64>], orders: &[&[usize]]) -> Pass {
        let end = samples.last().map_or(0, |r| r.end);
        let p = Streams::new(end, MAX_WINDOW);
        let l = Ledger::new(end);
        let mut bytes = 0;
        for &k in orders.iter().flat_map(|o| o.iter()) {
            let r = &samples[k];
            if let Some(ahead) = read(&p, samples, k).prefetch {
                l.claim(&ahead, l.pass_of(r));
            }
            l.serve(r);
            bytes += r.end - r.start;
        }
        Pass {
            asked: l.asked.load(Relaxed),
            read: bytes,
            covered: l.served.load(Relaxed),
        }
    }

    /// The order in which reads from `readers` threads taking files in turn from `list` reach
    /// the daemon: in list order, each group of `readers` consecutive reads in random order.
    fn shared_list(list: &[usize], readers: usize, rng: &mut Rng) -> Vec<usize> {
        let mut out = list.to_vec();
        for g in out.chunks_mut(readers) {
            rng.shuffle(g);
        }
        out
    }

    const N: usize = 30_000;

    #[test]
    fn pack_order_one_reader_is_read_ahead_in_full_and_only_once() {
        let s = layout(N);
        let order: Vec<usize> = (0..N).collect();
        let p = pass(&s, &order);
        assert!(p.ratio() <= 1.1, "{p:?}");
        assert!(p.coverage() >= 0.99, "{p:?}");
    }

    #[test]
    fn pack_order_reader_pool_is_one_stream() {
        let s = layout(N);
        let list: Vec<usize> = (0..N).collect();
        let order = shared_list(&list, 4, &mut Rng(1));
        let p = pass(&s, &order);
        assert!(p.ratio() <= 1.1, "{p:?}");
        assert!(p.coverage() >= 0.98, "{p:?}");
    }

    #[test]
    fn shuffled_readers_read_nothing_ahead() {
        let s = layout(N);
        let mut list: Vec<usize> = (0..N).collect();
        let mut rng = Rng(7);
        rng.shuffle(&mut list);
        let order = shared_list(&list, 4, &mut rng);
        let p = pass(&s, &order);
        assert!(p.ratio() <= 0.01, "{p:?}");
    }

    /// The arrival order of runs of `run` consecutive samples in random run order, read by 4
    /// readers from one list.
    fn block_order(run: usize, rng: &mut Rng) -> Vec<usize> {
        let mut runs: Vec<Vec<usize>> = (0..N)
            .collect::<Vec<_>>()
            .chunks(run)
            .map(|c| c.to_vec())
            .collect();
        rng.shuffle(&mut runs);
        let list: Vec<usize> = runs.into_iter().flatten().collect();
        shared_list(&list, 4, rng)
    }

    fn block_shuffled(run: usize, seed: u64) -> Pass {
        pass(&layout(N), &block_order(run, &mut Rng(seed)))
    }

    #[test]
    fn later_epochs_are_read_ahead_again_and_only_once() {
        let s = layout(N);
        let mut rng = Rng(11);
        let (a, b) = (block_order(32, &mut rng), block_order(32, &mut rng));
        let inorder: Vec<usize> = (0..N).collect();
        let p = epochs(&s, &[&a, &b, &inorder]);
        assert!(p.ratio() <= 1.1, "{p:?}");
        assert!(p.coverage() >= 0.8, "{p:?}");
    }

    #[test]
    fn a_second_in_order_epoch_is_read_ahead_again() {
        // The first epoch's stream still spans the whole data when the second starts at 0:
        // merged into it, the second epoch was read ahead not at all (coverage 0.5).
        let s = layout(N);
        let inorder: Vec<usize> = (0..N).collect();
        let p = epochs(&s, &[&inorder, &inorder]);
        assert!(p.coverage() >= 0.9, "{p:?}");
        assert!(p.ratio() <= 1.1, "{p:?}");
    }

    #[test]
    fn block_shuffled_runs_of_8_are_read_ahead_within_runs() {
        let p = block_shuffled(8, 3);
        if std::env::var_os("LOOSEFS_PRINT").is_some() {
            for (name, p) in [("block8", &p), ("block64", &block_shuffled(64, 4))] {
                crate::eprintln_lossy!(
                    "{name}: {:.3} asked/read, {:.3} covered",
                    p.ratio(),
                    p.coverage()
                );
            }
        }
        assert!(p.ratio() <= 1.1, "{p:?}");
        assert!(p.coverage() >= 0.5, "{p:?}");
    }

    #[test]
    fn block_shuffled_runs_of_64_are_read_ahead_within_runs() {
        let p = block_shuffled(64, 4);
        assert!(p.ratio() <= 1.1, "{p:?}");
        assert!(p.coverage() >= 0.9, "{p:?}");
    }

    #[test]
    fn dataloader_workers_reading_consecutive_batches() {
        // 4 workers over an in-order sampler: worker w reads batches w, w+4, ..., of 32
        // samples each, front to back; the workers' reads interleave.
        let s = layout(N);
        let (workers, batch) = (4, 32);
        let lists: Vec<Vec<usize>> = (0..workers)
            .map(|w| (0..N).filter(|i| (i / batch) % workers == w).collect())
            .collect();
        let mut order = Vec::with_capacity(N);
        let mut rng = Rng(5);
        let mut pos = vec![0; workers];
        while order.len() < N {
            let w = (rng.next() % workers as u64) as usize;
            if let Some(&k) = lists[w].get(pos[w]) {
                order.push(k);
                pos[w] += 1;
            }
        }
        let p = pass(&s, &order);
        assert!(p.ratio() <= 1.1, "{p:?}");
        assert!(p.coverage() >= 0.8, "{p:?}");
    }

    #[test]
    fn order_changes_between_epochs_are_followed() {
        // A shuffled epoch teaches that runs are one sample long; a sequential epoch after it
        // must still get read-ahead once its run outgrows what was seen.
        let s = layout(N);
        let end = s.last().unwrap().end;
        let p = Streams::new(end, MAX_WINDOW);
        let mut list: Vec<usize> = (0..N).collect();
        Rng(9).shuffle(&mut list);
        for &k in &list {
            read(&p, &s, k);
        }
        let mut asked = 0;
        for k in 0..N {
            asked += read(&p, &s, k).prefetch.map_or(0, |a| a.end - a.start);
        }
        let data = end - s[0].start;
        assert!(asked as f64 >= 0.95 * data as f64, "{asked} of {data}");
    }

    #[test]
    fn look_ahead_grows_with_consumption_up_to_the_cap() {
        let s = layout(N);
        let p = Streams::new(s.last().unwrap().end, MAX_WINDOW);
        let mut sizes = Vec::new();
        for k in 0..N {
            if let Some(a) = read(&p, &s, k).prefetch {
                sizes.push(a.end - a.start);
            }
        }
        assert!(sizes.len() >= 10, "{sizes:?}");
        assert!(sizes.iter().all(|&w| w <= MAX_WINDOW), "{sizes:?}");
        assert_eq!(
            sizes[0],
            s[3].end - s[1].end,
            "starts with as many samples as read"
        );
        assert!(
            sizes.iter().any(|&w| w >= MAX_WINDOW / 2),
            "reaches the cap: {sizes:?}"
        );
        // Requests grow with consumption: far fewer requests than reads.
        assert!(
            sizes.len() < N / 50,
            "{} requests for {N} reads",
            sizes.len()
        );
    }

    #[test]
    fn skipped_samples_keep_the_stream() {
        let s = layout(200);
        let p = Streams::new(1 << 40, MAX_WINDOW);
        for k in 0..10 {
            read(&p, &s, k);
        }
        // Samples 10..74 are pushed (skipped), then the reader READs sample 74.
        for r in &s[10..74] {
            p.skip(r);
        }
        let a = read(&p, &s, 74);
        assert!(a.continues && (a.hit || a.prefetch.is_some()), "{a:?}");
    }

    #[test]
    fn prefetch_stops_at_the_end_of_the_data_and_can_be_disabled() {
        let mut s: Vec<Range<u64>> = (0..5).map(|k| k * 100_000..(k + 1) * 100_000).collect();
        s.push(1 << 30..(1 << 30) + 10);
        let p = Streams::new(300_000, MAX_WINDOW);
        read(&p, &s, 0);
        let a = read(&p, &s, 1);
        assert_eq!(a.prefetch, Some(200_000..300_000));
        let off = Streams::new(1 << 40, 0);
        read(&off, &s, 0);
        let a = read(&off, &s, 1);
        assert_eq!((a.prefetch, a.hit), (None, false));
        assert!(a.continues, "streams are still detected");
        assert!(!read(&off, &s, 5).continues);
    }
}
