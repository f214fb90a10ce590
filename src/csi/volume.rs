//! A volume staged on this node: one daemon per volume per node (NodeStageVolume), mounted at
//! the kubelet's staging path and served by the mounter; every pod's target is a read-only bind
//! of it ([`super::publish`]). NodeUnstageVolume ends it once no pod's target holds it.
//!
//! What the node keeps, under the work directory (`--work-dir`, root's, shared with the
//! mounter at the same path):
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

use super::mounter::{self, Event, Request};
use super::secrets::Secrets;
use super::target::{
    is_ours, mount_source, no_links_below, remove_tree, statvfs_within, unmount_ours,
};
use super::{HEALTH_CHECK, NodeConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};
use tonic::Status;

/// What a stage asks for, checked.
pub(super) struct Stage {
    /// The volume id (the PV's `volumeHandle`).
    pub volume_id: String,
    /// What the daemon serves.
    pub source: String,
    /// The `loosefs mount` options, checked.
    pub args: Vec<String>,
    /// The volume's own credentials (its Secret), for its daemon alone.
    pub secrets: Secrets,
}

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
    /// What `s` would be on record when staged at `staging`.
    pub fn of(s: &Stage, staging: &Path) -> Staged {
        Staged {
            volume_id: s.volume_id.clone(),
            staging: staging.to_path_buf(),
            source: s.source.clone(),
            args: s.args.clone(),
            secret_names: s.secrets.names(),
        }
    }

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

fn record_path(config: &NodeConfig, volume_id: &str) -> PathBuf {
    state_dir(config).join(format!("{}.json", hashed(&[volume_id])))
}

/// The volume's log directory.
pub(super) fn log_dir(config: &NodeConfig, volume_id: &str) -> PathBuf {
    config.work_dir.join("volumes").join(hashed(&[volume_id]))
}

/// The volume's cache directory for `source`.
fn cache_dir(config: &NodeConfig, volume_id: &str, source: &str) -> PathBuf {
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

/// NodeStageVolume of `s` at `staging` (checked, canonical): staged already (same options,
/// serving) is `OK`; staged with other options is `ALREADY_EXISTS`; a staged mount whose daemon
/// is gone is taken down and made again. Otherwise mounts `/dev/fuse` at `staging`, hands it to
/// the mounter with the volume's options, log and cache directories and Secret, and waits until
/// the daemon serves. Nothing of a failed stage is left mounted; its log is kept.
pub(super) fn stage(config: &NodeConfig, staging: &Path, s: &Stage) -> Result<(), Status> {
    let want = mount_source(&s.volume_id);
    let asked = Staged::of(s, staging);
    if let Some(old) = staged(config, &s.volume_id)
        && old.staging != staging
        && is_ours(&old.staging, &want)
    {
        return Err(Status::failed_precondition(format!(
            "volume {} is staged at {} already; unstage it there first",
            s.volume_id,
            old.staging.display()
        )));
    }
    if let Some(fstype) = crate::mount_table::mount_fstype(staging) {
        let source = crate::mount_table::mount_source(staging).unwrap_or_default();
        if !is_ours(staging, &want) {
            return Err(Status::already_exists(format!(
                "{}: already holds another mount ({fstype} of {source})",
                staging.display()
            )));
        }
        if let Some(old) = staged(config, &s.volume_id) {
            let d = old.differences(&asked);
            if !d.is_empty() {
                return Err(Status::already_exists(format!(
                    "volume {} is staged at {} with {}; unstage it before staging it with other \
                     options",
                    s.volume_id,
                    staging.display(),
                    d.join(", ")
                )));
            }
        }
        match statvfs_within(staging, HEALTH_CHECK) {
            Some(Ok(_)) => return Ok(()),
            None => {
                return Err(Status::aborted(format!(
                    "volume {}: its daemon is still starting; retry",
                    s.volume_id
                )));
            }
            Some(Err(e)) => {
                log::warn!(
                    "volume {}: the mount at {} answers {e} (its daemon ended): staging it again",
                    s.volume_id,
                    staging.display()
                );
                super::held::forget(staging);
                unmount_ours(staging, &want)?;
            }
        }
    }
    let (conn, owner) =
        mounter::connect(&config.mounter).map_err(|e| Status::unavailable(format!("{e:#}")))?;
    let logs = log_dir(config, &s.volume_id);
    let cache = cache_dir(config, &s.volume_id, &s.source);
    for dir in [&logs, &cache] {
        own_dir(dir, owner).map_err(|e| {
            Status::internal(format!("cannot make {} (--work-dir): {e}", dir.display()))
        })?;
    }
    let made = !staging.exists();
    std::fs::create_dir_all(staging).map_err(|e| {
        Status::internal(format!(
            "cannot make the staging path {}: {e}",
            staging.display()
        ))
    })?;
    // Again once made: no part of it became a link meanwhile.
    no_links_below(&config.kubelet_root(), staging)?;
    let mut args = s.args.clone();
    if !args.iter().any(|a| a.starts_with("--cache-size")) {
        let size = default_cache_size(config, &cache);
        args.push(format!("--cache-size={size}"));
    }
    let dev = crate::mount::mount_fuse(staging, &want, true, Some(owner), true)
        .map_err(|e| Status::internal(format!("{}: {e:#}", staging.display())))?;
    write_json(&record_path(config, &s.volume_id), &asked)?;
    let req = Request {
        volume_id: s.volume_id.clone(),
        source: s.source.clone(),
        args,
        dir: logs.clone(),
        cache: Some(cache),
        secrets: s.secrets.clone(),
        kept: None,
    };
    // The plugin's copy, handed to the next mounter if this one ends ([`super::held`]).
    let copy = dev
        .try_clone()
        .map_err(|e| Status::internal(format!("cannot keep a copy of the connection: {e}")))?;
    let outcome = mounter::hand_over(conn, dev, &req, &config.mounter)
        .map_err(|e| Status::unavailable(format!("{e:#}")))
        .and_then(|events| wait_ready(config, staging, &s.volume_id, &logs, events));
    match outcome {
        Ok((kept, events)) => {
            let held = super::held::Held {
                volume_id: s.volume_id.clone(),
                target: staging.to_path_buf(),
                source_name: want,
                dev: copy,
                req: Request { kept, ..req },
            };
            super::held::watch(config.mounter.clone(), held, events);
            log::info!(
                "volume {}: {} staged at {}{}",
                s.volume_id,
                s.source,
                staging.display(),
                if s.secrets.is_empty() {
                    String::new()
                } else {
                    format!(" with its Secret ({})", s.secrets.names().join(", "))
                }
            );
            Ok(())
        }
        Err(status) if status.code() == tonic::Code::Aborted => Err(status),
        Err(status) => {
            // Nothing of this stage is left mounted after a failure; its log stays.
            let _ = unmount_ours(staging, &want);
            if made {
                let _ = std::fs::remove_dir(staging);
            }
            remove_record(&record_path(config, &s.volume_id));
            Err(status)
        }
    }
}

/// NodeUnstageVolume of `volume_id` at `staging`: `FAILED_PRECONDITION` while a pod's target
/// still holds the volume (the kubelet unpublishes first); else unmounts the staged mount (its
/// daemon ends), removes the staging path and the record, and keeps the log and cache for
/// `--keep-after-unstage`. `OK` when it is not staged there; another mount there is left.
pub(super) fn unstage(config: &NodeConfig, staging: &Path, volume_id: &str) -> Result<(), Status> {
    let want = mount_source(volume_id);
    if is_ours(staging, &want) {
        let others: Vec<String> = crate::mount_table::loosefs_mount_points_of(&want)
            .into_iter()
            .filter(|p| p != staging)
            .map(|p| p.display().to_string())
            .collect();
        if !others.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {volume_id} is still published at {}: unpublish it there first",
                others.join(", ")
            )));
        }
    }
    super::held::forget(staging);
    unmount_ours(staging, &want)?;
    if let Some(fstype) = crate::mount_table::mount_fstype(staging) {
        let source = crate::mount_table::mount_source(staging).unwrap_or_default();
        log::warn!(
            "volume {volume_id}: {} holds another mount ({fstype} of {source}), left as it is",
            staging.display()
        );
        return Ok(());
    }
    match std::fs::remove_dir(staging) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("cannot remove the staging path {}: {e}", staging.display()),
    }
    if let Some(rec) = staged(config, volume_id)
        && rec.staging == staging
    {
        remove_record(&record_path(config, volume_id));
        // The clock of what is kept after the unstage starts now.
        touch(&log_dir(config, volume_id));
        touch(&cache_dir(config, volume_id, &rec.source));
    }
    prune_unstaged(config);
    Ok(())
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
fn touch(dir: &Path) {
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
fn default_cache_size(config: &NodeConfig, cache: &Path) -> u64 {
    let Ok(s) = nix::sys::statvfs::statvfs(&config.work_dir) else {
        return 0;
    };
    let free = s.blocks_available() * s.fragment_size();
    let total = s.blocks() * s.fragment_size();
    (free + tree_bytes(cache, 4)).saturating_sub(total / 100 * u64::from(config.cache_keep_free))
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
fn own_dir(dir: &Path, (uid, gid): (u32, u32)) -> std::io::Result<()> {
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

/// Waits until the mount at `staging` answers `statfs` (the daemon is serving), or the daemon
/// ends, or the publish timeout passes.
///
/// Returns the keeper's offer line if it came already, and the mounter's later events.
fn wait_ready(
    config: &NodeConfig,
    staging: &Path,
    volume_id: &str,
    logs: &Path,
    events: impl Iterator<Item = Event> + Send + 'static,
) -> Result<(Option<String>, super::held::Events), Status> {
    enum Seen {
        Ready(nix::Result<()>),
        Daemon(Event),
    }
    let mut kept = None;
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (tx, t) = (tx.clone(), staging.to_path_buf());
        std::thread::spawn(move || {
            let _ = tx.send(Seen::Ready(nix::sys::statfs::statfs(&t).map(|_| ())));
        });
    }
    std::thread::spawn(move || {
        for e in events {
            if tx.send(Seen::Daemon(e)).is_err() {
                break;
            }
        }
    });
    let log_hint = format!("its log: {}/daemon.log on the node", logs.display());
    let deadline = Instant::now() + config.publish_timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Seen::Ready(Ok(()))) => {
                let later = rx.into_iter().filter_map(|s| match s {
                    Seen::Daemon(e) => Some(e),
                    Seen::Ready(_) => None,
                });
                return Ok((kept, super::held::forward(later)));
            }
            Ok(Seen::Daemon(Event::Kept { line })) => kept = Some(line),
            Ok(Seen::Daemon(Event::Started { pid })) => {
                log::info!("volume {volume_id}: daemon pid {pid} (in the mounter) starting");
            }
            Ok(Seen::Daemon(Event::Exited { code, tail })) => {
                return Err(daemon_failed(volume_id, code, &tail));
            }
            // statfs failed: the daemon ended; its `exited` event says why.
            Ok(Seen::Ready(Err(e))) => match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Seen::Daemon(Event::Exited { code, tail })) => {
                    return Err(daemon_failed(volume_id, code, &tail));
                }
                _ => {
                    return Err(Status::internal(format!(
                        "volume {volume_id}: the mount answers {e} and the mounter said nothing \
                         ({log_hint})"
                    )));
                }
            },
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err(Status::aborted(format!(
                    "volume {volume_id}: its daemon is not serving after {} s (a first index \
                     of a large source takes a while); the kubelet retries ({log_hint})",
                    config.publish_timeout.as_secs()
                )));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Status::internal(format!(
                    "volume {volume_id}: the mounter closed the connection (see the \
                     loosefs-mounter container's log)"
                )));
            }
        }
    }
}

/// The status for a daemon that ended before serving, from what it wrote last.
pub(super) fn daemon_failed(volume_id: &str, code: i32, tail: &str) -> Status {
    let msg = format!("volume {volume_id}: the daemon ended ({code}) before serving: {tail}");
    let t = tail.to_ascii_lowercase();
    if t.contains("permission denied") || t.contains("access denied") || t.contains("accessdenied")
    {
        Status::permission_denied(msg)
    } else if t.contains("no such file")
        || t.contains("not found")
        || t.contains("no such object")
        || t.contains("nosuchbucket")
        || t.contains("does not exist")
    {
        Status::not_found(msg)
    } else {
        Status::internal(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_record_names_what_differs_and_never_a_secret_value() {
        let given = [("aws_secret_access_key".to_string(), "s3cr3t".to_string())].into();
        let s = Stage {
            volume_id: "pv".into(),
            source: "s3://b/p/".into(),
            args: vec!["--warm".into()],
            secrets: Secrets::from_request(&given).unwrap(),
        };
        let a = Staged::of(&s, Path::new("/k/g"));
        let text = serde_json::to_string(&a).unwrap();
        assert!(
            !text.contains("s3cr3t") && text.contains("AWS_SECRET_ACCESS_KEY"),
            "{text}"
        );
        let mut b = a.clone();
        b.args = vec!["--decode=npy".into()];
        assert_eq!(
            a.differences(&b),
            vec!["options [--warm] (asked: [--decode=npy])".to_string()]
        );
        assert!(a.differences(&a).is_empty());
    }

    #[test]
    fn a_daemon_failure_is_told_apart_by_what_it_said() {
        let code = |t: &str| daemon_failed("v", 1, t).code();
        assert_eq!(
            code("cannot open /d: Permission denied (os error 13)"),
            tonic::Code::PermissionDenied
        );
        assert_eq!(code("/d: No such file or directory"), tonic::Code::NotFound);
        assert_eq!(code("something else"), tonic::Code::Internal);
    }
}
