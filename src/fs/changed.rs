//! A loose directory's changes in the router: names that changed since the mount are answered
//! by [`Changes`] (listings of changed directories, late nodes' reads), everything else by the
//! catalog.

use super::{Entry, Fs};
use crate::catalog::{DirEntry, FsError};
use crate::fs::changes::Changes;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

impl Fs {
    /// Serves the names that changed in a loose directory through `changes` (built over this
    /// server's catalog).
    pub fn set_changes(&self, changes: Arc<Changes>) {
        let _ = self.changes.set(changes);
    }

    /// The changes of a loose directory mount, if this is one.
    pub fn changes(&self) -> Option<&Arc<Changes>> {
        self.changes.get()
    }

    /// A listing of the catalog, or of the changes where a loose directory's names changed.
    pub(super) fn list(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), FsError> {
        match self.changes().and_then(|c| c.readdir(ino, offset, add)) {
            Some(r) => r,
            None => self.catalog.readdir(ino, offset, add),
        }
    }

    /// Attributes of late node `k` (ENOENT on a mount without changes).
    pub(super) fn late_entry(&self, k: u64) -> Result<Entry, FsError> {
        match self.changes() {
            Some(c) => c.getattr(k).map(Entry::cached),
            None => Err(FsError::NotFound),
        }
    }

    /// Reads late node `k` (ENOENT on a mount without changes).
    pub(super) fn read_late(
        &self,
        k: u64,
        offset: u64,
        size: u32,
        reply: impl FnOnce(Result<&[u8], FsError>),
    ) {
        let r = match self.changes() {
            Some(c) => c.read_at(k, offset, size),
            None => Err(FsError::NotFound),
        };
        match r {
            Ok(b) => {
                self.stats.bytes_served.fetch_add(b.len() as u64, Relaxed);
                reply(Ok(&b))
            }
            Err(e) => {
                if !matches!(e, FsError::NotFound) {
                    self.stats.errors.fetch_add(1, Relaxed);
                }
                reply(Err(e))
            }
        }
    }
}
