//! A volume staged on this node: one daemon per volume per node (NodeStageVolume), mounted at
//! the kubelet's staging path and served by the mounter; every pod's target is a read-only bind
//! of it ([`super::publish`]). NodeUnstageVolume ends it once no pod's target holds it. What it
//! keeps, and where, is [`super::work_dir`]'s.

use super::mounter::{self, Event, Request};
use super::secrets::Secrets;
use super::target::{
    another_mount_left, is_ours, mount_source, no_links_below, statvfs_within, unmount_ours,
};
use super::work_dir::{
    Staged, cache_dir, default_cache_size, log_dir, own_dir, prune_unstaged, record_path,
    remove_record, staged, touch, write_json,
};
use super::{HEALTH_CHECK, NodeConfig};
use std::path::Path;
use std::time::{Duration, Instant};
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

/// What `s` is on record as, staged at `staging`.
pub(super) fn record_of(s: &Stage, staging: &Path) -> Staged {
    Staged {
        volume_id: s.volume_id.clone(),
        staging: staging.to_path_buf(),
        source: s.source.clone(),
        args: s.args.clone(),
        secret_names: s.secrets.names(),
    }
}

/// NodeStageVolume of `s` at `staging` (checked, canonical): staged already (same options,
/// serving) is `OK`; staged with other options is `ALREADY_EXISTS`; a staged mount whose daemon
/// is gone is taken down and made again. Otherwise mounts `/dev/fuse` at `staging`, hands it to
/// the mounter with the volume's options, log and cache directories and Secret, and waits until
/// the daemon serves. Nothing of a failed stage is left mounted; its log is kept.
pub(super) fn stage(config: &NodeConfig, staging: &Path, s: &Stage) -> Result<(), Status> {
    let want = mount_source(&s.volume_id);
    let asked = record_of(s, staging);
    if already_staged(config, staging, s, &asked)? {
        return Ok(());
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
        let size = default_cache_size(config, &s.volume_id, &cache);
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

/// What is at the staging path already: `true` when the volume is staged there as asked and
/// serving (the stage is `OK`), `false` when nothing is or its dead mount was taken down.
/// Errors: staged elsewhere (`FAILED_PRECONDITION`), another mount there or other options
/// (`ALREADY_EXISTS`), its daemon not answering yet (`ABORTED`).
fn already_staged(
    config: &NodeConfig,
    staging: &Path,
    s: &Stage,
    asked: &Staged,
) -> Result<bool, Status> {
    let want = mount_source(&s.volume_id);
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
            let d = old.differences(asked);
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
            Some(Ok(_)) => return Ok(true),
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
    Ok(false)
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
    if another_mount_left(staging, volume_id) {
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

/// The CSI code of a volume whose daemon ended with exit `code` before serving (its kind,
/// [`crate::exit_code`], chosen in the daemon where the failure was understood), the message
/// ending with the tail of its log: NOT_FOUND and PERMISSION_DENIED as the spec names them,
/// INVALID_ARGUMENT for options refused, UNAVAILABLE (the kubelet retries) for a server out of
/// reach or a source that changed while it was opened, DATA_LOSS for a damaged source,
/// INTERNAL for the rest.
pub(super) fn daemon_failed(volume_id: &str, code: i32, tail: &str) -> Status {
    use crate::exit_code::ExitKind;
    let msg = format!("volume {volume_id}: the daemon ended ({code}) before serving: {tail}");
    match ExitKind::of_code(code) {
        Some(ExitKind::NotFound) => Status::not_found(msg),
        Some(ExitKind::Denied) => Status::permission_denied(msg),
        Some(ExitKind::Usage) => Status::invalid_argument(msg),
        Some(ExitKind::Unavailable | ExitKind::Changed) => Status::unavailable(msg),
        Some(ExitKind::Damaged) => Status::data_loss(msg),
        Some(ExitKind::Failed) | None => Status::internal(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_failure_is_told_apart_by_its_exit_code_never_its_words() {
        use crate::exit_code::ExitKind;
        let code =
            |k: ExitKind| daemon_failed("v", k.code(), "not found: permission denied").code();
        assert_eq!(code(ExitKind::Denied), tonic::Code::PermissionDenied);
        assert_eq!(code(ExitKind::NotFound), tonic::Code::NotFound);
        assert_eq!(code(ExitKind::Usage), tonic::Code::InvalidArgument);
        assert_eq!(code(ExitKind::Unavailable), tonic::Code::Unavailable);
        assert_eq!(code(ExitKind::Changed), tonic::Code::Unavailable);
        assert_eq!(code(ExitKind::Damaged), tonic::Code::DataLoss);
        assert_eq!(code(ExitKind::Failed), tonic::Code::Internal);
        // A signal, or the keeper's own code: no kind.
        assert_eq!(daemon_failed("v", 137, "x").code(), tonic::Code::Internal);
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
        let a = record_of(&s, Path::new("/k/g"));
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
}
