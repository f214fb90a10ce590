//! Opens under FUSE passthrough: whether the mount can hand the kernel files' original bytes
//! (a loose directory's files), and the original file of each OPEN.

use super::Server;
use crate::catalog::FsError;
use crate::ino::Node;
use crate::stats::Op;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

impl Server {
    /// Whether the kernel may read files' original bytes itself (FUSE passthrough): asked
    /// (`--passthrough auto`) and the storage holds whole local files (a loose directory).
    pub fn passthrough_possible(&self) -> bool {
        let mut files = (0..self.catalog.records() as u32).map(crate::ino::record_ino);
        let first = files.find(|&ino| self.catalog.extent(ino).is_ok());
        self.opts.passthrough
            && first.is_some_and(|ino| {
                (self.catalog.extent(ino)).is_ok_and(|e| {
                    !self.catalog.checks()
                        && (self.data.samples.storage())
                            .backing_file(e.object, &e.range)
                            .is_some()
                })
            })
    }

    /// Records whether reads go through passthrough now (for stats).
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough.store(on, Relaxed);
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
            _ => Ok(None),
        };
        self.finish(Op::Open, t0, r)
    }
}
