//! The seam between the block cache and the network: an [`ObjectSource`] is one remote object
//! pinned to one version, read by ranged GETs. [`super::object::ObjectClient`] (object_store
//! over S3 and HTTPS) is the real one; [`FakeObject`] holds the bytes in memory and can fail,
//! stall, flip bytes or be replaced, so the block cache's claim, hold, check and evict logic is
//! tested in plain `cargo test` (as mountpoint-s3 tests its prefetcher over a mock client and a
//! failure-injecting wrapper).

use bytes::Bytes;
use futures::future::BoxFuture;
use std::io;
use std::ops::Range;
use std::sync::atomic::AtomicU64;

/// What a remote object is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// Size of the object, bytes.
    pub size: u64,
    /// The ETag as the server sent it (quotes included).
    pub etag: String,
    /// The object version (S3 versioned buckets), if reported.
    pub version: Option<String>,
}

/// Request counters of one client (since it was made).
#[derive(Debug, Default)]
pub struct ObjectStats {
    /// GETs completed.
    pub gets: AtomicU64,
    /// Body bytes received.
    pub bytes: AtomicU64,
    /// GETs that failed after their retries.
    pub failed: AtomicU64,
}

/// Why a GET of a pinned object failed. Carried inside the `io::Error` the read path sees
/// (its kind is [`ObjectError::kind`], so the errno is chosen without parsing text; the
/// value itself can be taken back with `get_ref().downcast_ref::<ObjectError>()`).
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The object is no longer the pinned version: 412 to `If-Match`, an answer carrying
    /// another ETag (a server that ignores `If-Match`), or 404 for an object that existed.
    /// Answered ESTALE: no retry brings the pinned bytes back.
    #[error("{url}: object replaced or removed since it was pinned (ETag {etag}): {why}")]
    Replaced {
        /// The object.
        url: String,
        /// The ETag it was pinned to.
        etag: String,
        /// What showed it.
        why: String,
    },
    /// 401/403: the credentials do not (or no longer) allow the GET.
    #[error("{url}: access denied: {why}")]
    Denied {
        /// The object.
        url: String,
        /// The server's answer.
        why: String,
    },
    /// An answer that is not the range asked for (short, misplaced, or of another size).
    #[error("{url}: GET of bytes {start}..{end}: {why}")]
    BadAnswer {
        /// The object.
        url: String,
        /// First byte asked for.
        start: u64,
        /// End of the range asked for.
        end: u64,
        /// What was wrong with the answer.
        why: String,
    },
    /// The server could not be reached or kept failing (after the retries).
    #[error("{url}: {why}")]
    Network {
        /// The object.
        url: String,
        /// The last failure.
        why: String,
    },
}

impl ObjectError {
    /// The `io::ErrorKind` the read path maps to an errno: `StaleNetworkFileHandle` (ESTALE)
    /// for [`ObjectError::Replaced`], `PermissionDenied`, `InvalidData` for a bad answer,
    /// `Other` (EIO) for the network.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            ObjectError::Replaced { .. } => io::ErrorKind::StaleNetworkFileHandle,
            ObjectError::Denied { .. } => io::ErrorKind::PermissionDenied,
            ObjectError::BadAnswer { .. } => io::ErrorKind::InvalidData,
            ObjectError::Network { .. } => io::ErrorKind::Other,
        }
    }
}

impl From<ObjectError> for io::Error {
    fn from(e: ObjectError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

/// One remote object pinned to a version (size + ETag), read by ranged GETs.
pub trait ObjectSource: Send + Sync + std::fmt::Debug {
    /// The object's URL (names it in messages).
    fn url(&self) -> &str;

    /// What the object is pinned to; `None` before it was opened.
    fn pin(&self) -> Option<&Pin>;

    /// GETs bytes `r` of the pinned version. Errors: the object was replaced (its ETag no
    /// longer matches), access refused, a short answer, a network failure after the retries.
    fn get(&self, r: Range<u64>) -> BoxFuture<'_, io::Result<Bytes>>;

    /// The runtime GETs run on (read-ahead fetches are spawned on it).
    fn runtime(&self) -> &tokio::runtime::Runtime;

    /// Request counters.
    fn stats(&self) -> &ObjectStats;

    /// Most GETs in flight at once.
    fn max_requests(&self) -> usize;

    /// True when the object is not reached at all (`--offline`: every GET refused).
    fn offline(&self) -> bool {
        false
    }

    /// [`ObjectSource::get`], waiting for it (not from the runtime's own worker threads).
    fn get_blocking(&self, r: Range<u64>) -> io::Result<Bytes> {
        self.runtime().block_on(self.get(r))
    }
}

/// A remote object that is not reached (`--offline`): pinned to the size and ETag a block
/// cache recorded, every GET refused without a request. A mount over it serves what its block
/// cache holds.
#[derive(Debug)]
pub struct OfflineObject {
    url: String,
    pin: Pin,
    rt: tokio::runtime::Runtime,
    stats: ObjectStats,
}

impl OfflineObject {
    /// The object at `url` as a cache recorded it. Errors: the runtime cannot start.
    pub fn new(url: &str, pin: Pin) -> io::Result<OfflineObject> {
        Ok(OfflineObject {
            url: url.to_string(),
            pin,
            // Read-ahead spawns its fetches on the runtime: a worker must run them (to fail).
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .build()?,
            stats: ObjectStats::default(),
        })
    }
}

impl ObjectSource for OfflineObject {
    fn url(&self) -> &str {
        &self.url
    }

    fn pin(&self) -> Option<&Pin> {
        Some(&self.pin)
    }

    fn get(&self, r: Range<u64>) -> BoxFuture<'_, io::Result<Bytes>> {
        self.stats
            .failed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let why = format!(
            "{}: bytes {}..{} are not in the block cache and the mount is --offline",
            self.url, r.start, r.end
        );
        Box::pin(async move { Err(io::Error::other(why)) })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    fn stats(&self) -> &ObjectStats {
        &self.stats
    }

    fn max_requests(&self) -> usize {
        1
    }

    fn offline(&self) -> bool {
        true
    }
}

/// An in-memory object for tests: the bytes of one version, and faults to inject. Every
/// successful GET is counted in [`ObjectSource::stats`], as the real client counts them.
#[cfg(test)]
#[derive(Debug)]
pub struct FakeObject {
    rt: tokio::runtime::Runtime,
    url: String,
    pin: Pin,
    data: std::sync::Mutex<Bytes>,
    stats: ObjectStats,
    /// The next this many GETs fail (a 503 after the retries).
    pub fail_next: std::sync::atomic::AtomicU32,
    /// Every GET fails with "connection refused" while set (an outage).
    pub down: std::sync::atomic::AtomicBool,
    /// Every GET waits this long before answering, ms.
    pub stall_ms: std::sync::atomic::AtomicU64,
    /// Every answer has its first byte flipped while set (a corrupting proxy).
    pub flip: std::sync::atomic::AtomicBool,
    replaced: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
impl FakeObject {
    /// An object at `url` holding `data`, pinned to ETag `"v1"`.
    pub fn new(url: &str, data: Vec<u8>) -> FakeObject {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        FakeObject {
            rt,
            url: url.to_string(),
            pin: Pin {
                size: data.len() as u64,
                etag: "\"v1\"".into(),
                version: None,
            },
            data: std::sync::Mutex::new(Bytes::from(data)),
            stats: ObjectStats::default(),
            fail_next: Default::default(),
            down: Default::default(),
            stall_ms: Default::default(),
            flip: Default::default(),
            replaced: Default::default(),
        }
    }

    /// Replaces the object with `data` (a new version): GETs pinned to the old ETag fail.
    pub fn replace(&self, data: Vec<u8>) {
        if let Ok(mut d) = self.data.lock() {
            *d = Bytes::from(data);
        }
        self.replaced
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
impl ObjectSource for FakeObject {
    fn url(&self) -> &str {
        &self.url
    }

    fn pin(&self) -> Option<&Pin> {
        Some(&self.pin)
    }

    fn get(&self, r: Range<u64>) -> BoxFuture<'_, io::Result<Bytes>> {
        use std::sync::atomic::Ordering::{Relaxed, SeqCst};
        Box::pin(async move {
            let stall = self.stall_ms.load(Relaxed);
            if stall > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(stall)).await;
            }
            let fail = |why: &str| {
                self.stats.failed.fetch_add(1, Relaxed);
                Err(ObjectError::Network {
                    url: self.url.clone(),
                    why: why.into(),
                }
                .into())
            };
            if self.down.load(SeqCst) {
                return fail("connection refused");
            }
            if self
                .fail_next
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return fail("503 Slow Down (after the retries)");
            }
            if self.replaced.load(SeqCst) {
                self.stats.failed.fetch_add(1, Relaxed);
                return Err(ObjectError::Replaced {
                    url: self.url.clone(),
                    etag: self.pin.etag.clone(),
                    why: "412 Precondition Failed".into(),
                }
                .into());
            }
            let data = self
                .data
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?
                .clone();
            let end = r.end.min(data.len() as u64);
            if r.start >= end {
                return fail("range not satisfiable (416)");
            }
            let mut b = data.slice(r.start as usize..end as usize);
            if self.flip.load(SeqCst) {
                let mut v = b.to_vec();
                v[0] ^= 0xff;
                b = Bytes::from(v);
            }
            self.stats.gets.fetch_add(1, Relaxed);
            self.stats.bytes.fetch_add(b.len() as u64, Relaxed);
            Ok(b)
        })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    fn stats(&self) -> &ObjectStats {
        &self.stats
    }

    fn max_requests(&self) -> usize {
        4
    }
}
