//! The watcher of a loose directory mount: inotify on every directory of the tree, each event
//! turned into a changed name ([`Changes::note`]) and handed to the kernel-cache callback
//! (the mount drops the kernel's entry for the name and the pages of the file it named).
//!
//! Watches are added before [`start`] returns; the thread then compares the tree with the
//! snapshot once ([`Changes::rescan`]: what changed between the walk and the watches), and
//! again whenever the kernel's event queue overflowed (`IN_Q_OVERFLOW`, events lost).
//! Directories created later are watched as their creation is seen. A directory that cannot
//! be watched (the `fs.inotify.max_user_watches` limit) is counted and logged once: its
//! changes show at the next mount, and a changed file still answers EIO rather than mixed
//! bytes (the storage's own check).

use super::changes::{Changes, Noted};
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// What the kernel should forget after a change (the mount: `inval_entry` of the name,
/// `inval_inode` of the inode it named).
pub type Forget = Box<dyn Fn(&Noted) + Send>;

/// Events that change what a name is: created, removed, moved in or out, written and
/// closed, attributes changed (`touch`, `chmod`).
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

struct Watcher {
    inotify: Inotify,
    changes: Arc<Changes>,
    /// Each watch's directory: inode and path relative to the root.
    dirs: HashMap<WatchDescriptor, (u64, PathBuf)>,
    forget: Forget,
    warned: bool,
}

/// Watches every directory of `changes`' tree and starts the thread that handles events.
/// Errors: inotify cannot be set up (no watch at all: the caller logs that changes show at
/// the next mount).
pub fn start(changes: Arc<Changes>, forget: Forget) -> std::io::Result<()> {
    let inotify = Inotify::init()?;
    let mut w = Watcher {
        inotify,
        changes,
        dirs: HashMap::new(),
        forget,
        warned: false,
    };
    let t0 = std::time::Instant::now();
    for (ino, rel) in w.changes.snapshot_dirs() {
        w.watch(ino, rel);
    }
    log::info!(
        "watching {} directories of {} for changes ({:.1} ms)",
        w.dirs.len(),
        w.changes.root().display(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    std::thread::Builder::new()
        .name("loosefs-watch".into())
        .spawn(move || w.run())?;
    Ok(())
}

impl Watcher {
    fn watch(&mut self, ino: u64, rel: PathBuf) {
        match self
            .inotify
            .watches()
            .add(self.changes.root().join(&rel), mask())
        {
            Ok(wd) => {
                self.dirs.insert(wd, (ino, rel));
                self.changes
                    .stats
                    .watched
                    .store(self.dirs.len() as u64, Relaxed);
            }
            Err(e) => {
                self.changes.stats.unwatched.fetch_add(1, Relaxed);
                if !std::mem::replace(&mut self.warned, true) {
                    log::warn!(
                        "cannot watch {} ({e}; see fs.inotify.max_user_watches): changes there show at the next mount",
                        self.changes.root().join(&rel).display()
                    );
                }
            }
        }
    }

    /// Watches directory `rel`, just created, and every directory under it.
    fn watch_new(&mut self, rel: &Path) {
        let Some(ino) = self.changes.watched(rel) else {
            return;
        };
        self.watch(ino, rel.to_path_buf());
        let Ok(rd) = std::fs::read_dir(self.changes.root().join(rel)) else {
            return;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                self.watch_new(&rel.join(e.file_name()));
            }
        }
    }

    fn run(mut self) {
        let t0 = std::time::Instant::now();
        let found = self.changes.rescan();
        log::info!(
            "compared {} with the mount's walk: {} names changed between them ({:.1} ms)",
            self.changes.root().display(),
            found.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        for n in found {
            (self.forget)(&n);
        }
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let events: Vec<_> = match self.inotify.read_events_blocking(&mut buf) {
                Ok(ev) => ev
                    .map(|e| (e.wd, e.mask, e.name.map(|n| n.as_bytes().to_vec())))
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!(
                        "the watch of {} stopped: {e}",
                        self.changes.root().display()
                    );
                    return;
                }
            };
            for (wd, mask, name) in events {
                self.event(wd, mask, name);
            }
        }
    }

    fn event(&mut self, wd: WatchDescriptor, mask: EventMask, name: Option<Vec<u8>>) {
        if mask.contains(EventMask::Q_OVERFLOW) {
            log::warn!(
                "changes under {} came faster than they were read: comparing the tree again",
                self.changes.root().display()
            );
            for n in self.changes.rescan() {
                (self.forget)(&n);
            }
            return;
        }
        if mask.contains(EventMask::IGNORED) {
            self.dirs.remove(&wd);
            self.changes
                .stats
                .watched
                .store(self.dirs.len() as u64, Relaxed);
            return;
        }
        let (Some((dir, rel)), Some(name)) = (self.dirs.get(&wd).cloned(), name) else {
            return;
        };
        if dir == crate::ino::ROOT_INO && name == crate::ino::CONTROL_DIR_NAME {
            return;
        }
        let noted = self.changes.note(dir, &name);
        // A new directory is watched before the kernel hears of it: whoever sees it can
        // change it and be noticed.
        if mask.contains(EventMask::ISDIR)
            && mask.intersects(EventMask::CREATE | EventMask::MOVED_TO)
        {
            self.watch_new(&rel.join(OsStr::from_bytes(&name)));
        }
        (self.forget)(&noted);
    }
}
