//! The frame view of a prefix of loose objects (`--decode frames` over `s3://…/`,
//! `gs://…/`, …): FFmpeg's demuxer and the Parquet reader read local files, so the files the
//! view decodes from are copied out of the block cache into a directory of the mount's own
//! under the cache root (a *spool*, `.frames-XXXX/`), then served as a local directory's
//! frames are ([`super::frame_tree`]). The spool is locked while its mount lives and removed
//! with its [`FrameServer`]; spools a killed daemon left behind are swept by the next
//! frame-view mount on that cache root.

use super::frames::FrameServer;
use super::tree::FrameTree;
use crate::catalog::Catalog;
use crate::storage::Storage;
use anyhow::{Context, Result, anyhow};
use std::path::Path;
use std::sync::Arc;

/// The frame view of the prefix `url` (its tree `index` over `storage`, the objects' block
/// cache under `cache_root`), over `base`, the prefix's own catalog: the videos and metadata
/// copied into a spool under `cache_root` (owner-only, as the block cache beside it: the copies
/// were fetched with credentials), held by the returned server and removed with it. Frames are
/// decoded with `decode`'s threads within its frame-cache budget.
///
/// Errors: the spool cannot be made or locked, a fetch fails (names the file), or the copies
/// hold no video ([`super::frame_tree`]'s errors), each prefixed with the URL.
pub fn frames_of_prefix(
    url: &str,
    cache_root: &Path,
    index: &[u8],
    storage: &dyn Storage,
    base: Arc<dyn Catalog>,
    decode: &crate::decode::DecodeOptions,
) -> Result<(FrameTree, Arc<FrameServer>)> {
    let cannot = || format!("cannot serve the frames of {url}");
    sweep_spools(cache_root);
    let spool = tempfile::Builder::new()
        .prefix(SPOOL_PREFIX)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(cache_root)
        .with_context(cannot)?;
    let lock = lock_spool(spool.path()).with_context(cannot)?;
    let bytes = copy_out(url, index, storage, spool.path(), 16).with_context(cannot)?;
    log::info!(
        "{url}: {bytes} bytes of videos and metadata fetched for the frame view into {}",
        spool.path().display()
    );
    let (tree, server) = super::frame_tree(spool.path(), base, decode).with_context(cannot)?;
    // The lock is released before the directory is removed (fields drop in order).
    server.keep(Box::new((lock, spool)));
    Ok((tree, server))
}

/// Names of the directories under a cache root holding a mount's copies of the videos its
/// frame view decodes ([`copy_out`]).
pub const SPOOL_PREFIX: &str = ".frames-";

/// Locks the copies' directory `dir` for the life of the returned lock (an exclusive `flock`
/// on its `lock` file, which then holds the daemon's pid), so [`sweep_spools`] leaves it.
/// Errors: the file cannot be created or written.
pub fn lock_spool(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let mut lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| anyhow!("cannot lock {}: {e}", dir.display()))?;
    // Written once locked: a sweep that finds the file empty leaves the directory (a mount
    // between its create and its lock).
    writeln!(lock, "{}", std::process::id())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(lock)
}

/// Whether the copies' directory `dir` is left by a mount that ended: its `lock` is a
/// regular file (opened without following a link or blocking on a FIFO), written by the mount
/// that locked it, and not locked now.
fn spool_is_free(dir: &Path) -> bool {
    // None: the lock file is gone, or not a regular file.
    let Some(f) = crate::storage::block_cache::open_lock(dir) else {
        return false;
    };
    // Made but not locked yet by a mount starting now.
    if !f.metadata().is_ok_and(|m| m.len() > 0) {
        return false;
    }
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
}

/// Removes the copies' directories under `root` that no live mount holds (their lock is
/// free: a daemon killed before it could remove its own). Failures are logged.
pub fn sweep_spools(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let ours = e.file_name().to_string_lossy().starts_with(SPOOL_PREFIX);
        if !ours || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if spool_is_free(&path) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => log::info!("removed {} (left by a mount that ended)", path.display()),
                Err(e) => log::warn!("cannot remove {}: {e}", path.display()),
            }
        }
    }
}

/// The files a frame view decodes from (`--decode frames`) of the prefix `url`, whose tree
/// is `index` over `storage` (its block cache), copied whole into `dir` under their paths in the tree: a LeRobot dataset's `meta/` and Parquet
/// files and every video file ([`super::VIDEO_EXTENSIONS`]). FFmpeg's demuxer and
/// the Parquet reader read local files; each object is fetched once through the block cache
/// (its GETs pinned to the listed ETag), `at_once` at a time. Returns the bytes copied.
///
/// Errors: a fetch that fails (names the file), or `dir` cannot be written.
pub fn copy_out(
    url: &str,
    index: &[u8],
    storage: &dyn Storage,
    dir: &Path,
    at_once: usize,
) -> Result<u64> {
    use rayon::prelude::*;
    let ix = crate::pack::index::IndexView::parse(index).map_err(|e| anyhow!("{url}: {e}"))?;
    let mut wanted = Vec::new();
    let mut stack = vec![(0u32, String::new())];
    while let Some((i, path)) = stack.pop() {
        let r = ix.record(i).context("index record")?;
        for c in ix.children(&r) {
            let k = ix.record(c).context("index record")?;
            let name = String::from_utf8_lossy(ix.name(&k)).into_owned();
            let rel = if path.is_empty() {
                name
            } else {
                format!("{path}/{name}")
            };
            if k.is_dir {
                stack.push((c, rel));
                continue;
            }
            let ext = Path::new(&rel)
                .extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase);
            let video = ext
                .as_deref()
                .is_some_and(|e| super::VIDEO_EXTENSIONS.contains(&e));
            if video || rel.starts_with("meta/") || ext.as_deref() == Some("parquet") {
                wanted.push((rel, k.data_off, k.size));
            }
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(at_once.max(1))
        .build()
        .context("cannot start the threads that fetch the videos")?;
    pool.install(|| {
        wanted
            .par_iter()
            .try_for_each(|(rel, off, size)| -> Result<()> {
                let to = dir.join(rel);
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("cannot create {}", parent.display()))?;
                }
                let mut out = std::fs::File::create(&to)
                    .with_context(|| format!("cannot write {}", to.display()))?;
                let mut buf = vec![0u8; 4 << 20];
                let mut at = 0u64;
                while at < *size {
                    let n = (size - at).min(buf.len() as u64) as usize;
                    storage
                        .read_at(0, off + at, &mut buf[..n])
                        .with_context(|| format!("cannot fetch {url}{rel}"))?;
                    std::io::Write::write_all(&mut out, &buf[..n])
                        .with_context(|| format!("cannot write {}", to.display()))?;
                    at += n as u64;
                }
                Ok(())
            })
    })?;
    Ok(wanted.iter().map(|w| w.2).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_copies_a_killed_mount_left_are_swept_and_a_live_mounts_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dead = tmp.path().join(".frames-dead");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("lock"), b"1234\n").unwrap();
        std::fs::write(dead.join("a.mp4"), b"video").unwrap();
        // A mount between creating its lock file and locking it (the file still empty), and a
        // FIFO planted as a lock: both left, and the sweep does not block on the FIFO.
        let starting = tmp.path().join(".frames-starting");
        std::fs::create_dir(&starting).unwrap();
        std::fs::write(starting.join("lock"), b"").unwrap();
        let fifo = tmp.path().join(".frames-fifo");
        std::fs::create_dir(&fifo).unwrap();
        nix::unistd::mkfifo(&fifo.join("lock"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let live = tmp.path().join(".frames-live");
        std::fs::create_dir(&live).unwrap();
        let held = lock_spool(&live).unwrap();
        let blocks = tmp.path().join("objects-1");
        std::fs::create_dir(&blocks).unwrap();
        sweep_spools(tmp.path());
        assert!(!dead.exists(), "no mount holds it");
        assert!(starting.exists() && fifo.exists());
        assert!(
            live.exists() && blocks.exists(),
            "a live mount's copies and block caches stay"
        );
        drop(held);
        sweep_spools(tmp.path());
        assert!(!live.exists());
    }
}
