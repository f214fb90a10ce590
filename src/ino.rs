//! Inode spaces: which kind of node an inode number names, in one place, and the atomic bitset
//! over catalog records that the read path keeps per-record flags in.
//!
//! The 64-bit inode space is split by its two high bits:
//!
//! | inode                         | node                                     |
//! |-------------------------------|------------------------------------------|
//! | `1 ..= 2^32`                  | catalog record `ino - 1` (root = 1)      |
//! | `2^60 \| k`                   | late node `k` of a loose directory (a file added or replaced since the mount) |
//! | `2^61 \| (record + 1)`        | the `.npy` view of a record              |
//! | `2^62`                        | the control directory `.loosefs/`        |
//! | `2^62 + 1 + k`                | control file `k` (listed names, then snapshots) |
//!
//! Record inodes are stable for the life of a catalog, so the kernel may cache them for as long
//! as it likes and `forget` needs no bookkeeping for them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Inode number of the root directory (record 0).
pub const ROOT_INO: u64 = 1;
/// Name of the control directory at the mount's top (it takes the name from any entry of the
/// catalog's there).
pub const CONTROL_DIR_NAME: &[u8] = b".loosefs";
/// Bit set in the inode of a `.npy` view.
const NPY_BIT: u64 = 1 << 61;
/// Inode of the control directory; control files follow it.
const CONTROL_BASE: u64 = 1 << 62;
/// Bit set in the inode of a late node (`crate::fs::changes`); `k` below 2^60.
const LATE_BIT: u64 = 1 << 60;

/// What an inode number names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Node {
    /// Catalog record `n` (a directory or a stored file).
    Record(u32),
    /// The `.npy` decoded view of record `n`.
    Npy(u32),
    /// Late node `k` of a loose directory: a file or directory added, or a file replaced,
    /// since the mount (`k` < 2^60).
    Late(u64),
    /// The control directory `.loosefs/`.
    ControlDir,
    /// Control file number `k` (its content is a snapshot taken at lookup).
    ControlFile(u64),
}

impl Node {
    /// The node inode `ino` names, `None` for numbers in no space (0, gaps).
    pub fn of(ino: u64) -> Option<Node> {
        if ino >= CONTROL_BASE {
            return Some(match ino - CONTROL_BASE {
                0 => Node::ControlDir,
                k => Node::ControlFile(k - 1),
            });
        }
        if ino & LATE_BIT != 0 {
            return (ino & NPY_BIT == 0).then_some(Node::Late(ino & !LATE_BIT));
        }
        let (npy, rec) = (ino & NPY_BIT != 0, ino & !NPY_BIT);
        let rec = u32::try_from(rec.checked_sub(1)?).ok()?;
        Some(if npy {
            Node::Npy(rec)
        } else {
            Node::Record(rec)
        })
    }

    /// The inode number of this node.
    pub fn ino(self) -> u64 {
        match self {
            Node::Record(r) => u64::from(r) + 1,
            Node::Npy(r) => (u64::from(r) + 1) | NPY_BIT,
            Node::Late(k) => k | LATE_BIT,
            Node::ControlDir => CONTROL_BASE,
            Node::ControlFile(k) => CONTROL_BASE + 1 + k,
        }
    }

    /// The catalog record behind this node (the JPEG of a `.npy` view), if any.
    pub fn record(self) -> Option<u32> {
        match self {
            Node::Record(r) | Node::Npy(r) => Some(r),
            _ => None,
        }
    }

    /// True for the control directory and its files.
    pub fn is_control(self) -> bool {
        matches!(self, Node::ControlDir | Node::ControlFile(_))
    }
}

/// Inode of record `r`.
pub fn record_ino(r: u32) -> u64 {
    Node::Record(r).ino()
}

/// The record inode `ino` names, `None` for any other node.
pub fn record_of(ino: u64) -> Option<u32> {
    match Node::of(ino)? {
        Node::Record(r) => Some(r),
        _ => None,
    }
}

/// A fixed-size set of record numbers with lock-free updates (one bit each, `Relaxed`: each bit
/// is a hint read on its own, never used to order other memory).
#[derive(Debug)]
pub struct Bitset {
    words: Vec<AtomicU64>,
}

impl Bitset {
    /// An empty set for records `0..len` (the words are zeroed lazily by the allocator).
    pub fn new(len: u64) -> Bitset {
        Bitset {
            words: std::iter::repeat_with(|| AtomicU64::new(0))
                .take(len.div_ceil(64) as usize)
                .collect(),
        }
    }

    /// Whether `i` is in the set (false past the end).
    pub fn contains(&self, i: u32) -> bool {
        let i = i as usize;
        self.words
            .get(i / 64)
            .is_some_and(|w| w.load(Relaxed) & (1 << (i % 64)) != 0)
    }

    /// Adds `i`; returns true if it was already there (true past the end: nothing to add).
    pub fn insert(&self, i: u32) -> bool {
        let i = i as usize;
        let bit = 1u64 << (i % 64);
        self.words
            .get(i / 64)
            .is_none_or(|w| w.fetch_or(bit, Relaxed) & bit != 0)
    }

    /// Removes `i` (nothing past the end).
    pub fn remove(&self, i: u32) {
        let i = i as usize;
        if let Some(w) = self.words.get(i / 64) {
            w.fetch_and(!(1u64 << (i % 64)), Relaxed);
        }
    }

    /// Empties the set.
    pub fn clear(&self) {
        self.words.iter().for_each(|w| w.store(0, Relaxed));
    }

    /// Empties the set, returning what it held in increasing order.
    pub fn take(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (k, w) in self.words.iter().enumerate() {
            let mut b = w.swap(0, Relaxed);
            while b != 0 {
                out.push((k * 64) as u32 + b.trailing_zeros());
                b &= b - 1;
            }
        }
        out
    }

    /// The members, in increasing order (a snapshot per word).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(k, w)| {
            let bits = w.load(Relaxed);
            (0..64u32)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| (k * 64) as u32 + b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_spaces_round_trip_and_do_not_overlap() {
        for n in [
            Node::Record(0),
            Node::Record(u32::MAX),
            Node::Npy(0),
            Node::Npy(7),
            Node::Npy(u32::MAX),
            Node::ControlDir,
            Node::ControlFile(0),
            Node::ControlFile(12345),
            Node::Late(0),
            Node::Late((1 << 60) - 1),
        ] {
            assert_eq!(Node::of(n.ino()), Some(n), "{n:?}");
        }
        assert_eq!(Node::of(0), None);
        assert_eq!(Node::of(ROOT_INO), Some(Node::Record(0)));
        assert_eq!(Node::of(1 << 40), None, "beyond u32 records");
        assert!(Node::ControlFile(3).is_control() && !Node::Npy(3).is_control());
        assert_eq!(Node::Npy(9).record(), Some(9));
        assert_eq!(record_of(Node::Npy(9).ino()), None);
        assert_eq!(Node::Late(5).record(), None);
        assert_eq!(
            Node::of(LATE_BIT | NPY_BIT | 1),
            None,
            "no view of a late node"
        );
    }

    #[test]
    fn bitset_inserts_takes_and_clears() {
        let b = Bitset::new(130);
        assert!(!b.insert(0));
        assert!(b.insert(0));
        assert!(!b.insert(129));
        assert!(b.insert(500), "past the end counts as present");
        assert!(b.contains(129) && !b.contains(64) && !b.contains(500));
        assert_eq!(b.iter().collect::<Vec<_>>(), [0, 129]);
        assert_eq!(b.take(), [0, 129]);
        assert_eq!(b.iter().count(), 0);
        b.insert(3);
        b.clear();
        assert!(!b.contains(3));
    }
}
