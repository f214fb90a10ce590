//! The control backend: the hidden directory `<mnt>/.loosefs/`, reachable by path and never
//! listed in the root (ImageFolder would take a listed directory for a class).
//!
//! Each *lookup* of a control file produces a fresh snapshot inode holding the file's whole
//! content, with zero entry and attribute TTLs, so every `open` sees current data even though
//! the kernel caches file pages across opens on this mount. `stats` renders the statistics
//! (JSON), `metrics` the same in Prometheus text, `order` the announced orders' progress (and
//! takes writes: an announcement, see [`super::announce`]); `warm` and `drop-cache` are
//! commands: looking one up runs it once and its content is the result. Only `stats`,
//! `metrics` and `order` are listed (listing must not run commands).

use super::{Entry, TTL};
use crate::catalog::{Attr, DirEntry, FsError, Kind};
use crate::ino::{Node, ROOT_INO};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Name of the control directory in the mount root.
pub use crate::ino::CONTROL_DIR_NAME as DIR_NAME;
/// Files listed in the control directory (control file `k` is `LISTED[k]` in listings).
pub const LISTED: &[&str] = &["stats", "metrics", ORDER];
/// The control file that takes announced orders.
pub const ORDER: &str = "order";
/// Snapshots kept at most (older ones are dropped; reading them then answers ENOENT).
const KEEP: usize = 256;

#[derive(Debug, Default)]
struct Snapshots {
    content: HashMap<u64, Arc<Vec<u8>>>,
    /// Snapshots of `order` (writable).
    orders: std::collections::HashSet<u64>,
    /// Snapshot numbers, oldest first.
    order: VecDeque<u64>,
    last: u64,
}

/// The control directory and its snapshots.
#[derive(Debug)]
pub struct Control {
    snaps: Mutex<Snapshots>,
}

impl Default for Control {
    /// Snapshot numbers start at the microseconds since the epoch, so a daemon that takes
    /// over a kept mount never gives a number the kernel may still cache for an older
    /// daemon's snapshot (with that snapshot's pages).
    fn default() -> Control {
        let now = SystemTime::now().duration_since(UNIX_EPOCH);
        let snaps = Snapshots {
            last: now.map_or(0, |d| d.as_micros() as u64),
            ..Snapshots::default()
        };
        Control {
            snaps: Mutex::new(snaps),
        }
    }
}

impl Control {
    /// Attributes of the control directory (cached like the pack's directories).
    pub fn dir_entry() -> Entry {
        let attr = Attr {
            ino: Node::ControlDir.ino(),
            size: 4096,
            blocks: 8,
            mtime_sec: 0,
            mtime_nsec: 0,
            kind: Kind::Dir,
            perm: 0o555,
            nlink: 1,
            blksize: 4096,
        };
        Entry { attr, ttl: TTL }
    }

    /// Attributes of control file `k` holding `size` bytes (never cached by the kernel); an
    /// `order` file is writable by everyone who may use the mount (a wrong order costs no
    /// more than none).
    fn file_entry(k: u64, size: u64, order: bool) -> Entry {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let attr = Attr {
            ino: Node::ControlFile(k).ino(),
            size,
            blocks: size.div_ceil(512),
            mtime_sec: now,
            mtime_nsec: 0,
            kind: Kind::File,
            perm: if order { 0o666 } else { 0o444 },
            nlink: 1,
            blksize: 4096,
        };
        Entry {
            attr,
            ttl: Duration::ZERO,
        }
    }

    fn get(&self, k: u64) -> Option<Arc<Vec<u8>>> {
        self.snaps.lock().ok()?.content.get(&k).cloned()
    }

    /// Looks up `name` in the control directory: `content` runs the control file and its
    /// output becomes a new snapshot. Errors: [`FsError::NotFound`], and whatever `content`
    /// answers.
    pub fn lookup(
        &self,
        name: &[u8],
        content: impl FnOnce(&str) -> Result<Vec<u8>, FsError>,
    ) -> Result<Entry, FsError> {
        let name = std::str::from_utf8(name).map_err(|_| FsError::NotFound)?;
        let bytes = content(name)?;
        let size = bytes.len() as u64;
        let mut g = self.snaps.lock().map_err(|_| FsError::NotFound)?;
        g.last += 1;
        let k = LISTED.len() as u64 + g.last;
        g.content.insert(k, Arc::new(bytes));
        if name == ORDER {
            g.orders.insert(k);
        }
        g.order.push_back(k);
        while g.order.len() > KEEP {
            if let Some(old) = g.order.pop_front() {
                g.content.remove(&old);
                g.orders.remove(&old);
            }
        }
        Ok(Self::file_entry(k, size, name == ORDER))
    }

    /// Whether `node` is an `order` control file (listed or looked up).
    pub fn is_order(&self, node: Node) -> bool {
        match node {
            Node::ControlFile(k) if (k as usize) < LISTED.len() => LISTED[k as usize] == ORDER,
            Node::ControlFile(k) => self.snaps.lock().is_ok_and(|g| g.orders.contains(&k)),
            _ => false,
        }
    }

    /// Attributes of a control node.
    pub fn getattr(&self, node: Node) -> Result<Entry, FsError> {
        match node {
            Node::ControlDir => Ok(Self::dir_entry()),
            Node::ControlFile(k) => {
                let size = self.get(k).map_or(0, |c| c.len() as u64);
                Ok(Self::file_entry(k, size, self.is_order(node)))
            }
            _ => Err(FsError::NotFound),
        }
    }

    /// Lists the control directory from `offset`: `.`, `..`, then [`LISTED`].
    pub fn readdir(&self, offset: u64, add: &mut dyn FnMut(DirEntry<'_>) -> bool) {
        let dots = [(Node::ControlDir.ino(), "."), (ROOT_INO, "..")];
        let files = LISTED
            .iter()
            .enumerate()
            .map(|(k, n)| (Node::ControlFile(k as u64).ino(), *n));
        for (pos, (ino, name)) in dots.into_iter().chain(files).enumerate() {
            if (pos as u64) < offset {
                continue;
            }
            let e = DirEntry {
                ino,
                next_offset: pos as u64 + 1,
                kind: if pos < 2 { Kind::Dir } else { Kind::File },
                name: name.as_bytes().into(),
            };
            if add(e) {
                return;
            }
        }
    }

    /// Up to `size` bytes of control file `node` from `offset`, handed to `reply`.
    pub fn read(
        &self,
        node: Node,
        offset: u64,
        size: u32,
        reply: impl FnOnce(Result<&[u8], FsError>),
    ) {
        let content = match node {
            Node::ControlFile(k) => self.get(k),
            _ => None,
        };
        match &content {
            Some(c) => {
                let s = (offset as usize).min(c.len());
                let e = (s + size as usize).min(c.len());
                reply(Ok(&c[s..e]))
            }
            None if node == Node::ControlDir => reply(Err(FsError::IsDir)),
            None => reply(Err(FsError::NotFound)),
        }
    }

    /// The kernel forgot `node`: its snapshot goes.
    pub fn forget(&self, node: Node) {
        if let (Node::ControlFile(k), Ok(mut g)) = (node, self.snaps.lock()) {
            g.content.remove(&k);
            g.orders.remove(&k);
            g.order.retain(|&i| i != k);
        }
    }
}
