//! One remote object's client ([`ObjectClient`]): ranged GETs pinned to the ETag (and
//! version) seen when it was opened, each with `If-Match`, on a small tokio runtime beside the
//! FUSE threads; a request limit in permits (small GETs count for less); an outage state
//! shared by the objects of one store; whole-object fetches and multipart uploads.

use super::errors::{describe, io_error};
use super::remote_config::RemoteConfig;
use super::source::{self, ObjectError, ObjectStats, Pin};
use super::{endpoints, same_etag, store, stores};
use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Bytes of one part of a multipart upload; a file of at most this goes up in one PUT (as the
/// AWS CLI's multipart threshold does, at 8 MiB).
const UPLOAD_PART: usize = 16 << 20;

/// An outage of a store (bucket or host), shared by the clients of its objects: set when a
/// GET failed after all its retries (`--retry-timeout` spent), cleared by the next GET that
/// succeeds. While it lasts, each GET makes one attempt without retries, so a reader sees EIO
/// once per outage after the retry time, and at once after that, instead of the whole retry
/// time again for every READ the kernel sends (82 s for one read with `--retry-timeout 20`).
#[derive(Debug, Default)]
pub(super) struct Outage(AtomicBool);

/// Permits of the request limit one large GET takes: the limit holds `--max-requests` ×
/// this, so `--max-requests` GETs of [`SMALL_GET`] × this bytes or more are in flight at once,
/// and up to this many times as many small ones.
pub const PERMITS_PER_REQUEST: u32 = 8;

/// A GET takes one permit per this many bytes (at least one, at most
/// [`PERMITS_PER_REQUEST`]). A link's bandwidth-delay product (100 MB/s × 50 ms = 5 MB) is
/// filled by a few merged 16 MiB GETs, but small objects fetched whole (39 KB ImageNet-sized
/// JPEGs under a prefix) need ~128 in flight: 16 GETs of them filled 0.27× of such a link,
/// 128 filled 0.49× shuffled and 0.80× along an announced order (`bench/loose_prefix.py
/// --data ../shared/data/imagenet-sample --cap 100 --latency 50 --max-requests 16|128`,
/// 2026-11-27).
pub const SMALL_GET: u64 = 128 << 10;

/// Permits a GET of `len` bytes takes (see [`SMALL_GET`]).
pub fn permits(len: u64) -> u32 {
    len.div_ceil(SMALL_GET).clamp(1, PERMITS_PER_REQUEST as u64) as u32
}

/// The network runtime of a store's clients, shut down without waiting when the last of them
/// goes: a task that never ends (a `credential_process` that never answers, run on its
/// blocking threads) must not hold the process at its exit.
pub(super) struct NetRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for NetRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("a runtime until dropped")
    }
}

impl Drop for NetRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A client of one remote object.
pub struct ObjectClient {
    pub(super) rt: Arc<NetRuntime>,
    pub(super) store: Arc<dyn ObjectStore>,
    /// How the store's prefixes are listed (S3's pages, an HTTP server's directories).
    pub(super) lister: store::Lister,
    /// The same store with no retries: used during an outage.
    pub(super) quick: Arc<dyn ObjectStore>,
    pub(super) outage: Arc<Outage>,
    pub(super) path: ObjectPath,
    pub(super) url: String,
    pub(super) pin: std::sync::OnceLock<Pin>,
    /// Where the pin has no ETag (an HTTP listing gives none): the first answer's, which
    /// every later answer must carry ([`ObjectClient::other_etag`]).
    pub(super) first_etag: std::sync::OnceLock<String>,
    pub(super) limit: Arc<tokio::sync::Semaphore>,
    pub(super) max_requests: usize,
    /// Set once a GET found the object replaced (logged once).
    pub(super) replaced: AtomicBool,
    /// Request counters.
    pub stats: ObjectStats,
}

impl std::fmt::Debug for ObjectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectClient")
            .field("url", &self.url)
            .field("pin", &self.pin.get())
            .finish()
    }
}

impl ObjectClient {
    /// A client of the object at `url` (`s3://bucket/key`, `https://host/path`, or
    /// `http://host/path` with `--allow-http`). Nothing is requested yet; the host is
    /// resolved and connected to once ([`endpoints::preflight`]).
    ///
    /// Errors: a malformed URL, plain http without `--allow-http`, an unreadable CA bundle, no
    /// credentials when instance metadata is disabled (`AWS_EC2_METADATA_DISABLED=true`), a
    /// host that does not resolve or refuses the connection.
    pub fn new(url: &str, args: &RemoteConfig) -> Result<ObjectClient> {
        let (store, path, lister) = endpoints::store_for(url, args)?;
        let no_retry = RemoteConfig {
            retries: 0,
            ..args.clone()
        };
        let (quick, _, _) = endpoints::store_for(url, &no_retry)?;
        endpoints::preflight(url, args)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("loosefs-net")
            .enable_all()
            .build()
            .context("cannot start the network runtime")?;
        Ok(ObjectClient {
            rt: Arc::new(NetRuntime(Some(rt))),
            store,
            lister,
            quick,
            outage: Arc::default(),
            path,
            url: url.to_string(),
            pin: std::sync::OnceLock::new(),
            first_etag: std::sync::OnceLock::new(),
            limit: Arc::new(tokio::sync::Semaphore::new(
                args.max_requests.max(1) * PERMITS_PER_REQUEST as usize,
            )),
            max_requests: args.max_requests.max(1),
            replaced: AtomicBool::new(false),
            stats: ObjectStats::default(),
        })
    }

    /// Most large GETs in flight at once (`--max-requests`; small ones count for less, see
    /// [`permits`]).
    pub fn max_requests(&self) -> usize {
        self.max_requests
    }

    /// The object's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the object is pinned to (after [`ObjectClient::open_tail_async`]).
    pub fn pin(&self) -> Option<&Pin> {
        self.pin.get()
    }

    /// The runtime GETs run on (for spawning read-ahead fetches).
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    /// A client of the object at `url` on the same store (bucket or host) as this one,
    /// sharing its runtime, connection pool and request limit (`--max-requests` counts the
    /// GETs of both); its pin and counters are its own. Nothing is requested yet.
    ///
    /// Errors: `url` is malformed or names another bucket, host or scheme.
    pub fn sibling(&self, url: &str) -> Result<ObjectClient> {
        let path = endpoints::sibling_path(&self.url, url)?;
        Ok(ObjectClient {
            rt: self.rt.clone(),
            store: self.store.clone(),
            lister: self.lister.clone(),
            quick: self.quick.clone(),
            outage: self.outage.clone(),
            path,
            url: url.to_string(),
            pin: std::sync::OnceLock::new(),
            first_etag: std::sync::OnceLock::new(),
            limit: self.limit.clone(),
            max_requests: self.max_requests,
            replaced: AtomicBool::new(false),
            stats: ObjectStats::default(),
        })
    }

    /// Opens the object: one GET of its last `n` bytes (fewer if it is smaller), which also
    /// gives its size and ETag; both are pinned for the life of the client. Returns the tail.
    ///
    /// Errors: 404 (no such object), 403 (credentials refused), no ETag in the answer (the
    /// object could not be pinned), a network failure after the retries.
    pub async fn open_tail_async(&self, n: u64) -> Result<Bytes> {
        let url = self.url.clone();
        let suffix = stores::store_of(&url).is_none_or(|s| s.suffix_ranges());
        let r = async {
            let opts = if suffix {
                GetOptions {
                    range: Some(GetRange::Suffix(n)),
                    ..Default::default()
                }
            } else {
                // A store without suffix ranges (Azure): the size and ETag first, then the
                // tail of that very version.
                let meta = self.store.head(&self.path).await?;
                GetOptions {
                    range: Some(GetRange::Bounded(meta.size.saturating_sub(n)..meta.size)),
                    if_match: meta.e_tag.clone(),
                    version: meta.version.clone(),
                    ..Default::default()
                }
            };
            let r = self.store.get_opts(&self.path, opts).await?;
            let meta = r.meta.clone();
            let bytes = r.bytes().await?;
            Ok::<_, object_store::Error>((meta, bytes))
        }
        .await;
        let (meta, bytes) = r.map_err(|e| match e {
            // Kinds kept (`error_kind`): the opener tells a missing object from the rest.
            object_store::Error::NotFound { .. } => anyhow::Error::new(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{url}: no such object (404)"),
            )),
            // Typed, so the command's exit code says which (`crate::exit_code`).
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => anyhow::Error::new(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{url}: access denied (403): check the credentials, region and endpoint; a \
                     Requester Pays bucket also needs --request-payer (S3) or \
                     --billing-project PROJECT (GCS) ({e})"
                ),
            )),
            e => anyhow::Error::new(ObjectError::Network {
                url: url.clone(),
                why: format!("cannot read the object: {}", describe(&e)),
            }),
        })?;
        self.stats.gets.fetch_add(1, Relaxed);
        self.stats.bytes.fetch_add(bytes.len() as u64, Relaxed);
        let etag = meta.e_tag.clone().ok_or_else(|| {
            anyhow!("{url}: the server sent no ETag, so the object cannot be pinned to a version")
        })?;
        let _ = self.pin.set(Pin {
            size: meta.size,
            etag,
            version: meta.version.clone(),
            modified: None,
        });
        Ok(bytes)
    }

    /// GETs bytes `r` of the pinned object (waits for a free request slot first).
    ///
    /// Errors ([`ObjectError`] inside the `io::Error`, its kind chosen by it): the object
    /// replaced or removed since it was pinned (412, 404, or an answer carrying another ETag
    /// or size; logged loudly once; ESTALE), 401/403, a short or misplaced answer, or a
    /// network failure after the retries.
    pub async fn get(&self, r: Range<u64>) -> io::Result<Bytes> {
        let pin = self
            .pin
            .get()
            .ok_or_else(|| io::Error::other("remote object not opened"))?;
        let _permit = self
            .limit
            .acquire_many(permits(r.end.saturating_sub(r.start)))
            .await
            .map_err(|_| io::Error::other("client closed"))?;
        let opts = GetOptions {
            range: Some(GetRange::Bounded(r.clone())),
            if_match: (!pin.etag.is_empty()).then(|| pin.etag.clone()),
            if_unmodified_since: pin
                .modified
                .and_then(|m| chrono::DateTime::from_timestamp(m, 0)),
            version: pin.version.clone(),
            ..Default::default()
        };
        let url = &self.url;
        let replaced = |why: String| {
            if !self.replaced.swap(true, Relaxed) {
                log::error!(
                    "{url}: THE OBJECT WAS REPLACED since it was mounted (pinned to ETag {}): {why}; every read of bytes not cached answers ESTALE: unmount and mount again",
                    pin.etag
                );
            }
            ObjectError::Replaced {
                url: url.clone(),
                etag: pin.etag.clone(),
                why,
            }
        };
        let in_outage = self.outage.0.load(Relaxed);
        let store = if in_outage { &self.quick } else { &self.store };
        let t0 = std::time::Instant::now();
        let res = async {
            let g = store.get_opts(&self.path, opts).await?;
            let (meta, range) = (g.meta.clone(), g.range.clone());
            Ok::<_, object_store::Error>((meta, range, g.bytes().await?))
        }
        .await;
        let out = match res {
            // The answer must be the pinned version and the range asked for, whatever the
            // server did with If-Match (many static servers ignore it).
            Ok((meta, _, _))
                if (meta.e_tag.as_deref()).is_some_and(|e| self.other_etag(pin, e).is_some()) =>
            {
                let e = meta.e_tag.unwrap_or_default();
                let want = self.other_etag(pin, &e).unwrap_or_default();
                Err(replaced(format!("the answer carries ETag {e}, not {want}")))
            }
            Ok((meta, _, _))
                if pin
                    .modified
                    .is_some_and(|m| meta.last_modified.timestamp() != m) =>
            {
                Err(replaced(format!(
                    "the answer says it was last modified {}, not {}",
                    meta.last_modified,
                    chrono::DateTime::from_timestamp(pin.modified.unwrap_or(0), 0)
                        .unwrap_or_default()
                )))
            }
            Ok((meta, _, _)) if meta.size != pin.size => Err(replaced(format!(
                "the answer says the object holds {} bytes, not {}",
                meta.size, pin.size
            ))),
            Ok((_, range, b)) if range != r || b.len() as u64 != r.end - r.start => {
                Err(ObjectError::BadAnswer {
                    url: url.clone(),
                    start: r.start,
                    end: r.end,
                    why: format!("the answer holds bytes {range:?}, {} of them", b.len()),
                })
            }
            Ok((_, _, b)) => {
                if in_outage && self.outage.0.swap(false, Relaxed) {
                    log::warn!("{url}: the server answers again; GETs are retried again");
                }
                self.stats.gets.fetch_add(1, Relaxed);
                self.stats.bytes.fetch_add(b.len() as u64, Relaxed);
                log::debug!("GET {url} bytes {r:?}: {:?}", t0.elapsed());
                return Ok(b);
            }
            Err(object_store::Error::Precondition { source, .. }) => {
                Err(replaced(format!("412 to If-Match: {source}")))
            }
            Err(object_store::Error::NotFound { source, .. }) => {
                Err(replaced(format!("404: {source}")))
            }
            Err(
                e @ (object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }),
            ) => Err(ObjectError::Denied {
                url: url.clone(),
                why: e.to_string(),
            }),
            Err(e) => {
                if !self.outage.0.swap(true, Relaxed) {
                    log::warn!(
                        "{url}: a GET failed after its retries ({}); until one succeeds, \
                         GETs are tried once each (reads answer EIO at once)",
                        describe(&e)
                    );
                }
                Err(ObjectError::Network {
                    url: url.clone(),
                    why: describe(&e),
                })
            }
        };
        self.stats.failed.fetch_add(1, Relaxed);
        out.map_err(io::Error::from)
    }

    /// The ETag every answer must carry, when `answer` (an answer's ETag) is not it: the
    /// pin's, or where the pin has none (an HTTP listing gives only size and date) the first
    /// answer's, learned here — so a file rewritten with the same size within the same second
    /// answers ESTALE rather than bytes of two versions where the server's ETag changes
    /// (Apache's, Caddy's, any content hash; nginx's is date and size only). `None`: it is.
    fn other_etag(&self, pin: &Pin, answer: &str) -> Option<String> {
        let want = if pin.etag.is_empty() {
            self.first_etag.get_or_init(|| answer.to_string())
        } else {
            &pin.etag
        };
        (!same_etag(want, answer)).then(|| want.clone())
    }

    /// [`ObjectClient::get`], waiting for it (not from the runtime's own threads).
    pub fn get_blocking(&self, r: Range<u64>) -> io::Result<Bytes> {
        self.rt.block_on(self.get(r))
    }

    /// Uploads the local file `src` to the object, replacing any object there: one PUT up to
    /// [`UPLOAD_PART`], else a multipart upload in parts of that size. Errors: the file cannot be read, or the store refuses the upload.
    pub fn upload(&self, src: &std::path::Path) -> Result<()> {
        use tokio::io::AsyncReadExt;
        let url = self.url.clone();
        self.rt.block_on(async {
            let mut f = tokio::fs::File::open(src)
                .await
                .with_context(|| format!("cannot open {}", src.display()))?;
            let len = f.metadata().await?.len();
            if len <= UPLOAD_PART as u64 {
                // One part's worth: one PUT, not a multipart upload's three requests.
                let mut bytes = Vec::with_capacity(len as usize);
                f.read_to_end(&mut bytes).await?;
                self.store
                    .put(&self.path, bytes.into())
                    .await
                    .with_context(|| format!("{url}: cannot upload"))?;
                return Ok(());
            }
            let upload = self
                .store
                .put_multipart(&self.path)
                .await
                .with_context(|| format!("{url}: cannot start the upload"))?;
            let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART);
            let mut buf = vec![0u8; 8 << 20];
            loop {
                let n = f.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                w.wait_for_capacity(4)
                    .await
                    .with_context(|| format!("{url}: upload failed"))?;
                w.write(&buf[..n]);
            }
            w.finish()
                .await
                .with_context(|| format!("{url}: cannot complete the upload"))?;
            Ok(())
        })
    }
}

impl ObjectClient {
    /// Downloads the whole object into a new file `dest` with one GET (carrying the pin's
    /// ETag when pinned, else pinning the object to what the answer says): written to a
    /// temporary file beside `dest` and renamed, so `dest` is never half-written.
    ///
    /// Errors: 404 and 403 (their kind: [`error_kind`]), the object
    /// replaced since it was pinned, a network failure, or `dest`'s directory cannot be written.
    pub fn fetch_to(&self, dest: &std::path::Path) -> Result<u64> {
        use futures::StreamExt;
        let url = self.url.clone();
        let dir = dest.parent().unwrap_or(std::path::Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)
            .with_context(|| format!("cannot write in {}", dir.display()))?;
        let pin = self.pin.get().cloned();
        let opts = GetOptions {
            if_match: (pin.as_ref())
                .filter(|p| !p.etag.is_empty())
                .map(|p| p.etag.clone()),
            if_unmodified_since: (pin.as_ref())
                .and_then(|p| chrono::DateTime::from_timestamp(p.modified?, 0)),
            version: pin.as_ref().and_then(|p| p.version.clone()),
            ..Default::default()
        };
        let got = self.rt.block_on(async {
            let _permit = self
                .limit
                .acquire_many(PERMITS_PER_REQUEST)
                .await
                .map_err(|_| anyhow!("client closed"))?;
            let r = self
                .store
                .get_opts(&self.path, opts)
                .await
                .map_err(|e| anyhow::Error::new(io_error(&url, e)))?;
            let meta = r.meta.clone();
            let mut stream = r.into_stream();
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| anyhow::Error::new(io_error(&url, e)))?;
                std::io::Write::write_all(&mut tmp, &chunk)
                    .with_context(|| format!("cannot write {}", dest.display()))?;
                n += chunk.len() as u64;
            }
            Ok::<_, anyhow::Error>((meta, n))
        });
        let (meta, n) = got?;
        self.stats.gets.fetch_add(1, Relaxed);
        self.stats.bytes.fetch_add(n, Relaxed);
        if n != meta.size {
            bail!("{url}: received {n} of its {} bytes", meta.size);
        }
        // A server that ignores If-Match answers the new version: never kept as the old.
        if let Some(p) = &pin {
            let etag = meta.e_tag.clone().unwrap_or_default();
            let other_etag = meta.e_tag.is_some() && self.other_etag(p, &etag).is_some();
            let other_date = (p.modified).is_some_and(|m| m != meta.last_modified.timestamp());
            if other_etag || other_date || meta.size != p.size {
                return Err(anyhow::Error::new(io::Error::from(ObjectError::Replaced {
                    url: url.clone(),
                    etag: p.etag.clone(),
                    why: format!("the answer carries ETag {etag} and {} bytes", meta.size),
                })));
            }
        }
        if let Some(etag) = meta.e_tag {
            let _ = self.pin.set(Pin {
                size: meta.size,
                etag,
                version: meta.version,
                modified: None,
            });
        }
        tmp.persist(dest)
            .with_context(|| format!("cannot write {}", dest.display()))?;
        Ok(n)
    }

    /// Pins the object to `pin` (what a listing said of it) instead of a GET: every later GET
    /// carries its ETag. No effect when already pinned.
    pub fn set_pin(&self, pin: Pin) {
        let _ = self.pin.set(pin);
    }
}

impl source::ObjectSource for ObjectClient {
    fn url(&self) -> &str {
        &self.url
    }

    fn pin(&self) -> Option<&Pin> {
        self.pin.get()
    }

    fn get(&self, r: Range<u64>) -> futures::future::BoxFuture<'_, io::Result<Bytes>> {
        Box::pin(ObjectClient::get(self, r))
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    fn stats(&self) -> &ObjectStats {
        &self.stats
    }

    fn max_requests(&self) -> usize {
        self.max_requests
    }

    fn open_tail(&self, n: u64) -> futures::future::BoxFuture<'_, Result<Bytes>> {
        Box::pin(self.open_tail_async(n))
    }

    fn set_pin(&self, pin: Pin) {
        ObjectClient::set_pin(self, pin)
    }

    fn fetch_to(&self, dest: &std::path::Path) -> Result<u64> {
        ObjectClient::fetch_to(self, dest)
    }
}

#[cfg(test)]
mod permit_tests {
    use super::*;

    #[test]
    fn small_gets_take_fewer_permits_than_large_ones() {
        assert_eq!(permits(0), 1);
        assert_eq!(permits(39_000), 1, "an ImageNet-sized object");
        assert_eq!(permits(SMALL_GET), 1);
        assert_eq!(permits(SMALL_GET + 1), 2);
        assert_eq!(permits(1 << 20), PERMITS_PER_REQUEST, "a block");
        assert_eq!(permits(16 << 20), PERMITS_PER_REQUEST, "a merged GET");
    }
}
