//! The seam between the block cache and the network: an [`ObjectSource`] is one remote object
//! pinned to one version, read by ranged GETs. [`super::ObjectClient`] (object_store
//! over S3 and HTTPS) is the real one; [`super::fake::FakeObject`] holds the bytes in memory and can fail,
//! stall, flip bytes or be replaced, so the block cache's claim, hold, check and evict logic is
//! tested in plain `cargo test` (as mountpoint-s3 tests its prefetcher over a mock client and a
//! failure-injecting wrapper).

use bytes::Bytes;
use futures::future::BoxFuture;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// One object of a prefix's listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key relative to the prefix.
    pub key: String,
    /// What the listing says of it (size, ETag, version); `None` without an ETag.
    pub pin: Option<Pin>,
    /// Its `LastModified`, seconds since the Unix epoch (0: not given).
    pub modified: i64,
}

/// One level of a prefix's listing (a LIST with `delimiter=/`): the objects directly under
/// it and the common prefixes (subdirectories) below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Level {
    /// Objects directly under the prefix (keys without a `/`), sorted by key.
    pub objects: Vec<Listed>,
    /// Names of the common prefixes directly under it, without their trailing `/`, sorted.
    pub dirs: Vec<String>,
    /// The page token of the rest of the level when only its first page (1000 entries) was
    /// listed; `None`: complete.
    pub more: Option<String>,
}

/// What a remote object is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// Size of the object, bytes.
    pub size: u64,
    /// The ETag as the server sent it (quotes included).
    pub etag: String,
    /// The object version (S3 versioned buckets), if reported.
    pub version: Option<String>,
    /// For an object listed without an ETag (an HTTP server's directory listing, where
    /// `etag` is empty): its `Last-Modified`, seconds since the Unix epoch. Every GET then
    /// carries `If-Unmodified-Since` and its answer must say the same `Last-Modified` and size.
    pub modified: Option<i64>,
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

    /// Whether bytes `r`, as [`ObjectSource::get`] answered them, may be served: the error
    /// their reads answer where they are not the object's bytes (a run of objects laid end to
    /// end whose member there was replaced, [`super::end_to_end`]). Default: always.
    fn check_served(&self, _r: &Range<u64>) -> io::Result<()> {
        Ok(())
    }

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

    /// Opens the object: one GET of its last `n` bytes (fewer when it is smaller), which also
    /// gives its size and ETag; both are pinned for the life of this handle (unless it was
    /// pinned already). Returns the tail.
    ///
    /// Errors: no such object (404, kind `NotFound`), access refused (403), no ETag in the
    /// answer (the object could not be pinned), a network failure after the retries.
    ///
    /// Default, for a source pinned when it was made: one [`ObjectSource::get`] of the pinned
    /// version's last `n` bytes; an unpinned one is refused.
    fn open_tail(&self, n: u64) -> BoxFuture<'_, anyhow::Result<Bytes>> {
        Box::pin(async move {
            let size = self.pin().map(|p| p.size).ok_or_else(|| {
                anyhow::anyhow!("{}: not pinned, so its tail cannot be found", self.url())
            })?;
            Ok(self.get(size.saturating_sub(n)..size).await?)
        })
    }

    /// [`ObjectSource::open_tail`], waiting for it.
    fn open_tail_blocking(&self, n: u64) -> anyhow::Result<Bytes> {
        self.runtime().block_on(self.open_tail(n))
    }

    /// Pins the object to `pin` (what a listing or an index said of it) without a request:
    /// every later GET carries its ETag. No effect when already pinned (the default: a
    /// source pinned when it was made).
    fn set_pin(&self, _pin: Pin) {}

    /// Downloads the whole object into a new file `dest` with one GET (carrying the pin when
    /// pinned, else pinning the object to what the answer says); `dest` is written to a
    /// temporary file beside it and renamed, never left half-written. Returns its bytes.
    ///
    /// Errors: 404 and 403 (their `io::ErrorKind` inside the error), the object replaced since
    /// it was pinned, a network failure, `dest`'s directory cannot be written.
    ///
    /// Default, for a source pinned when it was made: one [`ObjectSource::get_blocking`] of
    /// the whole pinned version; an unpinned one is refused.
    fn fetch_to(&self, dest: &Path) -> anyhow::Result<u64> {
        let size = (self.pin().map(|p| p.size))
            .ok_or_else(|| anyhow::anyhow!("{}: not pinned, so not fetched whole", self.url()))?;
        let b = self.get_blocking(0..size)?;
        let dir = dest.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, &b)?;
        tmp.persist(dest).map_err(|e| e.error)?;
        Ok(b.len() as u64)
    }
}

/// Where a source's objects are: the buckets and hosts one set of remote options reaches
/// (endpoint, credentials, TLS, request limits). The openers of remote sources take one, so
/// they run over [`super::Remote`] (S3 and HTTPS) and over the in-memory fake store
/// of the tests alike.
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// A handle on the object at `url`, not yet pinned (nothing is requested). Handles of
    /// objects on one bucket or host share their connections and the request limit.
    ///
    /// Errors: a malformed URL, plain http where it is not allowed, no credentials.
    fn object(&self, url: &str) -> anyhow::Result<Arc<dyn ObjectSource>>;

    /// Every object under the prefix `url` (`s3://bucket/prefix/`), sorted by key.
    ///
    /// Errors: the listing is refused (403), or the store cannot list (HTTP).
    fn list(&self, url: &str) -> anyhow::Result<Vec<Listed>>;

    /// The first level of the prefix `url` (`s3://bucket/prefix/`): one LIST with
    /// `delimiter=/`, at least its first page of 1000 entries (the rest: [`Level::more`]). The
    /// default lists everything and groups it.
    ///
    /// Errors: as [`ObjectStore::list`].
    fn list_level(&self, url: &str) -> anyhow::Result<Level> {
        let mut level = Level::default();
        for l in self.list(url)? {
            match l.key.split_once('/') {
                // Sorted by key: a subdirectory's keys come together.
                Some((d, _)) if level.dirs.last().is_some_and(|x| x == d) => {}
                Some((d, _)) => level.dirs.push(d.to_string()),
                None => level.objects.push(l),
            }
        }
        Ok(level)
    }

    /// Every object under the prefix `url` whose first level is `level` (from
    /// [`ObjectStore::list_level`]): `level`'s objects and every object below its
    /// subdirectories, these listed concurrently. Sorted by key. The default lists the whole
    /// prefix again. `progress` shows a count of the keys listed.
    ///
    /// Errors: as [`ObjectStore::list`].
    fn list_below(
        &self,
        url: &str,
        level: Level,
        progress: crate::progress::Progress,
    ) -> anyhow::Result<Vec<Listed>> {
        let _ = (level, progress);
        self.list(url)
    }

    /// Writes the local file `src` as the object `url`, replacing any object there.
    ///
    /// Errors: the file cannot be read, or the store refuses the upload.
    fn upload(&self, url: &str, src: &Path) -> anyhow::Result<()>;
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
