//! Many small remote objects laid end to end as one object, so that one block cache holds them
//! all: the loose objects under a prefix (`s3://bucket/imagenet/train/`) share one cache file
//! and one block table instead of a directory, a table and a data file per object (1,000
//! objects made 3.5 s of mount, mostly those files' creation and their fsyncs at unmount).
//!
//! Object `k` sits at `base[k]` (page-aligned, in the tree's order, as a pack lays samples
//! out), the gaps between objects read as zeros. A GET of a range becomes one GET per object
//! it overlaps, each carrying that object's own pin (its ETag from the listing), all in flight
//! together within the store's request limit. A block therefore gathers several objects, and
//! a replaced object must not take its neighbours down: an object that answers "replaced",
//! "refused" or "not what was asked" is marked gone with that error, its bytes are left as
//! zeros (never served: [`ObjectSource::check_served`] answers its error for every read that
//! touches it, and the block cache never stores such bytes) and its neighbours are served. A network failure after the
//! retries fails the whole GET, as for any object (nothing is stored; the next read tries
//! again).

use super::source::{ObjectSource, ObjectStats, Pin};
use anyhow::bail;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// One object of the run and where it starts, bytes.
#[derive(Debug)]
pub struct Member {
    /// The object, pinned.
    pub source: Arc<dyn ObjectSource>,
    /// Its first byte's offset in the run.
    pub base: u64,
}

impl Member {
    fn size(&self) -> u64 {
        self.source.pin().map_or(0, |p| p.size)
    }
}

/// Objects laid end to end as one object (see the module's text).
#[derive(Debug)]
pub struct EndToEnd {
    url: String,
    pin: Pin,
    members: Vec<Member>,
    /// Objects found gone, by index, with the kind of error their reads answer.
    gone: Mutex<std::collections::HashMap<usize, (io::ErrorKind, String)>>,
    /// Set once `gone` holds an object: until then a read's check takes no lock.
    any_gone: AtomicBool,
    /// The last ranges answered with a gone object's gap, kept (at most [`HELD`]) because
    /// the block cache never stores them: reading their other objects again asks no GET.
    held: Mutex<std::collections::VecDeque<(Range<u64>, Bytes)>>,
    stats: ObjectStats,
}

/// Most ranges holding a gone object's gap kept in memory (each at most one merged GET).
const HELD: usize = 8;

impl EndToEnd {
    /// The run of `members` (bases increasing, none overlapping the next) named `url`, `len`
    /// bytes long, pinned to `etag` (a digest of what the members are pinned to: the cache
    /// of one run at one listing). Errors: no members, bases not increasing or overlapping,
    /// a member not pinned or running past `len`.
    pub fn new(
        url: &str,
        members: Vec<Member>,
        len: u64,
        etag: String,
    ) -> anyhow::Result<EndToEnd> {
        if members.is_empty() {
            bail!("{url}: no objects");
        }
        let mut end = 0;
        for m in &members {
            if m.source.pin().is_none() {
                bail!("{}: not pinned", m.source.url());
            }
            if m.base < end {
                bail!("{}: overlaps the object before it", m.source.url());
            }
            end = m.base + m.size();
        }
        if end > len {
            bail!("{url}: the objects run past the run's {len} bytes");
        }
        Ok(EndToEnd {
            url: url.to_string(),
            pin: Pin {
                size: len,
                etag,
                version: None,
                modified: None,
            },
            members,
            gone: Mutex::new(Default::default()),
            any_gone: AtomicBool::new(false),
            held: Mutex::new(Default::default()),
            stats: ObjectStats::default(),
        })
    }

    /// Indexes of the members whose bytes overlap `r`.
    fn overlapping(&self, r: &Range<u64>) -> Range<usize> {
        let first = self
            .members
            .partition_point(|m| m.base + m.size() <= r.start);
        let last = self.members.partition_point(|m| m.base < r.end);
        first..last.max(first)
    }

    fn is_gone(&self, k: usize) -> bool {
        (self.gone.lock().unwrap_or_else(|p| p.into_inner())).contains_key(&k)
    }

    /// Bytes `r` from a kept range that holds a gone object's gap.
    fn held_bytes(&self, r: &Range<u64>) -> Option<Bytes> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let (h, b) = held
            .iter()
            .find(|(h, _)| h.start <= r.start && r.end <= h.end)?;
        Some(b.slice((r.start - h.start) as usize..(r.end - h.start) as usize))
    }

    /// Members found gone so far.
    pub fn gone(&self) -> usize {
        self.gone.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Whether a member's error is its own for good (replaced, refused, a wrong answer): its
/// neighbours are served without it. Any other error is the network's, for the whole GET.
fn its_own(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StaleNetworkFileHandle
            | io::ErrorKind::PermissionDenied
            | io::ErrorKind::NotFound
            | io::ErrorKind::InvalidData
    )
}

impl ObjectSource for EndToEnd {
    fn url(&self) -> &str {
        &self.url
    }

    fn pin(&self) -> Option<&Pin> {
        Some(&self.pin)
    }

    fn get(&self, r: Range<u64>) -> BoxFuture<'_, io::Result<Bytes>> {
        Box::pin(async move {
            if r.end > self.pin.size || r.start > r.end {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: bytes {}..{} of {}",
                        self.url, r.start, r.end, self.pin.size
                    ),
                ));
            }
            if let Some(b) = self.held_bytes(&r) {
                return Ok(b);
            }
            let mut out = BytesMut::zeroed((r.end - r.start) as usize);
            let parts = self.overlapping(&r).filter_map(|k| {
                let m = &self.members[k];
                let (s, e) = (r.start.max(m.base), r.end.min(m.base + m.size()));
                let gone = self.is_gone(k);
                (s < e && !gone)
                    .then_some(async move { (k, s, m.source.get(s - m.base..e - m.base).await) })
            });
            for (k, s, got) in futures::future::join_all(parts).await {
                match got {
                    Ok(b) => {
                        self.stats.gets.fetch_add(1, Relaxed);
                        self.stats.bytes.fetch_add(b.len() as u64, Relaxed);
                        let at = (s - r.start) as usize;
                        out[at..at + b.len()].copy_from_slice(&b);
                    }
                    Err(e) if its_own(&e) => {
                        self.stats.failed.fetch_add(1, Relaxed);
                        let mut gone = self.gone.lock().unwrap_or_else(|p| p.into_inner());
                        self.any_gone.store(true, SeqCst);
                        gone.entry(k).or_insert_with(|| {
                            log::error!(
                                "{}: not served ({e}); the objects beside it are",
                                self.members[k].source.url()
                            );
                            (e.kind(), e.to_string())
                        });
                    }
                    Err(e) => {
                        self.stats.failed.fetch_add(1, Relaxed);
                        return Err(e);
                    }
                }
            }
            let out = out.freeze();
            if self.check_served(&r).is_err() {
                let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                if held.len() == HELD {
                    held.pop_front();
                }
                held.push_back((r, out.clone()));
            }
            Ok(out)
        })
    }

    fn check_served(&self, r: &Range<u64>) -> io::Result<()> {
        // Set under the lock before the object is recorded: a read that sees it unset
        // holds bytes fetched before any object went.
        if !self.any_gone.load(SeqCst) {
            return Ok(());
        }
        let gone = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        for k in self.overlapping(r) {
            if let Some((kind, why)) = gone.get(&k) {
                return Err(io::Error::new(*kind, why.clone()));
            }
        }
        Ok(())
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.members[0].source.runtime()
    }

    fn stats(&self) -> &ObjectStats {
        &self.stats
    }

    fn max_requests(&self) -> usize {
        self.members[0].source.max_requests()
    }

    fn offline(&self) -> bool {
        self.members[0].source.offline()
    }

    fn open_tail(&self, _n: u64) -> BoxFuture<'_, anyhow::Result<Bytes>> {
        Box::pin(async move { bail!("{}: a run of objects has no tail to open", self.url) })
    }

    fn fetch_to(&self, _dest: &Path) -> anyhow::Result<u64> {
        bail!("{}: a run of objects is not fetched whole", self.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::object::fake::FakeStore;
    use crate::storage::object::source::ObjectStore;

    /// Three objects of the fake store laid out at 0, 4096 and 8192; the run and the store.
    fn run() -> (EndToEnd, FakeStore) {
        let store = FakeStore::default();
        let mut members = Vec::new();
        for (i, body) in [&b"aaaa"[..], b"bbbbbbbb", b"cc"].iter().enumerate() {
            let url = format!("s3://b/p/{i}");
            store.put(&url, body.to_vec());
            let o = store.object(&url).unwrap();
            o.set_pin(store.get(&url).unwrap().current());
            members.push(Member {
                source: o,
                base: i as u64 * 4096,
            });
        }
        let run = EndToEnd::new("s3://b/p/", members, 8194, "\"digest\"".into()).unwrap();
        (run, store)
    }

    #[test]
    fn a_range_gathers_its_objects_each_with_one_get_and_zeros_between() {
        let (run, _store) = run();
        let b = run.get_blocking(2..4100).unwrap();
        assert_eq!(&b[..2], b"aa");
        assert!(b[2..4094].iter().all(|&x| x == 0), "the gap");
        assert_eq!(&b[4094..], b"bbbb");
        assert_eq!(run.stats.gets.load(Relaxed), 2);
        assert_eq!(&run.get_blocking(8192..8194).unwrap()[..], b"cc");
        assert!(run.get_blocking(8192..8195).is_err(), "past the end");
        assert!(run.check_served(&(0..8194)).is_ok());
    }

    #[test]
    fn a_replaced_object_answers_estale_and_its_neighbours_are_served() {
        let (run, store) = run();
        store.put("s3://b/p/1", b"new".to_vec());
        let b = run.get_blocking(0..8194).unwrap();
        assert_eq!(&b[..4], b"aaaa");
        assert_eq!(&b[8192..], b"cc");
        assert!(b[4096..4104].iter().all(|&x| x == 0), "never its new bytes");
        assert_eq!(run.gone(), 1);
        let e = run.check_served(&(4000..4097)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StaleNetworkFileHandle);
        assert!(run.check_served(&(0..4)).is_ok());
        assert!(run.check_served(&(8192..8194)).is_ok());
        // The block cache never stores such a range; asked again, it comes from memory.
        let gets = run.stats.gets.load(Relaxed) + run.stats.failed.load(Relaxed);
        assert_eq!(run.get_blocking(0..8194).unwrap(), b);
        assert_eq!(run.get_blocking(8192..8194).unwrap()[..], b"cc"[..]);
        assert_eq!(
            run.stats.gets.load(Relaxed) + run.stats.failed.load(Relaxed),
            gets
        );
    }

    #[test]
    fn members_must_be_pinned_and_in_order() {
        let (_, store) = run();
        let o = store.object("s3://b/p/0").unwrap();
        let m = |base| Member {
            source: o.clone(),
            base,
        };
        assert!(EndToEnd::new("u", vec![], 1, String::new()).is_err());
        assert!(EndToEnd::new("u", vec![m(0), m(2)], 8192, String::new()).is_err());
        assert!(EndToEnd::new("u", vec![m(0)], 3, String::new()).is_err());
        let unpinned = Member {
            source: store.object("s3://b/p/2").unwrap(),
            base: 0,
        };
        assert!(EndToEnd::new("u", vec![unpinned], 8, String::new()).is_err());
    }
}
