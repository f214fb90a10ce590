//! Opens under FUSE passthrough: whether the mount can hand the kernel files' original bytes
//! (a loose directory's files), and the original file of each OPEN.

use super::Fs;
use crate::catalog::FsError;
use crate::ino::Node;
use crate::stats::Op;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

impl Fs {
    /// Whether the kernel may read files' original bytes itself (FUSE passthrough): asked
    /// (`--passthrough on`) and the storage holds whole local files (a loose directory: the
    /// first file's bytes are asked for).
    pub fn passthrough_possible(&self) -> bool {
        if !self.opts.passthrough || self.catalog.checks() {
            return false;
        }
        (0..self.catalog.records() as u32)
            .find_map(|r| self.catalog.extent(crate::ino::record_ino(r)).ok())
            .is_some_and(|e| {
                (self.data.samples.storage())
                    .backing_file(e.object, &e.range)
                    .is_some()
            })
    }

    /// Records whether reads go through passthrough now (for stats and the adaptor's opens);
    /// returns what it was.
    pub fn set_passthrough(&self, on: bool) -> bool {
        self.passthrough.swap(on, Relaxed)
    }

    /// Whether reads go through passthrough now.
    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Relaxed)
    }

    /// An OPEN of `ino` under passthrough: the original file to hand the kernel, or `None`
    /// when the daemon serves the file itself (a decoded view, a control file, a directory).
    /// Errors: the file cannot be opened or changed since the mount (EIO).
    pub fn open_backing(&self, ino: u64) -> Result<Option<Arc<std::fs::File>>, FsError> {
        let t0 = Instant::now();
        let r = match Node::of(ino) {
            Some(Node::Record(_)) => match self.catalog.extent(ino) {
                Ok(ext) => self.data.backing(&ext),
                Err(_) => Ok(None),
            },
            Some(Node::Late(k)) => match self.changes() {
                Some(c) => c.open(k).map(|f| Some(Arc::new(f))),
                None => Err(FsError::NotFound),
            },
            _ => Ok(None),
        };
        self.finish(Op::Open, t0, r)
    }
}
