//! What the node keeps for its volumes, under the work directory (`--work-dir`, root's, shared
//! with the mounter at the same path), and for how long:
//!
//! | path | owner | what | kept |
//! |---|---|---|---|
//! | `state/VOL.json`, `state/targets/TGT.json` | root, 0700 | what a volume was staged with, what a target was published with (secret *names* only) | while staged / published |
//! | `volumes/VOL/` | the mounter's user, 0700 | the daemon's log (`daemon.log`, rotated) and standard error | `--keep-after-unstage` after the unstage |
//! | `caches/VOL-SRC/` | the mounter's user, 0700 | the block cache and index, keyed by the volume and its source (a remote object's blocks are keyed by its version inside) | across publishes, restarts and restages; `--keep-after-unstage` after the unstage |
//!
//! (VOL, TGT, SRC: 16 hex digits of the XXH3 of the volume id, target path, source.) A
//! volume's cache is bounded by default so that the work directory's file system keeps
//! `--cache-keep-free` percent free (20: above the kubelet's default eviction thresholds,
//! `nodefs.available<10%`, `imagefs.available<15%`).

use super::NodeConfig;
use super::target::remove_tree;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tonic::Status;

/// What a staged volume was staged with (root's state directory): a restage or a publish with
/// other options is told apart by it. Holds the secrets' names, never their values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Staged {
    /// The volume id.
    pub volume_id: String,
    /// Its staging path, canonical.
    pub staging: PathBuf,
    /// Its source.
    pub source: String,
    /// Its options as asked (without the driver's own).
    pub args: Vec<String>,
    /// The variables its Secret gave.
    pub secret_names: Vec<String>,
}

impl Staged {
    /// What differs from `other` (what was asked), in words: this record's value, then the
    /// asked one (empty: nothing).
    pub fn differences(&self, other: &Staged) -> Vec<String> {
        let mut d = Vec::new();
        let mut differ = |what: &str, mine: String, asked: String| {
            if mine != asked {
                d.push(format!("{what} {mine} (asked: {asked})"));
            }
        };
        differ(
            "the staging path",
            self.staging.display().to_string(),
            other.staging.display().to_string(),
        );
        differ("source", self.source.clone(), other.source.clone());
        differ(
            "options",
            format!("[{}]", self.args.join(" ")),
            format!("[{}]", other.args.join(" ")),
        );
        differ(
            "a Secret of",
            format!("[{}]", self.secret_names.join(", ")),
            format!("[{}]", other.secret_names.join(", ")),
        );
        d
    }
}

/// 16 hex digits of the XXH3 of `parts` (joined by NUL): the names under the work directory.
pub(super) fn hashed(parts: &[&str]) -> String {
    format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(parts.join("\0").as_bytes())
    )
}

/// Root's private state directory (made 0700 at the driver's start).
pub(super) fn state_dir(config: &NodeConfig) -> PathBuf {
    config.work_dir.join("state")
}

pub(super) fn record_path(config: &NodeConfig, volume_id: &str) -> PathBuf {
    state_dir(config).join(format!("{}.json", hashed(&[volume_id])))
}

/// The volume's log directory.
pub(super) fn log_dir(config: &NodeConfig, volume_id: &str) -> PathBuf {
    config.work_dir.join("volumes").join(hashed(&[volume_id]))
}

/// The volume's cache directory for `source`.
pub(super) fn cache_dir(config: &NodeConfig, volume_id: &str, source: &str) -> PathBuf {
    config
        .work_dir
        .join("caches")
        .join(hashed(&[volume_id, source]))
}

/// Reads a JSON record of root's state directory; `None` when there is none or it does not
/// parse (logged).
pub(super) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let text = std::fs::read(path).ok()?;
    match serde_json::from_slice(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            log::warn!(
                "{}: not a record this driver wrote ({e}); ignored",
                path.display()
            );
            None
        }
    }
}

/// Writes a JSON record into root's state directory (written beside, then renamed: a crash
/// never leaves half a record). No other user can write in that directory.
pub(super) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), Status> {
    let fail = |e: &dyn std::fmt::Display| {
        Status::internal(format!("cannot write the record {}: {e}", path.display()))
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| fail(&e))?;
    }
    let tmp = path.with_extension("json.new");
    let text = serde_json::to_vec(value).map_err(|e| fail(&e))?;
    std::fs::write(&tmp, text).map_err(|e| fail(&e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail(&e))
}

/// Removes a record, absent or not.
pub(super) fn remove_record(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        log::warn!("cannot remove {}: {e}", path.display());
    }
}

/// The record of `volume_id`'s stage, if it is staged.
pub(super) fn staged(config: &NodeConfig, volume_id: &str) -> Option<Staged> {
    read_json(&record_path(config, volume_id))
}

/// Every volume staged on this node, from root's records.
pub(super) fn all_staged(config: &NodeConfig) -> Vec<Staged> {
    let Ok(rd) = std::fs::read_dir(state_dir(config)) else {
        return Vec::new();
    };
    let mut all: Vec<Staged> = rd
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| read_json(&e.path()))
        .collect();
    all.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
    all
}

/// Removes the log and cache directories of volumes not staged whose last use (their
/// directory's mtime, set at the unstage) is older than `--keep-after-unstage`.
pub(super) fn prune_unstaged(config: &NodeConfig) {
    let mut live: std::collections::HashSet<String> = Default::default();
    for rec in all_staged(config) {
        live.insert(hashed(&[&rec.volume_id]));
        live.insert(hashed(&[&rec.volume_id, &rec.source]));
    }
    let now = SystemTime::now();
    for kind in ["volumes", "caches"] {
        let Ok(rd) = std::fs::read_dir(config.work_dir.join(kind)) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if live.contains(&name) {
                continue;
            }
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > config.keep_after_unstage);
            if old {
                log::info!(
                    "removing {} (unstaged, kept long enough)",
                    e.path().display()
                );
                remove_tree(&e.path());
            }
        }
    }
}

/// Sets `dir`'s mtime to now, through a descriptor opened without following a link.
pub(super) fn touch(dir: &Path) {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    if let Ok(fd) = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        let now = nix::sys::time::TimeSpec::UTIME_NOW;
        let _ = nix::sys::stat::futimens(&fd, &now, &now);
    }
}

/// The cache size a volume gets unless its options set one: what keeps `--cache-keep-free`
/// percent of the work directory's file system free, counting what its cache holds already.
/// With the file system already below that margin it is 0, which the daemon raises to its
/// smallest cache ([`crate::storage::block_cache::MIN_CACHE`]): blocks are then not kept
/// across stages. Logged once per stage, with the two ways out.
pub(super) fn default_cache_size(config: &NodeConfig, volume_id: &str, cache: &Path) -> u64 {
    let Ok(s) = nix::sys::statvfs::statvfs(&config.work_dir) else {
        return 0;
    };
    let free = s.blocks_available() * s.fragment_size();
    let total = s.blocks() * s.fragment_size();
    let size = cache_room(free, total, tree_bytes(cache, 4), config.cache_keep_free);
    if size < crate::storage::block_cache::MIN_CACHE {
        log::warn!(
            "volume {volume_id}: {} has {:.1} GB of {:.1} GB free, under --cache-keep-free {}%: its block \
             cache is held to the smallest and its blocks are not kept across stages (give the \
             volume a cache-size, or the driver a lower --cache-keep-free)",
            config.work_dir.display(),
            free as f64 / 1e9,
            total as f64 / 1e9,
            config.cache_keep_free
        );
    }
    size
}

/// Bytes a cache holding `held` bytes may grow to on a file system of `total` bytes with
/// `free` available, leaving `keep_free` percent of `total` free; 0 when it is below that.
fn cache_room(free: u64, total: u64, held: u64, keep_free: u8) -> u64 {
    (free + held).saturating_sub(total / 100 * u64::from(keep_free))
}

/// Bytes the files under `dir` hold on disk, `depth` levels down, links not followed.
fn tree_bytes(dir: &Path, depth: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() && depth > 0 => tree_bytes(&e.path(), depth - 1),
            Ok(m) if m.is_file() => m.blocks() * 512,
            _ => 0,
        })
        .sum()
}

/// Makes `dir` (under a directory of root's) the mounter's user's, 0700: new, or kept as it
/// is when it is there (a log and cache kept across stages). Opened with `O_NOFOLLOW` and
/// changed through that descriptor: root never changes what a link points at.
pub(super) fn own_dir(dir: &Path, (uid, gid): (u32, u32)) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700))?;
    nix::unistd::fchown(
        &fd,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_cache_leaves_the_margin_free_and_counts_what_it_holds() {
        const G: u64 = 1 << 30;
        // 100 GiB disk, 30 GiB free, 20 % kept: 10 GiB of room, plus what the cache holds.
        assert_eq!(cache_room(30 * G, 100 * G, 0, 20), 10 * G);
        assert_eq!(cache_room(30 * G, 100 * G, 5 * G, 20), 15 * G);
        // Below the margin already (this CI machine's disk at 18 %): nothing, not a wrap.
        assert_eq!(cache_room(18 * G, 100 * G, 0, 20), 0);
        assert_eq!(cache_room(18 * G, 100 * G, 3 * G, 20), G);
        assert_eq!(cache_room(18 * G, 100 * G, 0, 0), 18 * G);
    }

    #[test]
    fn a_kept_directory_is_taken_as_it_is_and_never_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let before = std::fs::metadata(&elsewhere).unwrap();
        let planted = d.path().join("planted");
        std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        assert!(own_dir(&planted, me).is_err());
        use std::os::unix::fs::MetadataExt;
        let after = std::fs::metadata(&elsewhere).unwrap();
        assert_eq!((after.uid(), after.mode()), (before.uid(), before.mode()));
        let kept = d.path().join("a/kept");
        own_dir(&kept, me).unwrap();
        std::fs::write(kept.join("daemon.log"), b"earlier").unwrap();
        own_dir(&kept, me).unwrap();
        assert_eq!(std::fs::read(kept.join("daemon.log")).unwrap(), b"earlier");
        let m = std::fs::symlink_metadata(&kept).unwrap();
        assert!(m.is_dir() && m.mode() & 0o777 == 0o700);
    }
}
