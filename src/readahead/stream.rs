//! Stream detection over storage offsets: which reads walk an object in order, and how far
//! ahead of each walk to read. Modelled on mountpoint-s3's prefetcher: a stream starts on the
//! second consecutive read, with a 1 MiB window that doubles each time the reader consumes half
//! of it, up to a cap; a read that matches no stream starts a candidate stream, replacing the
//! least recently used one. Streams are per region of the object, not per file handle, so
//! several DataLoader workers each walking their own region are separate streams.
//!
//! A read continues a stream only when it starts near the stream's end: right after it for a
//! candidate; within a gap plus a few samples (the stream's last read size) either side once
//! the stream is established, so several readers sharing one walk (a reader pool taking files
//! in order) are one stream, while shuffled reads almost never land there. `docs/DESIGN.md`
//! gives the measurements behind this rule.

use std::ops::Range;
use std::sync::Mutex;

/// Number of concurrent streams tracked.
pub const STREAMS: usize = 16;
/// First read-ahead window, bytes.
pub const MIN_WINDOW: u64 = 1 << 20;
/// Largest read-ahead window, bytes.
pub const MAX_WINDOW: u64 = 64 << 20;
/// How far past the end of the last read the next one may start and still count as sequential
/// (member headers and alignment padding sit between samples), bytes.
const GAP: u64 = 64 << 10;
/// Reads by other readers of the same walk may land this many samples before or after a
/// stream's end.
const OUT_OF_ORDER: u64 = 4;
/// Sample size counted at most in the tolerance, bytes.
const MAX_TOLERATED_READ: u64 = 256 << 10;

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    /// End of the last read of this stream.
    next: u64,
    /// Prefetched up to here.
    ahead: u64,
    /// Current window; 0 for a candidate stream that has seen one read.
    window: u64,
    /// Length of the last read of this stream, bytes.
    len: u64,
    last_used: u64,
}

/// What the caller should do after a read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Advice {
    /// Range of the object to read ahead now, if any.
    pub prefetch: Option<Range<u64>>,
    /// The read fell inside a range this stream had already read ahead (an established stream).
    pub hit: bool,
    /// The read continues a stream (the read before it ended right here): an in-order reader,
    /// even with read-ahead disabled.
    pub continues: bool,
}

/// Stream detector over the offsets of one storage object.
#[derive(Debug)]
pub struct Streams {
    inner: Mutex<(Vec<Stream>, u64)>,
    max_window: u64,
    limit: u64,
}

impl Streams {
    /// Streams over an object whose sample data ends at `limit` bytes, with windows up to
    /// `max_window` bytes (0 disables read-ahead; streams are still detected).
    pub fn new(limit: u64, max_window: u64) -> Streams {
        Streams {
            inner: Mutex::new((vec![Stream::default(); STREAMS], 0)),
            max_window,
            limit,
        }
    }

    /// Notes a read of object bytes `[start, end)` and says what to read ahead.
    pub fn on_read(&self, start: u64, end: u64) -> Advice {
        let Ok(mut g) = self.inner.lock() else {
            return Advice::default();
        };
        let (streams, tick) = &mut *g;
        *tick += 1;
        let now = *tick;
        let found = streams.iter_mut().find(|s| {
            if s.window == 0 {
                // A candidate (one read so far) needs the read right after it.
                return s.last_used != 0 && start + GAP / 2 >= s.next && start <= s.next + GAP;
            }
            let tol = GAP + OUT_OF_ORDER * s.len.min(MAX_TOLERATED_READ);
            start + tol >= s.next && start <= s.next + tol
        });
        let Some(s) = found else {
            // Start a candidate stream in the least recently used slot.
            if let Some(s) = streams.iter_mut().min_by_key(|s| s.last_used) {
                *s = Stream {
                    next: end,
                    ahead: end,
                    window: 0,
                    len: end - start,
                    last_used: now,
                };
            }
            return Advice::default();
        };
        s.last_used = now;
        s.len = end - start;
        let hit = s.window > 0 && end <= s.ahead;
        s.next = s.next.max(end);
        let mut advice = Advice {
            prefetch: None,
            hit,
            continues: true,
        };
        if self.max_window == 0 {
            return advice; // detection only: a candidate for ever, no hits, no read-ahead
        }
        if s.window == 0 {
            s.window = MIN_WINDOW.min(self.max_window);
        }
        // Extend when less than half a window remains ahead of the reader.
        if s.ahead < s.next + s.window / 2 {
            let from = s.ahead.max(s.next);
            let to = (s.next + s.window).min(self.limit);
            if to > from {
                advice.prefetch = Some(from..to);
                s.ahead = to;
            }
            s.window = (s.window * 2).min(self.max_window);
        }
        advice
    }

    /// Moves the stream that `range` continues (if any) past it without reading ahead: for
    /// samples pushed into the kernel's cache, which the reader will never READ.
    pub fn skip(&self, range: &Range<u64>) {
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        if let Some(s) = g.0.iter_mut().find(|s| {
            s.window > 0
                && range.start + GAP / 2 >= s.next
                && range.start <= s.next + GAP + OUT_OF_ORDER * s.len.min(MAX_TOLERATED_READ)
        }) {
            s.next = s.next.max(range.end);
        }
    }

    /// Forgets every stream (after `drop-cache`).
    pub fn reset(&self) {
        if let Ok(mut g) = self.inner.lock() {
            g.0.iter_mut().for_each(|s| *s = Stream::default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads of 100 KB samples laid out every 104 KiB, starting at `base`.
    fn sample(base: u64, k: u64) -> (u64, u64) {
        let start = base + k * 104 * 1024;
        (start, start + 100_000)
    }

    #[test]
    fn sequential_reads_prefetch_with_a_growing_window() {
        let p = Streams::new(1 << 40, MAX_WINDOW);
        let (s, e) = sample(0, 0);
        assert_eq!(
            p.on_read(s, e),
            Advice::default(),
            "one read is not a stream yet"
        );
        let mut windows = Vec::new();
        let mut hits = 0;
        for k in 1..2000 {
            let (s, e) = sample(0, k);
            let a = p.on_read(s, e);
            hits += a.hit as u32;
            if let Some(r) = a.prefetch {
                assert!(r.start >= s, "prefetch never goes backwards");
                windows.push(r.end - r.start);
            }
        }
        assert!(windows.len() >= 3, "{windows:?}");
        assert!(
            windows.windows(2).take(4).all(|w| w[1] >= w[0]),
            "window grows: {windows:?}"
        );
        assert!(windows.iter().all(|&w| w <= MAX_WINDOW + MIN_WINDOW));
        assert!(
            hits > 1900,
            "almost every read after the start is a hit: {hits}"
        );
    }

    #[test]
    fn interleaved_regions_are_separate_streams_and_jumps_reset() {
        let p = Streams::new(1 << 40, MAX_WINDOW);
        let bases = [0u64, 10 << 30, 20 << 30, 30 << 30];
        let mut hits = [0; 4];
        for k in 0..500 {
            for (i, &b) in bases.iter().enumerate() {
                let (s, e) = sample(b, k);
                hits[i] += p.on_read(s, e).hit as u32;
            }
        }
        assert!(hits.iter().all(|&h| h > 450), "{hits:?}");
        // Random jumps: no prefetch at all.
        let p = Streams::new(1 << 40, MAX_WINDOW);
        let mut x: u64 = 12345;
        let mut prefetched = 0;
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let s = (x >> 20) % (100 << 30);
            prefetched += p.on_read(s, s + 100_000).prefetch.is_some() as u32;
        }
        assert!(prefetched < 5, "{prefetched}");
    }

    /// Reads of 40 KB samples every 44 KiB: `order` gives the sample of each read.
    fn bytes_prefetched(p: &Streams, order: impl Iterator<Item = u64>) -> (u64, u32) {
        let (mut bytes, mut hits) = (0, 0);
        for k in order {
            let s = k * 44 * 1024;
            let a = p.on_read(s, s + 40_000);
            bytes += a.prefetch.map_or(0, |r| r.end - r.start);
            hits += a.hit as u32;
        }
        (bytes, hits)
    }

    #[test]
    fn shuffled_readers_keep_no_false_streams() {
        // 30,000 samples (1.3 GB) in random order, as 4 shuffled readers produce them.
        let n = 30_000u64;
        let mut order: Vec<u64> = (0..n).collect();
        let mut x: u64 = 7;
        for i in (1..order.len()).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, ((x >> 33) % (i as u64 + 1)) as usize);
        }
        let p = Streams::new(n * 44 * 1024, MAX_WINDOW);
        let (bytes, _) = bytes_prefetched(&p, order.into_iter());
        let pack = n * 44 * 1024;
        assert!(
            bytes < pack / 20,
            "prefetched {bytes} bytes of a {pack}-byte pack for shuffled reads"
        );
    }

    #[test]
    fn readers_sharing_one_walk_are_one_stream() {
        // 4 readers taking files in order from a shared counter: reads arrive a little out of
        // order (here: each group of 4 reversed).
        let p = Streams::new(1 << 40, MAX_WINDOW);
        let order = (0..4000u64).map(|k| (k / 4) * 4 + 3 - k % 4);
        let (bytes, hits) = bytes_prefetched(&p, order);
        assert!(hits > 3800, "{hits}");
        assert!(bytes >= 4000 * 40_000, "{bytes}");
    }

    #[test]
    fn skipped_samples_keep_the_stream() {
        let p = Streams::new(1 << 40, MAX_WINDOW);
        for k in 0..10 {
            let (s, e) = sample(0, k);
            p.on_read(s, e);
        }
        // Samples 10..74 are pushed (skipped), then the reader READs sample 74.
        for k in 10..74 {
            let (s, e) = sample(0, k);
            p.skip(&(s..e));
        }
        let (s, e) = sample(0, 74);
        let a = p.on_read(s, e);
        assert!(a.hit || a.prefetch.is_some(), "{a:?}");
    }

    #[test]
    fn prefetch_stops_at_the_end_of_the_data_and_can_be_disabled() {
        let p = Streams::new(300_000, MAX_WINDOW);
        p.on_read(0, 100_000);
        let a = p.on_read(100_000, 200_000);
        assert_eq!(a.prefetch, Some(200_000..300_000));
        let off = Streams::new(1 << 40, 0);
        off.on_read(0, 10);
        let a = off.on_read(10, 20);
        assert_eq!((a.prefetch, a.hit), (None, false));
        assert!(a.continues, "streams are still detected");
        assert!(!off.on_read(1 << 30, (1 << 30) + 10).continues);
    }
}
