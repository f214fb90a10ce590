//! Pinning: keeps a prefix of a storage object in memory (see [`Storage::pin`]), locked in
//! 64 MiB steps from its start (storage order) on a background thread, so progress is visible
//! in the stats and the mount answers while the pin proceeds (`loosefs mount --wait` returns
//! once it is done).
//!
//! Each step is first asked for whole (`will_need`, with the next step asked before the
//! current one is locked), so the device streams it in large requests: locking alone faults
//! the mapping page by page (it is advised random), which measured about 65 MB/s on a disk that
//! streams the pack at about 500 MB/s.

use crate::catalog::ObjectId;
use crate::storage::Storage;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Bytes locked per call.
const STEP: u64 = 64 << 20;

/// Progress of the pin of one object's prefix.
#[derive(Debug, Default)]
pub struct Pinner {
    /// Bytes to pin.
    pub target: AtomicU64,
    /// Bytes pinned so far (a prefix).
    pub pinned: AtomicU64,
}

impl Pinner {
    /// Starts pinning the first `bytes` of objects `objs`, taken one after the other (each
    /// whole before the next), on a background thread. `pinned` counts bytes of that
    /// sequence. The pages stay locked for the life of `storage`.
    pub fn start(self: &Arc<Self>, storage: Arc<dyn Storage>, objs: Vec<ObjectId>, bytes: u64) {
        let total: u64 = objs.iter().map(|&o| storage.len(o)).sum();
        let bytes = bytes.min(total);
        self.target.store(bytes, Relaxed);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("loosefs-pin".into())
            .spawn(move || {
                let mut base = 0;
                for obj in objs {
                    let len = storage.len(obj).min(bytes.saturating_sub(base));
                    let mut off = 0;
                    if len > 0 {
                        storage.will_need(obj, &(0..STEP.min(len)));
                    }
                    while off < len {
                        let end = (off + STEP).min(len);
                        if end < len {
                            storage.will_need(obj, &(end..(end + STEP).min(len)));
                        }
                        if let Err(e) = storage.pin(obj, &(off..end)) {
                            log::error!("pinning bytes {off}..{end} of object {obj} failed: {e}");
                            return;
                        }
                        off = end;
                        me.pinned.store(base + off, Relaxed);
                    }
                    base += storage.len(obj);
                    if base >= bytes {
                        break;
                    }
                }
                log::info!("pinned {bytes} bytes");
            });
        if let Err(e) = spawned {
            log::error!("cannot start the pinning thread: {e}");
        }
    }

    /// The pinned prefix of the object that starts at `base` in the pinned sequence and is
    /// `len` bytes long, rounded up to whole pages (the lock covers whole pages).
    pub fn pinned_in(&self, base: u64, len: u64) -> u64 {
        let p = self.pinned.load(Relaxed);
        if p <= base {
            0
        } else {
            ((p - base).div_ceil(4096) * 4096).min(len.div_ceil(4096) * 4096)
        }
    }
}
