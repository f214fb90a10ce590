//! Backing ids of files open under FUSE passthrough: one per inode while any open of it lives
//! (the kernel refuses a second, different backing file for an inode that has one, failing the
//! open with EIO), and kept after its last RELEASE for the next open of the same file, up to
//! [`IDLE_IDS`] idle ones (least recently released dropped first): each new id costs a
//! `FUSE_DEV_IOC_BACKING_OPEN` and, when dropped, a `FUSE_DEV_IOC_BACKING_CLOSE`.

use fuser::BackingId;
use std::collections::HashMap;
use std::num::NonZeroUsize;

/// Backing ids kept with no open file, at most.
pub const IDLE_IDS: usize = 4096;

/// The table; the adaptor holds it under one mutex.
pub struct BackingIds {
    /// By inode: the id and the opens of the inode using it.
    ids: HashMap<u64, (BackingId, usize)>,
    /// Inodes whose id no open uses, least recently released first.
    idle: lru::LruCache<u64, ()>,
}

impl Default for BackingIds {
    fn default() -> Self {
        BackingIds {
            ids: HashMap::new(),
            idle: lru::LruCache::new(NonZeroUsize::new(IDLE_IDS).expect("non-zero")),
        }
    }
}

impl BackingIds {
    /// The id of `ino` for one more open: the one it has, or a new one from `make`.
    /// Errors: `make`'s (the kernel refused the backing file).
    pub fn open(
        &mut self,
        ino: u64,
        make: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> std::io::Result<&BackingId> {
        self.idle.pop(&ino);
        let (id, opens) = match self.ids.entry(ino) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert((make()?, 0)),
        };
        *opens += 1;
        Ok(id)
    }

    /// One open of `ino` ended (a RELEASE); its id idles when it was the last.
    pub fn release(&mut self, ino: u64) {
        let Some((_, opens)) = self.ids.get_mut(&ino) else {
            return;
        };
        *opens = opens.saturating_sub(1);
        if *opens == 0
            && let Some((old, ())) = self.idle.push(ino, ())
            && old != ino
            && self.ids.get(&old).is_some_and(|e| e.1 == 0)
        {
            self.ids.remove(&old);
        }
    }
}
