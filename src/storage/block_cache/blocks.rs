//! The in-memory state of a block cache's blocks: one [`Slot`] per block (its [`State`], CRC,
//! CLOCK reference bit, readers holding it, pin), the claim of missing blocks for fetching
//! (single flight), and the CLOCK choice of a block to evict. No I/O happens here.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst,
};

/// Block size of the cache, bytes: the unit fetched, checked and evicted. 1 MiB, as
/// mountpoint-s3's disk cache: a shuffled read of a 110 KB sample fetches ~1 MiB, while
/// read-ahead and warm merge adjacent blocks into large GETs.
pub const BLOCK: u64 = 1 << 20;
/// Largest GET, bytes: adjacent missing blocks are merged up to this (mountpoint-s3 uses
/// 8 MiB parts; larger GETs keep per-request overhead and request rates low).
pub const MERGE: u64 = 16 << 20;

/// Where a block is. Transitions: Missing → Fetching (claimed by one fetcher) → Present, or
/// back to Missing on failure; Unchecked (kept from an earlier mount) → Checking (claimed by
/// one checker) → Present, or → Fetching when its CRC fails; Present/Unchecked → Evicting →
/// Missing.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not in the cache.
    Missing = 0,
    /// Being fetched by one caller; others wait.
    Fetching = 1,
    /// In the cache from an earlier mount: checked against its CRC before first use.
    Unchecked = 2,
    /// Being checked by one caller; others wait.
    Checking = 3,
    /// In the cache and checked.
    Present = 4,
    /// Being evicted.
    Evicting = 5,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Fetching,
            2 => State::Unchecked,
            3 => State::Checking,
            4 => State::Present,
            5 => State::Evicting,
            _ => State::Missing,
        }
    }

    /// Whether the block's bytes are in the cache file (checked or not).
    pub fn cached(self) -> bool {
        matches!(self, State::Present | State::Unchecked)
    }

    /// Whether another caller is working on the block (wait for it).
    pub fn busy(self) -> bool {
        matches!(self, State::Fetching | State::Checking | State::Evicting)
    }
}

/// One block's state.
#[derive(Debug)]
pub struct Slot {
    state: AtomicU8,
    /// CRC-32C of the block's bytes (valid when cached).
    pub crc: AtomicU32,
    /// CLOCK reference bit.
    pub referenced: AtomicBool,
    /// Reads in progress (an evictor skips a block being read).
    pub readers: AtomicU32,
    /// Pinned for the life of the mount (never evicted).
    pub pinned: AtomicBool,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: AtomicU8::new(State::Missing as u8),
            crc: AtomicU32::new(0),
            referenced: AtomicBool::new(false),
            readers: AtomicU32::new(0),
            pinned: AtomicBool::new(false),
        }
    }

    /// The block's state now.
    pub fn state(&self) -> State {
        State::from_u8(self.state.load(SeqCst))
    }

    /// Sets the state.
    pub fn set(&self, s: State) {
        self.state.store(s as u8, SeqCst);
    }

    /// Moves the state from `from` to `to`; false if it was not `from`.
    pub fn cas(&self, from: State, to: State) -> bool {
        self.state
            .compare_exchange(from as u8, to as u8, SeqCst, SeqCst)
            .is_ok()
    }
}

/// The blocks of one object of `len` bytes, and how many of them may be cached.
#[derive(Debug)]
pub struct Blocks {
    len: u64,
    slots: Vec<Slot>,
    hand: Mutex<usize>,
    /// Blocks cached now (Present, Unchecked, Checking, or Evicting).
    pub used: AtomicU64,
    /// Most blocks cached at once; lowered when the disk is full.
    pub limit: AtomicU64,
}

impl Blocks {
    /// The blocks of an object of `len` bytes, all missing, at most `limit` cached.
    pub fn new(len: u64, limit: u64) -> Blocks {
        let n = len.div_ceil(BLOCK) as usize;
        Blocks {
            len,
            slots: (0..n).map(|_| Slot::new()).collect(),
            hand: Mutex::new(0),
            used: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
        }
    }

    /// Number of blocks.
    pub fn count(&self) -> usize {
        self.slots.len()
    }

    /// Block `b`'s slot.
    pub fn slot(&self, b: usize) -> &Slot {
        &self.slots[b]
    }

    /// The blocks covering bytes `r` (clamped to the object).
    pub fn covering(&self, r: &Range<u64>) -> Range<usize> {
        let end = r.end.min(self.len);
        if end <= r.start {
            return 0..0;
        }
        (r.start / BLOCK) as usize..end.div_ceil(BLOCK) as usize
    }

    /// Bytes of block `b`.
    pub fn bytes(&self, b: usize) -> Range<u64> {
        let s = b as u64 * BLOCK;
        s..(s + BLOCK).min(self.len)
    }

    /// Bytes of the run of blocks `run`.
    pub fn run_bytes(&self, run: &Range<usize>) -> Range<u64> {
        self.bytes(run.start).start..self.bytes(run.end - 1).end
    }

    /// Claims the missing blocks of `blocks` for fetching by this caller (single flight);
    /// returns them as runs of adjacent blocks of at most [`MERGE`] bytes.
    pub fn claim(&self, blocks: Range<usize>) -> Vec<Range<usize>> {
        let mut runs: Vec<Range<usize>> = Vec::new();
        let per = (MERGE / BLOCK) as usize;
        for b in blocks {
            if self.slots[b].cas(State::Missing, State::Fetching) {
                match runs.last_mut() {
                    Some(r) if r.end == b && r.len() < per => r.end = b + 1,
                    _ => runs.push(b..b + 1),
                }
            }
        }
        runs
    }

    /// Chooses a block to evict by CLOCK and moves it to Evicting (pinned blocks and blocks
    /// being read are skipped); returns it with the state it had, or `None` after two sweeps.
    pub fn take_victim(&self) -> Option<(usize, State)> {
        let n = self.slots.len();
        let mut hand = self.hand.lock().ok()?;
        for _ in 0..2 * n {
            let b = *hand;
            *hand = (*hand + 1) % n;
            let slot = &self.slots[b];
            let s = slot.state();
            if !s.cached() || slot.pinned.load(Relaxed) {
                continue;
            }
            if slot.referenced.swap(false, Relaxed) {
                continue;
            }
            if self.take(b, s) {
                return Some((b, s));
            }
        }
        None
    }

    /// Moves block `b` from `s` to Evicting unless it is being read.
    pub fn take(&self, b: usize, s: State) -> bool {
        let slot = &self.slots[b];
        if !slot.cas(s, State::Evicting) {
            return false;
        }
        if slot.readers.load(SeqCst) > 0 {
            slot.set(s);
            return false;
        }
        true
    }

    /// Marks the blocks of `blocks` as being read (not evictable).
    pub fn hold(&self, blocks: Range<usize>) {
        for b in blocks {
            self.slots[b].readers.fetch_add(1, SeqCst);
        }
    }

    /// Ends a [`Blocks::hold`]; the blocks are referenced for CLOCK.
    pub fn unhold(&self, blocks: Range<usize>) {
        for b in blocks {
            self.slots[b].referenced.store(true, Relaxed);
            self.slots[b].readers.fetch_sub(1, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_and_bytes_clamp_to_the_object() {
        let b = Blocks::new(2 * BLOCK + 10, 8);
        assert_eq!(b.count(), 3);
        assert_eq!(b.covering(&(0..1)), 0..1);
        assert_eq!(b.covering(&(BLOCK - 1..BLOCK + 1)), 0..2);
        assert_eq!(b.covering(&(0..u64::MAX)), 0..3);
        assert_eq!(b.covering(&(5 * BLOCK..6 * BLOCK)), 0..0);
        assert_eq!(b.bytes(2), 2 * BLOCK..2 * BLOCK + 10);
        assert_eq!(b.run_bytes(&(1..3)), BLOCK..2 * BLOCK + 10);
    }

    #[test]
    fn claims_are_single_flight_and_runs_merge_up_to_the_limit() {
        let n = 40u64;
        let b = Blocks::new(n * BLOCK, n);
        b.slot(3).set(State::Present);
        let runs = b.claim(0..n as usize);
        let per = (MERGE / BLOCK) as usize;
        assert_eq!(runs, vec![0..3, 4..4 + per, 4 + per..4 + 2 * per, 36..40]);
        // A second claimer gets nothing: every block is being fetched.
        assert!(b.claim(0..n as usize).is_empty());
        let got = std::sync::atomic::AtomicUsize::new(0);
        let b = Blocks::new(4 * BLOCK, 4);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| got.fetch_add(b.claim(0..4).iter().map(|r| r.len()).sum(), SeqCst));
            }
        });
        assert_eq!(got.load(SeqCst), 4, "each block claimed once by 8 threads");
    }

    #[test]
    fn clock_skips_pinned_held_and_referenced_blocks() {
        let b = Blocks::new(4 * BLOCK, 4);
        for i in 0..4 {
            b.slot(i).set(State::Present);
        }
        b.slot(0).pinned.store(true, Relaxed);
        b.hold(1..2);
        b.slot(2).referenced.store(true, Relaxed);
        // Block 3 is the only candidate on the first sweep; block 2 loses its reference bit.
        assert_eq!(b.take_victim(), Some((3, State::Present)));
        assert_eq!(b.slot(3).state(), State::Evicting);
        assert_eq!(b.take_victim(), Some((2, State::Present)));
        // Only the pinned block and the held one are left.
        assert_eq!(b.take_victim(), None);
        b.unhold(1..2);
        assert_eq!(b.take_victim(), Some((1, State::Present)));
    }
}
