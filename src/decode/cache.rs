//! The decoded cache: decoded images by sample (index record), least recently used evicted
//! first, bounded by a byte budget (the pixel bytes). It also does single flight: the first
//! miss on a sample leads a decode, later readers of the same sample queue behind it and are
//! answered with its result, so one sample is decoded once however many page-cache reads of
//! it arrive together. One mutex guards both; it is held only for map operations, never
//! across a decode.

use super::codec::Rgb;
use crate::catalog::FsError;
use lru::LruCache;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Called with a decode's outcome.
pub type Waiter = Box<dyn FnOnce(Result<Arc<Rgb>, FsError>) + Send>;

/// What [`DecodedCache::join`] found.
pub enum Join {
    /// Cached: the waiter is handed back unused.
    Hit(Arc<Rgb>, Waiter),
    /// A decode of this sample is under way; the waiter will be called when it ends.
    Queued,
    /// Nobody is decoding it: the caller must decode and call [`DecodedCache::complete`].
    Lead,
}

struct DecodedLru {
    lru: LruCache<u32, Arc<Rgb>>,
    bytes: u64,
    evictions: u64,
    inflight: HashMap<u32, Vec<Waiter>>,
}

pub use crate::report::CacheFigures;

/// Decoded images bounded by `budget` bytes of pixels.
pub struct DecodedCache {
    budget: u64,
    state: Mutex<DecodedLru>,
}

impl DecodedCache {
    /// An empty cache holding at most `budget` bytes of pixels.
    pub fn new(budget: u64) -> DecodedCache {
        DecodedCache {
            budget,
            state: Mutex::new(DecodedLru {
                lru: LruCache::unbounded(),
                bytes: 0,
                evictions: 0,
                inflight: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DecodedLru> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached image of `key`, marking it most recently used.
    pub fn get(&self, key: u32) -> Option<Arc<Rgb>> {
        self.lock().lru.get(&key).cloned()
    }

    /// Number of decodes under way.
    pub fn in_flight(&self) -> usize {
        self.lock().inflight.len()
    }

    /// Cached image, or a place in the queue of a decode under way, or the lead of a new one.
    pub fn join(&self, key: u32, waiter: Waiter) -> Join {
        let mut s = self.lock();
        if let Some(px) = s.lru.get(&key).cloned() {
            return Join::Hit(px, waiter);
        }
        if let Some(q) = s.inflight.get_mut(&key) {
            q.push(waiter);
            return Join::Queued;
        }
        s.inflight.insert(key, vec![waiter]);
        Join::Lead
    }

    /// Marks `key` as being decoded with nobody waiting (read-ahead). False when it is cached
    /// or already being decoded.
    pub fn start(&self, key: u32) -> bool {
        let mut s = self.lock();
        if s.inflight.contains_key(&key) || s.lru.contains(&key) {
            return false;
        }
        s.inflight.insert(key, Vec::new());
        true
    }

    /// Ends the decode of `key`: caches a success (evicting least recently used images until
    /// it fits; an image larger than the whole budget is not cached) and returns the waiters.
    pub fn complete(&self, key: u32, result: &Result<Arc<Rgb>, FsError>) -> Vec<Waiter> {
        let mut s = self.lock();
        let waiters = s.inflight.remove(&key).unwrap_or_default();
        if let Ok(px) = result {
            let len = px.pixels.len() as u64;
            if len <= self.budget {
                while s.bytes + len > self.budget {
                    let Some((_, old)) = s.lru.pop_lru() else {
                        break;
                    };
                    s.bytes -= old.pixels.len() as u64;
                    s.evictions += 1;
                }
                if let Some(old) = s.lru.put(key, px.clone()) {
                    s.bytes -= old.pixels.len() as u64;
                }
                s.bytes += len;
            }
        }
        waiters
    }

    /// Drops every cached image (decodes under way finish and are cached as usual).
    pub fn clear(&self) {
        let mut s = self.lock();
        s.lru.clear();
        s.bytes = 0;
    }

    /// Current figures.
    pub fn figures(&self) -> CacheFigures {
        let s = self.lock();
        CacheFigures {
            budget_bytes: self.budget,
            bytes: s.bytes,
            entries: s.lru.len() as u64,
            evictions: s.evictions,
            in_flight: s.inflight.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn img(n: usize) -> Arc<Rgb> {
        Arc::new(Rgb {
            width: n as u32,
            height: 1,
            pixels: vec![7; n * 3],
            fallback: false,
            warning: None,
        })
    }

    #[test]
    fn budget_evicts_least_recently_used() {
        let c = DecodedCache::new(30);
        for k in 0..3 {
            assert!(c.start(k));
            c.complete(k, &Ok(img(3))); // 9 bytes each
        }
        assert!(c.get(0).is_some()); // 0 is now the most recent; 1 is the oldest
        assert!(c.start(3));
        c.complete(3, &Ok(img(3)));
        let f = c.figures();
        assert_eq!((f.bytes, f.entries, f.evictions), (27, 3, 1));
        assert!(c.get(1).is_none() && c.get(0).is_some());
        // Larger than the budget: served, never cached.
        assert!(c.start(9));
        c.complete(9, &Ok(img(20)));
        assert!(c.get(9).is_none());
        assert_eq!(c.figures().bytes, 27);
    }

    #[test]
    fn one_lead_per_key_and_every_waiter_answered() {
        let c = DecodedCache::new(1 << 20);
        let answered = Arc::new(AtomicUsize::new(0));
        let waiter = || -> Waiter {
            let a = answered.clone();
            Box::new(move |r| {
                assert_eq!(r.unwrap().pixels.len(), 6);
                a.fetch_add(1, Ordering::SeqCst);
            })
        };
        assert!(matches!(c.join(5, waiter()), Join::Lead));
        assert!(matches!(c.join(5, waiter()), Join::Queued));
        assert!(matches!(c.join(5, waiter()), Join::Queued));
        assert!(!c.start(5));
        let ws = c.complete(5, &Ok(img(2)));
        assert_eq!(ws.len(), 3);
        let px = img(2);
        ws.into_iter().for_each(|w| w(Ok(px.clone())));
        assert_eq!(answered.load(Ordering::SeqCst), 3);
        assert!(matches!(c.join(5, waiter()), Join::Hit(..)));
        // A failed decode is answered and not cached.
        assert!(matches!(c.join(6, waiter()), Join::Lead));
        let ws = c.complete(6, &Err(FsError::Corrupt("bad".into())));
        assert_eq!(ws.len(), 1);
        assert!(c.get(6).is_none() && c.figures().in_flight == 0);
    }
}
