//! In-memory objects for tests: [`FakeObject`] (one object's versions, with faults to inject)
//! and [`FakeStore`] (a bucket of them, listed and opened by URL as the openers of remote
//! sources do). Both count what a server would see (GETs, bytes, LISTs), so tests assert the
//! requests an open or a read costs without a server.

use super::source::{Level, Listed, ObjectError, ObjectSource, ObjectStats, ObjectStore, Pin};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock};

/// A runtime for fake objects' GETs (two workers: read-ahead spawns fetches on it).
fn runtime() -> Arc<tokio::runtime::Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime"),
    )
}

/// An in-memory object: the bytes of its current version (ETag `"v1"`, `"v2"`, … after each
/// [`FakeObject::replace`]) and faults to inject. Used directly it is also a handle pinned to
/// `"v1"`; [`FakeStore::object`] gives handles pinned as the real client pins. Every successful
/// GET is counted in [`FakeObject::served`] (and in the handle's own stats).
#[derive(Debug)]
pub struct FakeObject {
    rt: Arc<tokio::runtime::Runtime>,
    url: String,
    pin: Pin,
    data: Mutex<Bytes>,
    version: AtomicU32,
    stats: ObjectStats,
    /// The next this many GETs fail (a 503 after the retries).
    pub fail_next: AtomicU32,
    /// Every GET fails with "connection refused" while set (an outage).
    pub down: AtomicBool,
    /// Every GET waits this long before answering, ms.
    pub stall_ms: AtomicU64,
    /// Every answer has its first byte flipped while set (a corrupting proxy).
    pub flip: AtomicBool,
}

impl FakeObject {
    /// An object at `url` holding `data`, pinned to ETag `"v1"`.
    pub fn new(url: &str, data: Vec<u8>) -> FakeObject {
        FakeObject::on(runtime(), url, data)
    }

    fn on(rt: Arc<tokio::runtime::Runtime>, url: &str, data: Vec<u8>) -> FakeObject {
        FakeObject {
            rt,
            url: url.to_string(),
            pin: Pin {
                size: data.len() as u64,
                etag: "\"v1\"".into(),
                version: None,
                modified: None,
            },
            data: Mutex::new(Bytes::from(data)),
            version: AtomicU32::new(1),
            stats: ObjectStats::default(),
            fail_next: Default::default(),
            down: Default::default(),
            stall_ms: Default::default(),
            flip: Default::default(),
        }
    }

    /// Replaces the object with `data` (a new version, the next ETag): GETs pinned to an
    /// older ETag fail.
    pub fn replace(&self, data: Vec<u8>) {
        if let Ok(mut d) = self.data.lock() {
            *d = Bytes::from(data);
        }
        self.version.fetch_add(1, SeqCst);
    }

    /// What the current version would be pinned to.
    pub fn current(&self) -> Pin {
        let data = self.data.lock().map(|d| d.len()).unwrap_or(0);
        Pin {
            size: data as u64,
            etag: format!("\"v{}\"", self.version.load(SeqCst)),
            version: None,
            modified: None,
        }
    }

    /// GETs and bytes served to every handle of this object.
    pub fn served(&self) -> (u64, u64) {
        (
            self.stats.gets.load(Relaxed),
            self.stats.bytes.load(Relaxed),
        )
    }

    /// Bytes `r` of the current version, for a handle pinned to `etag` (`None`: unpinned,
    /// any version), with the faults applied.
    async fn serve(&self, r: Range<u64>, etag: Option<&str>) -> io::Result<Bytes> {
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
        if let Some(etag) = etag.filter(|e| *e != self.current().etag) {
            self.stats.failed.fetch_add(1, Relaxed);
            return Err(ObjectError::Replaced {
                url: self.url.clone(),
                etag: etag.to_string(),
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
        if r.start >= end && !(r.start == 0 && data.is_empty()) {
            return fail("range not satisfiable (416)");
        }
        let mut b = data.slice(r.start as usize..end as usize);
        if self.flip.load(SeqCst) && !b.is_empty() {
            let mut v = b.to_vec();
            v[0] ^= 0xff;
            b = Bytes::from(v);
        }
        self.stats.gets.fetch_add(1, Relaxed);
        self.stats.bytes.fetch_add(b.len() as u64, Relaxed);
        Ok(b)
    }
}

impl ObjectSource for FakeObject {
    fn url(&self) -> &str {
        &self.url
    }

    fn pin(&self) -> Option<&Pin> {
        Some(&self.pin)
    }

    fn get(&self, r: Range<u64>) -> BoxFuture<'_, io::Result<Bytes>> {
        Box::pin(self.serve(r, Some(&self.pin.etag)))
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

/// The `LastModified` every fake object is listed with, seconds (2023-11-14).
pub const FAKE_MODIFIED: i64 = 1_700_000_000;

/// A bucket of [`FakeObject`]s keyed by URL, as an [`ObjectStore`]: handles pin themselves as
/// the real client does (by their first GET, or to what a listing said), and LISTs and
/// uploads are counted.
#[derive(Debug)]
pub struct FakeStore {
    rt: Arc<tokio::runtime::Runtime>,
    objects: Mutex<BTreeMap<String, Arc<FakeObject>>>,
    /// LIST requests made.
    pub lists: AtomicU64,
    /// Uploads made.
    pub uploads: AtomicU64,
    /// Every LIST fails while set (an outage of the listing).
    pub list_down: AtomicBool,
}

impl Default for FakeStore {
    fn default() -> FakeStore {
        FakeStore {
            rt: runtime(),
            objects: Mutex::default(),
            lists: AtomicU64::new(0),
            uploads: AtomicU64::new(0),
            list_down: AtomicBool::new(false),
        }
    }
}

impl FakeStore {
    /// An empty store.
    pub fn new() -> Arc<FakeStore> {
        Arc::new(FakeStore::default())
    }

    /// Puts `data` at `url` (a new object, or the next version of one there); returns it.
    pub fn put(&self, url: &str, data: Vec<u8>) -> Arc<FakeObject> {
        let mut objects = self.objects.lock().expect("fake store");
        match objects.get(url) {
            Some(o) => {
                o.replace(data);
                o.clone()
            }
            None => {
                let o = Arc::new(FakeObject::on(self.rt.clone(), url, data));
                objects.insert(url.to_string(), o.clone());
                o
            }
        }
    }

    /// Removes the object at `url`.
    pub fn remove(&self, url: &str) {
        self.objects.lock().expect("fake store").remove(url);
    }

    /// The object at `url`, if any.
    pub fn get(&self, url: &str) -> Option<Arc<FakeObject>> {
        self.objects.lock().expect("fake store").get(url).cloned()
    }

    /// GETs served to every handle of every object.
    pub fn gets(&self) -> u64 {
        let objects = self.objects.lock().expect("fake store");
        objects.values().map(|o| o.served().0).sum()
    }
}

impl ObjectStore for FakeStore {
    fn object(&self, url: &str) -> anyhow::Result<Arc<dyn ObjectSource>> {
        Ok(Arc::new(FakeHandle {
            url: url.to_string(),
            obj: self.get(url),
            rt: self.rt.clone(),
            pin: OnceLock::new(),
            stats: ObjectStats::default(),
        }))
    }

    fn list(&self, url: &str) -> anyhow::Result<Vec<Listed>> {
        self.lists.fetch_add(1, Relaxed);
        if self.list_down.load(SeqCst) {
            anyhow::bail!("{url}: cannot list the prefix: connection refused");
        }
        let objects = self.objects.lock().expect("fake store");
        Ok(objects
            .iter()
            .filter_map(|(k, o)| {
                let rel = k.strip_prefix(url)?;
                Some(Listed {
                    key: rel.to_string(),
                    pin: Some(o.current()),
                    modified: FAKE_MODIFIED,
                })
            })
            .filter(|l| !l.key.is_empty())
            .collect())
    }

    /// As the real store: one LIST of the first 1000 keys, and past them one or two per run of
    /// subdirectories (up to `LISTS_AT_ONCE` runs).
    fn list_below(
        &self,
        url: &str,
        level: Level,
        _progress: crate::progress::Progress,
    ) -> anyhow::Result<Vec<Listed>> {
        if level.dirs.is_empty() {
            return Ok(level.objects);
        }
        let all = self.list(url)?;
        if all.len() > 1000 {
            self.lists.fetch_add(fake_runs(level.dirs.len()), Relaxed);
        }
        let mut v = level.objects;
        v.extend(all.into_iter().filter(|l| {
            (l.key.split_once('/')).is_some_and(|(d, _)| level.dirs.iter().any(|x| x == d))
        }));
        v.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(v)
    }

    fn upload(&self, url: &str, src: &Path) -> anyhow::Result<()> {
        self.uploads.fetch_add(1, Relaxed);
        self.put(url, std::fs::read(src)?);
        Ok(())
    }
}

/// LISTs the real store makes for the runs of `dirs` subdirectories (one for a run of one,
/// else two; at least one page each).
fn fake_runs(dirs: usize) -> u64 {
    let per = dirs.div_ceil(super::LISTS_AT_ONCE.min(dirs));
    (0..dirs)
        .step_by(per)
        .map(|i| if i + 1 < dirs && per > 1 { 2 } else { 1 })
        .sum()
}

/// One handle on a [`FakeStore`] object: pinned by its first GET or by [`ObjectSource::set_pin`].
#[derive(Debug)]
struct FakeHandle {
    url: String,
    /// The object when the handle was made (`None`: no such object, every GET a 404).
    obj: Option<Arc<FakeObject>>,
    rt: Arc<tokio::runtime::Runtime>,
    pin: OnceLock<Pin>,
    stats: ObjectStats,
}

impl FakeHandle {
    fn obj(&self) -> io::Result<&FakeObject> {
        self.obj.as_deref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no such object (404)", self.url),
            )
        })
    }

    async fn counted(&self, r: Range<u64>, etag: Option<String>) -> io::Result<Bytes> {
        let b = self.obj()?.serve(r, etag.as_deref()).await?;
        self.stats.gets.fetch_add(1, Relaxed);
        self.stats.bytes.fetch_add(b.len() as u64, Relaxed);
        Ok(b)
    }
}

impl ObjectSource for FakeHandle {
    fn url(&self) -> &str {
        &self.url
    }

    fn pin(&self) -> Option<&Pin> {
        self.pin.get()
    }

    fn get(&self, r: Range<u64>) -> BoxFuture<'_, io::Result<Bytes>> {
        Box::pin(async move {
            let etag = self
                .pin
                .get()
                .ok_or_else(|| io::Error::other("remote object not opened"))?
                .etag
                .clone();
            self.counted(r, Some(etag)).await
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

    fn open_tail(&self, n: u64) -> BoxFuture<'_, anyhow::Result<Bytes>> {
        Box::pin(async move {
            let obj = self.obj()?;
            let cur = obj.current();
            let etag = self.pin.get().map(|p| p.etag.clone());
            let size = self.pin.get().map_or(cur.size, |p| p.size);
            let b = self.counted(size.saturating_sub(n)..size, etag).await?;
            let _ = self.pin.set(cur);
            Ok(b)
        })
    }

    fn set_pin(&self, pin: Pin) {
        let _ = self.pin.set(pin);
    }

    fn fetch_to(&self, dest: &Path) -> anyhow::Result<u64> {
        let obj = self.obj()?;
        let cur = obj.current();
        let etag = self.pin.get().map(|p| p.etag.clone());
        let b = self.rt.block_on(self.counted(0..cur.size, etag))?;
        let dir = dest.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, &b)?;
        tmp.persist(dest)?;
        let _ = self.pin.set(cur);
        Ok(b.len() as u64)
    }
}
