//! The hidden control directory `<mnt>/.loosefs/`: reachable by path, never listed in the root
//! (ImageFolder would take a listed directory for a class).
//!
//! Each *lookup* of a control file produces a fresh snapshot inode holding the file's whole
//! content, looked up with zero entry/attribute TTLs, so every `open` sees current data even
//! though the kernel caches file pages across opens on this mount. `stats` renders the
//! statistics; `warm` and `drop-cache` are commands: looking one up runs it once and its
//! content is the result. Only `stats` is listed in `.loosefs/` (listing must not run commands).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Name of the control directory in the mount root.
pub const DIR_NAME: &[u8] = b".loosefs";
/// Inode of the control directory (far above any pack inode).
pub const DIR_INO: u64 = 1 << 62;
/// Files listed in the control directory.
pub const LISTED: &[&str] = &["stats"];
/// Snapshots kept at most (older ones are dropped; reading them then answers ENOENT).
const KEEP: usize = 256;

/// Whether `ino` belongs to the control directory or its snapshots.
pub fn is_control(ino: u64) -> bool {
    ino >= DIR_INO
}

#[derive(Debug, Default)]
struct SnapshotTable {
    content: HashMap<u64, Arc<Vec<u8>>>,
    /// Inodes, oldest first.
    order: VecDeque<u64>,
    last: u64,
}

/// Snapshot contents by inode, oldest dropped first.
#[derive(Debug, Default)]
pub struct Snapshots {
    inner: Mutex<SnapshotTable>,
}

impl Snapshots {
    /// Stores `content` under a new inode and returns it.
    pub fn insert(&self, content: Vec<u8>) -> u64 {
        let Ok(mut g) = self.inner.lock() else {
            return 0;
        };
        g.last += 1;
        let ino = DIR_INO + 1 + LISTED.len() as u64 + g.last;
        g.content.insert(ino, Arc::new(content));
        g.order.push_back(ino);
        while g.order.len() > KEEP {
            if let Some(old) = g.order.pop_front() {
                g.content.remove(&old);
            }
        }
        ino
    }

    /// Content of snapshot `ino`.
    pub fn get(&self, ino: u64) -> Option<Arc<Vec<u8>>> {
        self.inner.lock().ok()?.content.get(&ino).cloned()
    }

    /// Drops snapshot `ino` (the kernel forgot it).
    pub fn forget(&self, ino: u64) {
        if let Ok(mut g) = self.inner.lock() {
            g.content.remove(&ino);
            g.order.retain(|&i| i != ino);
        }
    }
}

/// Inode given in listings for the listed control file `k` (never looked up through it).
pub fn listed_ino(k: usize) -> u64 {
    DIR_INO + 1 + k as u64
}
