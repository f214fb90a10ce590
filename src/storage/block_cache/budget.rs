//! The size of a cache root: the budget of the whole root (`--cache-size`, or the free space
//! less a floor), each object's share of it, and the pruning of other objects' directories,
//! least recently used first, to keep within it.

use super::blocks::BLOCK;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Bytes `dir`'s files hold on disk (sparse blocks not counted).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// The budget of the whole cache root and this object's share of it, bytes: `asked`
/// (`--cache-size`) or, by default, what the root already holds plus the file system's free
/// space less 5% of its size (mountpoint-s3's default floor); the object's share is that, at
/// most its own size.
pub fn cache_budget(root: &Path, len: u64, asked: Option<u64>) -> (u64, u64) {
    let budget = asked.unwrap_or_else(|| {
        let held: u64 = std::fs::read_dir(root)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| disk_bytes(&e.path()))
                    .sum()
            })
            .unwrap_or(0);
        nix::sys::statvfs::statvfs(root)
            .map(|s| {
                let free = s.blocks_available() * s.fragment_size();
                let total = s.blocks() * s.fragment_size();
                (free + held).saturating_sub(total / 20)
            })
            .unwrap_or(u64::MAX)
    });
    let share = len.div_ceil(BLOCK).saturating_mul(BLOCK).min(budget);
    (budget, share)
}

/// Keeps the cache root within `budget` bytes once the object cached in `keep` holds its
/// `share`: other objects' directories (other URLs, or older versions of this one) that no
/// mount holds are removed, least recently used first (their block table's mtime), until the
/// rest fits beside the share. Failures are logged and skipped.
pub fn prune(root: &Path, keep: &Path, budget: u64, share: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    let mut others: Vec<(i64, PathBuf, u64)> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p != keep && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .map(|p| {
            let t = std::fs::metadata(p.join("blocks")).map_or(0, |m| m.mtime());
            let b = disk_bytes(&p);
            (t, p, b)
        })
        .collect();
    let mut total: u64 = others.iter().map(|o| o.2).sum();
    others.sort();
    for (_, p, bytes) in others {
        if total.saturating_add(share) <= budget {
            break;
        }
        // A directory locked by a live mount stays (one just unmounted may take a moment to
        // let go).
        let Some(mut lock) = open_lock(&p) else {
            continue;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let _l = loop {
            match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(l) => break Some(l),
                Err((f, _)) if std::time::Instant::now() < deadline => {
                    lock = f;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(_) => break None,
            }
        };
        if _l.is_none() {
            continue;
        }
        match std::fs::remove_dir_all(&p) {
            Ok(()) => {
                log::info!("block cache: removed {} ({bytes} bytes)", p.display());
                total -= bytes;
            }
            Err(e) => log::warn!("block cache: cannot remove {}: {e}", p.display()),
        }
    }
}

/// The `lock` file of the cache directory `dir` (a block cache's object directory, or a frame
/// spool's), opened for reading without following a link or blocking (a FIFO planted there
/// must not wedge a mount): `None` unless a regular file.
pub(crate) fn open_lock(dir: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join("lock"))
        .ok()?;
    f.metadata().is_ok_and(|m| m.is_file()).then_some(f)
}

/// The name of the file in an object's directory that holds the share its live mount took.
const SHARE_FILE: &str = "share";

/// Records in `dir` the `share` of the root its mount keeps, so mounts of other objects sharing
/// the root leave it room (see [`live_shares`]). Failures are logged: the share then counts 0.
pub fn record_share(dir: &super::CacheDir, share: u64) {
    let r = dir.open_rw(SHARE_FILE).and_then(|f| {
        use std::os::unix::fs::FileExt;
        f.set_len(0)?;
        f.write_all_at(share.to_string().as_bytes(), 0)
    });
    if let Err(e) = r {
        log::warn!(
            "block cache: cannot record the share of {}: {e}",
            dir.path().display()
        );
    }
}

/// The shares other live mounts hold in `root` (their directory locked by a running mount),
/// bytes, `keep` aside: what a new mount must leave them so the mounts together keep within the
/// root's budget. A share file is read without following links.
pub fn live_shares(root: &Path, keep: &Path) -> u64 {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(rd) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut sum = 0u64;
    for p in rd.filter_map(|e| e.ok()).map(|e| e.path()) {
        if p == keep || !std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let Some(lock) = open_lock(&p) else {
            continue;
        };
        let live = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockSharedNonblock).is_err();
        if !live {
            continue;
        }
        let share = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(p.join(SHARE_FILE))
            .ok()
            .and_then(|mut f| {
                let mut t = String::new();
                std::io::Read::read_to_string(&mut f, &mut t).ok()?;
                t.trim().parse::<u64>().ok()
            })
            .unwrap_or(0);
        sum = sum.saturating_add(share);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::block_cache::dir::{CacheDir, check_root};

    /// An object directory under `root` holding `mb` MiB of data, last used `age` s ago.
    fn object(root: &Path, name: &str, mb: usize, age: u64) -> PathBuf {
        let d = root.join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("data"), vec![1u8; mb << 20]).unwrap();
        std::fs::write(d.join("lock"), b"").unwrap();
        let blocks = File::create(d.join("blocks")).unwrap();
        let t = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
        blocks.set_modified(t).unwrap();
        d
    }

    #[test]
    fn the_shares_of_live_mounts_are_counted_and_those_of_finished_ones_not() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        check_root(&root).unwrap();
        let (live, done) = (root.join("live"), root.join("done"));
        let held = CacheDir::lock(&live).unwrap();
        record_share(&held, 30 << 20);
        {
            let d = CacheDir::lock(&done).unwrap();
            record_share(&d, 50 << 20);
        }
        let keep = root.join("keep");
        assert_eq!(
            live_shares(&root, &keep),
            30 << 20,
            "the unmounted one's share is free"
        );
        assert_eq!(live_shares(&root, &live), 0, "its own share aside");
        drop(held);
        assert_eq!(live_shares(&root, &keep), 0);
    }

    #[test]
    fn the_share_is_the_object_in_whole_blocks_within_the_budget() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(cache_budget(d.path(), 1, Some(1 << 30)), (1 << 30, BLOCK));
        assert_eq!(
            cache_budget(d.path(), 5 << 30, Some(1 << 30)),
            (1 << 30, 1 << 30)
        );
    }

    #[test]
    fn pruning_removes_the_least_recently_used_unheld_objects_until_the_share_fits() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        check_root(&root).unwrap();
        let oldest = object(&root, "oldest", 3, 300);
        let older = object(&root, "older", 3, 200);
        let recent = object(&root, "recent", 3, 10);
        let held = object(&root, "held", 3, 400);
        let keep = root.join("keep");
        let _lock = CacheDir::lock(&held).unwrap();
        // 12 MiB held by others; 8 MiB of budget with a 2 MiB share: 6 MiB may stay.
        prune(&root, &keep, 8 << 20, 2 << 20);
        assert!(
            !oldest.exists() && !older.exists(),
            "least recently used first"
        );
        assert!(recent.exists(), "removed no more than needed");
        assert!(held.exists(), "a directory a mount holds stays");
    }

    #[test]
    fn a_fifo_planted_as_a_lock_wedges_neither_the_shares_nor_the_pruning() {
        // reliability-probe.md (the previous probe's one defect left): a frame spool's `lock`
        // made a FIFO blocked a mount in its open, forever.
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        check_root(&root).unwrap();
        let planted = object(&root, ".frames-planted", 1, 500);
        std::fs::remove_file(planted.join("lock")).unwrap();
        nix::unistd::mkfifo(&planted.join("lock"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r = root.clone();
        std::thread::spawn(move || {
            let shares = live_shares(&r, &r.join("keep"));
            prune(&r, &r.join("keep"), 0, 0);
            let _ = tx.send(shares);
        });
        let shares = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("blocked on the FIFO");
        assert_eq!(shares, 0);
        assert!(planted.exists(), "not a lock: left alone");
    }
}
