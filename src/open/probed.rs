//! One object asked for while telling a source apart, handed on to the opener it belongs to
//! so that it is not asked for twice: an HTTP directory's `.loosefs-index` is fetched first
//! (an HTTP listing hides it) and is either a shared listing of loose objects or a foreign
//! dataset's shared index, which that dataset's opener then reads from the copy already
//! fetched, or it is absent, which that opener then learns without a request.

use crate::storage::object::source::{Level, Listed, ObjectSource, ObjectStats, ObjectStore, Pin};
use anyhow::Result;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What the probe of one object found.
#[derive(Debug)]
pub(crate) enum Answer {
    /// No such object (404, or 403 to a caller who may not list).
    Absent,
    /// Fetched whole into this file, by this client (pinned to the answer, its GET counted).
    Fetched(Arc<dyn ObjectSource>, tempfile::TempPath),
}

/// `inner`, but the first [`ObjectStore::object`] of `at` answers its first `fetch_to` with
/// what the probe found.
#[derive(Debug)]
pub(crate) struct Probed {
    /// The store everything else goes to.
    pub inner: Arc<dyn ObjectStore>,
    /// The URL probed.
    pub at: String,
    /// What was found, until an opener takes it.
    pub answer: Mutex<Option<Answer>>,
}

impl ObjectStore for Probed {
    fn object(&self, url: &str) -> Result<Arc<dyn ObjectSource>> {
        let taken = (url == self.at)
            .then(|| self.answer.lock().ok()?.take())
            .flatten();
        Ok(match taken {
            Some(Answer::Fetched(client, file)) => Arc::new(ProbedObject {
                client,
                file: Mutex::new(Some(Some(file))),
            }),
            Some(Answer::Absent) => Arc::new(ProbedObject {
                client: self.inner.object(url)?,
                file: Mutex::new(Some(None)),
            }),
            None => self.inner.object(url)?,
        })
    }

    fn list(&self, url: &str) -> Result<Vec<Listed>> {
        self.inner.list(url)
    }

    fn list_level(&self, url: &str) -> Result<Level> {
        self.inner.list_level(url)
    }

    fn list_below(
        &self,
        url: &str,
        level: Level,
        progress: crate::progress::Progress,
    ) -> Result<Vec<Listed>> {
        self.inner.list_below(url, level, progress)
    }

    fn upload(&self, url: &str, src: &Path) -> Result<()> {
        self.inner.upload(url, src)
    }
}

/// The probed object: its client, and (until the first `fetch_to`) the probe's answer:
/// `Some(Some(file))` fetched, `Some(None)` absent.
#[derive(Debug)]
struct ProbedObject {
    client: Arc<dyn ObjectSource>,
    file: Mutex<Option<Option<tempfile::TempPath>>>,
}

impl ObjectSource for ProbedObject {
    fn url(&self) -> &str {
        self.client.url()
    }

    fn pin(&self) -> Option<&Pin> {
        self.client.pin()
    }

    fn get(&self, r: Range<u64>) -> BoxFuture<'_, std::io::Result<Bytes>> {
        self.client.get(r)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.client.runtime()
    }

    fn stats(&self) -> &ObjectStats {
        self.client.stats()
    }

    fn max_requests(&self) -> usize {
        self.client.max_requests()
    }

    fn open_tail(&self, n: u64) -> BoxFuture<'_, Result<Bytes>> {
        self.client.open_tail(n)
    }

    fn set_pin(&self, pin: Pin) {
        self.client.set_pin(pin)
    }

    /// The probe's answer the first time (the file moved to `dest`, or 404), then a GET.
    fn fetch_to(&self, dest: &Path) -> Result<u64> {
        let answer = self.file.lock().ok().and_then(|mut f| f.take());
        match answer {
            Some(Some(file)) => {
                let n = std::fs::metadata(&file)?.len();
                if file.persist(dest).is_err() {
                    return self.client.fetch_to(dest);
                }
                Ok(n)
            }
            Some(None) => Err(anyhow::Error::new(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: no such object (404)", self.client.url()),
            ))),
            None => self.client.fetch_to(dest),
        }
    }
}
