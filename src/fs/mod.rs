//! The router: answers every filesystem request by sending it to the backend that owns the
//! inode — the catalog (names and attributes), stored samples (checked reads with read-ahead),
//! decoded views (the decoder) or the control directory — and times it. Free of FUSE types:
//! the adaptor in [`crate::fuse`] only translates, and tests drive a `Fs` directly.
//!
//! The read path of a file is one walk down: [`Catalog::extent`] says where its bytes are and
//! how they become its content; stored bytes go through [`ReadAhead`] and [`Samples`], decoded
//! views through the [`Decoder`]. Nothing here depends on where the bytes live.

mod announce;
mod changed;
pub mod changes;
mod control;
mod data;
mod local;
mod options;
mod passthrough;
mod report;
pub mod watch;

use crate::catalog::{Attr, Catalog, DirEntry, FsError, FsStats};
use crate::decode::Decoder;
use crate::fs::changes::Changes;
use crate::ino::{Node, ROOT_INO};
use crate::readahead::ReadAhead;
use crate::readahead::push::Store;
use crate::samples::Samples;
use crate::stats::{Op, Stats};
use crate::storage::Storage;
use control::Control;
use data::Data;
pub use options::FsOptions;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use control::DIR_NAME as CONTROL_DIR_NAME;

/// How long the kernel may cache entries and attributes of the catalog (it never changes while
/// mounted).
pub const TTL: Duration = Duration::from_secs(24 * 3600);

/// Callback that drops the kernel's cached pages of one inode of the mount.
pub type Invalidate = Box<dyn Fn(u64) + Send + Sync>;

/// An entry or attribute reply: the attributes and how long the kernel may cache them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Attributes.
    pub attr: Attr,
    /// Cache lifetime of the entry and its attributes (zero: ask again every time).
    pub ttl: Duration,
}

impl Entry {
    fn cached(attr: Attr) -> Entry {
        Entry { attr, ttl: TTL }
    }
}

/// A catalog being served.
pub struct Fs {
    catalog: Arc<dyn Catalog>,
    data: Data,
    control: Control,
    announcing: announce::Announcing,
    /// Request counters and latency histograms.
    pub stats: Stats,
    opts: FsOptions,
    started: Instant,
    invalidate: OnceLock<Invalidate>,
    /// Reads go through FUSE passthrough (set by the adaptor once the kernel agreed).
    passthrough: std::sync::atomic::AtomicBool,
    /// A loose directory's changes since the mount (names that changed, late nodes).
    changes: OnceLock<Arc<Changes>>,
}

impl Fs {
    /// Serves `catalog` from `storage`. Starts pinning and warming when asked (the caller has
    /// checked the pin budget).
    pub fn new(catalog: Arc<dyn Catalog>, storage: Arc<dyn Storage>, opts: FsOptions) -> Fs {
        let samples = Arc::new(Samples::new(catalog.clone(), storage));
        let readahead = Arc::new(ReadAhead::new(samples.clone(), opts.readahead));
        let decoder = catalog.views().any().then(|| {
            Decoder::new(samples.clone(), readahead.clone(), opts.decode)
                .inspect_err(|e| log::error!("cannot start the decode threads: {e}"))
                .ok()
        });
        if opts.warm {
            readahead.start_warm();
        }
        Fs {
            catalog,
            data: Data {
                samples,
                readahead,
                decoder: decoder.flatten(),
                frames: None,
            },
            control: Control::default(),
            announcing: Default::default(),
            stats: Stats::default(),
            opts,
            started: Instant::now(),
            invalidate: OnceLock::new(),
            passthrough: Default::default(),
            changes: OnceLock::new(),
        }
    }

    /// Closes the storage once the mount has ended (see [`Storage::close`]).
    pub fn close(&self) {
        self.data.samples.storage().close();
    }

    /// Installs the kernel page-cache invalidation used by `drop-cache`.
    pub fn set_invalidate(&self, f: Invalidate) {
        let _ = self.invalidate.set(f);
    }

    /// Serves the made files (video frames, columns) of the catalog through `frames`: once,
    /// when the filesystem is composed (`crate::mount::compose`).
    pub fn set_frames(&mut self, frames: Arc<crate::video::frames::FrameServer>) {
        self.data.frames = Some(frames);
    }

    /// Starts pushing samples ahead of in-order readers through `store` (FUSE_NOTIFY_STORE).
    pub fn start_push(&self, store: Store) {
        self.data.readahead.start_push(store);
    }

    /// Waits until every push asked so far is done (a completion signal for tests).
    pub fn settle_push(&self) {
        self.data.readahead.settle_push();
    }

    /// The source was opened for writing while mounted: the catalog checks from now on that
    /// it is unchanged (see [`Catalog::opened_for_writing`]); false where it cannot tell.
    pub fn opened_for_writing(&self) -> bool {
        self.catalog.opened_for_writing()
    }

    /// The catalog served.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// Path of `ino` for log messages.
    pub fn path_of(&self, ino: u64) -> String {
        match (Node::of(ino), self.changes()) {
            (Some(n), _) if n.is_control() => format!(".loosefs (inode {ino})"),
            (Some(Node::Late(k)), Some(c)) => c.path_of(k),
            _ => self.catalog.path_of(ino),
        }
    }

    /// Looks up `name` in directory `parent`, as the mount's owner.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, FsError> {
        self.lookup_as(self.opts.owner, parent, name)
    }

    /// Looks up `name` in directory `parent` for user `uid`: the control commands (`warm`,
    /// `drop-cache`) run only for the mount's owner and root ([`FsError::Denied`] otherwise).
    pub fn lookup_as(&self, uid: u32, parent: u64, name: &[u8]) -> Result<Entry, FsError> {
        let t0 = Instant::now();
        let _fg = self.data.readahead.foreground();
        let trusted = uid == 0 || uid == self.opts.owner;
        let r = match Node::of(parent) {
            Some(Node::ControlDir) => self.control.lookup(name, |n| self.run_control(n, trusted)),
            Some(Node::ControlFile(_)) => Err(FsError::NotDir),
            _ if parent == ROOT_INO && name == control::DIR_NAME => Ok(Control::dir_entry()),
            _ => match self.changes().and_then(|c| c.lookup(parent, name)) {
                Some(r) => r.map(Entry::cached),
                None => self.catalog.lookup(parent, name).map(Entry::cached),
            },
        };
        if let Ok(e) = &r {
            self.data.readahead.looked_up(e.attr.ino);
        }
        self.finish(Op::Lookup, t0, r)
    }

    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        let t0 = Instant::now();
        let r = self.entry(ino);
        self.finish(Op::Getattr, t0, r)
    }

    fn entry(&self, ino: u64) -> Result<Entry, FsError> {
        match Node::of(ino) {
            Some(n) if n.is_control() => self.control.getattr(n),
            Some(Node::Late(k)) => self.late_entry(k),
            _ => self.catalog.getattr(ino).map(Entry::cached),
        }
    }

    /// Lists directory `ino` from `offset`, calling `add` per entry until it returns true.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), FsError> {
        let t0 = Instant::now();
        let _fg = self.data.readahead.foreground();
        let r = match Node::of(ino) {
            Some(Node::ControlDir) => {
                self.control.readdir(offset, &mut add);
                Ok(())
            }
            Some(Node::ControlFile(_)) => Err(FsError::NotDir),
            // A pack written by another tool may hold `.loosefs` at its top: the control
            // directory takes that name, so the entry is never listed.
            _ if ino == ROOT_INO => self.list(ino, offset, &mut |e| {
                *e.name != *control::DIR_NAME && add(e)
            }),
            _ => self.list(ino, offset, &mut add),
        };
        self.finish(Op::Readdir, t0, r)
    }

    /// As [`Fs::readdir`], with each entry's attributes (READDIRPLUS). Entries listed in
    /// the control directory are never cached by the kernel.
    pub fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(&DirEntry<'_>, &Entry) -> bool,
    ) -> Result<(), FsError> {
        let volatile = Node::of(ino).is_some_and(Node::is_control);
        self.readdir(ino, offset, |e| {
            let Ok(mut entry) = self.entry(e.ino) else {
                return false;
            };
            if volatile {
                entry.ttl = Duration::ZERO;
            }
            let full = add(&e, &entry);
            if !full {
                // Sent with its attributes: the kernel holds the inode now.
                self.data.readahead.looked_up(e.ino);
            }
            full
        })
    }

    /// Reads up to `size` bytes of `ino` at `offset` and hands them to `reply`: before
    /// returning, or later from a decode thread for a decoded view not yet decoded.
    pub fn read(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        reply: impl FnOnce(Result<&[u8], FsError>) + Send + 'static,
    ) {
        let t0 = Instant::now();
        let node = Node::of(ino);
        if let Some(n) = node.filter(|n| n.is_control()) {
            self.control.read(n, offset, size, reply);
            self.stats.done(Op::Control, t0);
            return;
        }
        if let Some(Node::Late(k)) = node {
            self.read_late(k, offset, size, reply);
            self.stats.done(Op::Read, t0);
            return;
        }
        match self.catalog.extent(ino) {
            Ok(ext) => self.data.read(ino, ext, offset, size, &self.stats, reply),
            Err(e) => {
                self.stats.errors.fetch_add(1, Relaxed);
                reply(Err(e));
            }
        }
        self.stats.done(Op::Read, t0);
    }

    /// `statfs` figures.
    pub fn statfs(&self) -> FsStats {
        let t0 = Instant::now();
        let s = self.catalog.statfs();
        self.stats.done(Op::Statfs, t0);
        s
    }

    /// Counts an ioctl (answered ENOTTY by the adaptor).
    pub fn ioctl(&self) {
        self.stats.done(Op::Ioctl, Instant::now());
    }

    /// Counts an OPEN (answered ENOSYS by the adaptor, so the kernel sends no more).
    pub fn open(&self) {
        self.stats.done(Op::Open, Instant::now());
    }

    /// The kernel forgot `ino`.
    pub fn forget(&self, ino: u64) {
        match (Node::of(ino), self.changes()) {
            (Some(n), _) if n.is_control() => self.control.forget(n),
            (Some(Node::Late(k)), Some(c)) => c.forget(k),
            _ => self.data.readahead.forgotten(ino),
        }
    }

    fn finish<T>(&self, op: Op, t0: Instant, r: Result<T, FsError>) -> Result<T, FsError> {
        if matches!(
            r,
            Err(FsError::Corrupt(_) | FsError::Io(_) | FsError::Internal(_))
        ) {
            self.stats.errors.fetch_add(1, Relaxed);
        }
        if matches!(r, Err(FsError::Stale(_))) {
            self.stats.errors.fetch_add(1, Relaxed);
            self.stats.stale.fetch_add(1, Relaxed);
        }
        self.stats.done(op, t0);
        r
    }

    /// Runs control file `name`, returning its content (pretty JSON and a newline; Prometheus
    /// text for `metrics`). Commands run only for a `trusted` caller. Errors:
    /// [`FsError::NotFound`], [`FsError::Denied`].
    fn run_control(&self, name: &str, trusted: bool) -> Result<Vec<u8>, FsError> {
        let json = match name {
            "metrics" => {
                let mnt = &self.parts().opts.mountpoint;
                return Ok(crate::metrics::prometheus(&self.report(), mnt).into_bytes());
            }
            "stats" => serde_json::to_vec_pretty(&self.report()),
            control::ORDER => serde_json::to_vec_pretty(&self.data.readahead.order.report()),
            "warm" | "drop-cache" if !trusted => return Err(FsError::Denied),
            "warm" => serde_json::to_vec_pretty(&self.parts().warm()),
            "drop-cache" => serde_json::to_vec_pretty(&self.drop_cache()),
            _ => return Err(FsError::NotFound),
        };
        let mut out = json.map_err(|e| FsError::Internal(format!("report {name}: {e}")))?;
        out.push(b'\n');
        Ok(out)
    }
}
