//! Work on blocks beyond one read: fetching ahead of readers (read-ahead's `will_need`, and
//! exact ranges for a sparse announced order), the whole-object download of `--warm` and
//! `--pin`, and the refetch of a sample's blocks that failed its CRC.

use super::blocks::State;
use super::{BlockCacheShared, MERGE};
use crate::storage::Storage;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

impl BlockCacheShared {
    /// Fetches the blocks of `r` again and writes them over the cached ones, unless another
    /// reader did so since generation `seen`. Bumps the generation: every sample is checked
    /// again.
    pub(super) fn refetch(&self, r: &Range<u64>, seen: u64) -> io::Result<()> {
        let Ok(_g) = self.refetching.lock() else {
            return Err(io::Error::other("poisoned"));
        };
        if self
            .generation
            .compare_exchange(seen, seen + 1, SeqCst, SeqCst)
            .is_err()
        {
            return Ok(());
        }
        let blocks = self.blocks.covering(r);
        if blocks.is_empty() {
            return Ok(());
        }
        let whole = self.blocks.run_bytes(&blocks);
        let bytes = self.source.get_blocking(whole.clone())?;
        for b in blocks {
            let br = self.blocks.bytes(b);
            let chunk = &bytes[(br.start - whole.start) as usize..(br.end - whole.start) as usize];
            self.data.write_all_at(chunk, br.start)?;
            let c = crc32c::crc32c(chunk);
            self.table.set(b, c, chunk.len() as u32)?;
            self.blocks.slot(b).crc.store(c, Relaxed);
            self.fetched.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    /// Fetches every missing block of `r`, [`super::MERGE`] bytes per GET, waiting for them
    /// (the download of `--warm` and `pin`).
    pub(super) fn fetch_all(&self, r: &Range<u64>) -> io::Result<()> {
        self.fetch_all_of(std::slice::from_ref(r))
    }

    /// [`Self::fetch_all`] of several ranges at once: their GETs run concurrently.
    pub(super) fn fetch_all_of(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        let runs: Vec<Range<usize>> = (ranges.iter())
            .flat_map(|r| self.blocks.claim(self.blocks.covering(r)))
            .collect();
        let results = self.source.runtime().block_on(futures::future::join_all(
            runs.into_iter().map(|run| self.fetch(run)),
        ));
        for res in results {
            res?;
        }
        Ok(())
    }

    /// Starts fetching the missing blocks of `r` without waiting, unless an exact range holds
    /// its bytes; blocks kept from an earlier mount are asked of the kernel (large asynchronous reads) and checked ahead of the
    /// reader.
    pub(super) fn will_need(me: &Arc<BlockCacheShared>, r: &Range<u64>) {
        // Bytes held as an exact range (or being fetched as one) need no block.
        if me.exact.covers(r) {
            return;
        }
        let blocks = me.blocks.covering(r);
        if blocks.is_empty() {
            return;
        }
        let runs = me.blocks.claim(blocks.clone());
        if runs.is_empty() {
            if blocks
                .clone()
                .any(|b| me.blocks.slot(b).state() == State::Unchecked)
            {
                me.local.will_need(0, &me.blocks.run_bytes(&blocks));
                let me = me.clone();
                me.source.runtime().spawn_blocking({
                    let me = me.clone();
                    move || {
                        if let Err(e) = me.check_unchecked(blocks) {
                            log::warn!("checking cached blocks failed: {e}");
                        }
                    }
                });
            } else {
                me.local.will_need(0, r);
            }
            return;
        }
        for run in runs {
            let me2 = me.clone();
            me.source.runtime().spawn(async move {
                if let Err(e) = me2.fetch(run).await {
                    me2.fetch_log
                        .log(|| format!("read-ahead fetch failed: {e}"));
                }
            });
        }
    }

    /// Starts fetching `ranges` (sorted, disjoint) alone into memory, neighbours sharing a
    /// GET; ranges whose blocks are all cached are asked of the kernel instead, and those the
    /// memory bound leaves out are fetched as blocks.
    pub(super) fn will_need_exact(me: &Arc<BlockCacheShared>, ranges: &[Range<u64>]) {
        let mut wanted = Vec::with_capacity(ranges.len());
        for r in ranges {
            let r = r.start.min(me.len)..r.end.min(me.len);
            if r.is_empty() {
                continue;
            }
            if me
                .blocks
                .covering(&r)
                .all(|b| me.blocks.slot(b).state().cached())
            {
                me.local.will_need(0, &r);
            } else {
                wanted.push(r);
            }
        }
        let (claimed, left) = me.exact.claim(&wanted, MERGE);
        for r in left {
            BlockCacheShared::will_need(me, &r);
        }
        for run in claimed {
            let me2 = me.clone();
            me.source.runtime().spawn(async move {
                let res = me2.source.get(run.clone()).await;
                if let Err(e) = &res {
                    me2.fetch_log.log(|| {
                        format!(
                            "read-ahead fetch of bytes {}..{} failed: {e}",
                            run.start, run.end
                        )
                    });
                }
                me2.exact.fill(run.start, &res);
            });
        }
    }
}
