//! The CSI Node service: NodePublishVolume mounts a volume at the pod's target path and hands
//! it to the mounter; NodeUnpublishVolume unmounts it (which ends its daemon). Both are
//! idempotent and keep no state of their own: what is published is read from the mount table
//! (a target mounted as `fuse.loosefs` with the source `loosefs:csi/VOLUME`), so a restarted
//! node plugin finds every volume its predecessor published.
//!
//! Errors are CSI codes (spec.md, "Error Scheme"): `INVALID_ARGUMENT` for a missing or bad
//! field or option (nothing is mounted), `ALREADY_EXISTS` for a target that holds another
//! volume, `ABORTED` while another call works on the same target or a daemon is still starting,
//! `NOT_FOUND` / `PERMISSION_DENIED` when the daemon cannot find or read the source,
//! `UNAVAILABLE` when no mounter answers, `INTERNAL` otherwise; the message says what to do.

use super::NodeConfig;
use super::mounter::{self, Event, Request};
use super::proto::volume_capability::{AccessType, access_mode::Mode};
use super::proto::{self, node_server::Node};
use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::{Request as Rpc, Response, Status};

/// How long a health check of an existing mount (its `statfs`) may take.
const HEALTH_CHECK: Duration = Duration::from_secs(5);

/// The Node service over a [`NodeConfig`].
pub struct NodeService {
    config: Arc<NodeConfig>,
    /// Target paths a call is working on (a second call on one of them is `ABORTED`).
    busy: Arc<Mutex<HashSet<PathBuf>>>,
}

impl NodeService {
    /// The service for `config`.
    pub fn new(config: Arc<NodeConfig>) -> NodeService {
        NodeService {
            config,
            busy: Arc::default(),
        }
    }

    /// Runs `work` on a blocking thread while holding the lock on `target`.
    async fn locked<T: Send + 'static>(
        &self,
        target: PathBuf,
        work: impl FnOnce(&NodeConfig, &Path) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        {
            let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
            if !busy.insert(target.clone()) {
                return Err(Status::aborted(format!(
                    "{}: another call is working on this target; retry",
                    target.display()
                )));
            }
        }
        let (config, busy) = (self.config.clone(), self.busy.clone());
        let result = tokio::task::spawn_blocking(move || {
            let r = work(&config, &target);
            busy.lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&target);
            r
        })
        .await;
        result.unwrap_or_else(|e| Err(Status::internal(format!("the call failed: {e}"))))
    }
}

/// The mount source that names `volume_id`'s mounts (`loosefs:csi/VOLUME`; what `loosefs
/// umount` and the mount table show), with spaces and commas, which mount(2) would split on,
/// replaced.
fn mount_source(volume_id: &str) -> String {
    let safe: String = volume_id
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == ',' {
                '_'
            } else {
                c
            }
        })
        .collect();
    format!("loosefs:csi/{safe}")
}

/// The volume's directory under the work directory: one per target path (a pod's use of a
/// volume), named by a hash of it.
fn volume_dir(config: &NodeConfig, target: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let h = xxhash_rust::xxh3::xxh3_64(target.as_os_str().as_bytes());
    config.work_dir.join(format!("{h:016x}"))
}

/// Checks a target path the kubelet gave: absolute, no `..`, under the kubelet directory; and
/// returns it in canonical form (no `.`, `//` or trailing `/`: the form the mount table shows,
/// so a publish or unpublish of `T/` finds the mount at `T`), under the kubelet directory's
/// real path. Errors: `INVALID_ARGUMENT`, as is any part of it below the kubelet directory that
/// is a symbolic link ([`no_links_below`]).
fn check_target(config: &NodeConfig, target: &str) -> Result<PathBuf, Status> {
    if target.is_empty() {
        return Err(Status::invalid_argument("target_path is missing"));
    }
    let path = PathBuf::from(target);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(Status::invalid_argument(format!(
            "target_path {target}: not an absolute path without `..`"
        )));
    }
    // `components()` drops `.`, repeated and trailing separators.
    let path: PathBuf = path.components().collect();
    let Ok(below) = path.strip_prefix(&config.kubelet_dir) else {
        return Err(Status::invalid_argument(format!(
            "target_path {target}: not under the kubelet directory {} (set --kubelet-dir where \
             this node's kubelet keeps its pods)",
            config.kubelet_dir.display()
        )));
    };
    if below.as_os_str().is_empty() {
        return Err(Status::invalid_argument(format!(
            "target_path {target}: the kubelet directory itself"
        )));
    }
    // The kubelet directory may itself be reached through a link (a node that moved it); what
    // lies below it may not.
    let real = config.kubelet_root();
    let path = real.join(below);
    no_links_below(&real, &path)?;
    Ok(path)
}

/// Checks that no part of `path` below `root` (each directory that exists, and `path` itself)
/// is a symbolic link: the mount, its directories and its unmount then stay where the kubelet
/// asked, never outside its directory or over another pod's volume. Errors: `INVALID_ARGUMENT`
/// naming the link.
fn no_links_below(root: &Path, path: &Path) -> Result<(), Status> {
    let Ok(below) = path.strip_prefix(root) else {
        return Err(Status::invalid_argument(format!(
            "target_path {}: not under {}",
            path.display(),
            root.display()
        )));
    };
    let mut at = root.to_path_buf();
    for part in below.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Status::invalid_argument(format!(
                    "target_path {}: {} is a symbolic link (a target and the directories \
                     above it must be real directories)",
                    path.display(),
                    at.display()
                )));
            }
            Ok(_) => {}
            // Not made yet: nothing below it exists either.
            Err(_) => break,
        }
    }
    Ok(())
}

/// `statfs` of `target` on another thread, for at most `limit`: `None` when it did not answer
/// in time (a daemon still starting, or hung).
fn statfs_within(target: &Path, limit: Duration) -> Option<nix::Result<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = target.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(nix::sys::statfs::statfs(&t).map(|_| ()));
    });
    rx.recv_timeout(limit).ok()
}

/// Whether the mount on top at `target` is this volume's: `fuse.loosefs` with the source
/// `want` (`loosefs:csi/VOLUME`).
fn is_ours(target: &Path, want: &str) -> bool {
    crate::mount_table::is_loosefs_mount_of(target, want)
}

/// Unmounts this volume's mounts at `target` (source `want`; lazily when busy), every layer of
/// it that is this volume's, and nothing else: a mount of another volume or file system on top
/// stays.
fn unmount_ours(target: &Path, want: &str) -> Result<(), Status> {
    use nix::mount::{MntFlags, umount2};
    while is_ours(target, want) {
        match umount2(target, MntFlags::empty()) {
            Ok(()) => {}
            Err(nix::errno::Errno::EBUSY) => {
                umount2(target, MntFlags::MNT_DETACH).map_err(|e| {
                    Status::internal(format!("cannot detach {}: {e}", target.display()))
                })?
            }
            Err(nix::errno::Errno::EINVAL) => break,
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot unmount {}: {e}",
                    target.display()
                )));
            }
        }
    }
    Ok(())
}

/// Removes a directory tree, absent or not.
fn remove_tree(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        log::warn!("cannot remove {}: {e}", dir.display());
    }
}

/// What a publish asks for, checked.
struct Publish {
    volume_id: String,
    source: String,
    args: Vec<String>,
}

/// Checks a NodePublishVolume request. Errors: `INVALID_ARGUMENT`, naming the field.
fn check_publish(r: &proto::NodePublishVolumeRequest) -> Result<Publish, Status> {
    if r.volume_id.is_empty() {
        return Err(Status::invalid_argument("volume_id is missing"));
    }
    let cap = r
        .volume_capability
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume_capability is missing"))?;
    let flags = match &cap.access_type {
        Some(AccessType::Mount(m)) => m.mount_flags.clone(),
        Some(AccessType::Block(_)) => {
            return Err(Status::invalid_argument(
                "a loosefs volume is a file system: use volumeMode: Filesystem, not Block",
            ));
        }
        None => {
            return Err(Status::invalid_argument(
                "volume_capability has no access_type",
            ));
        }
    };
    let mode = cap
        .access_mode
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
        .unwrap_or(Mode::Unknown);
    if !matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly) {
        return Err(Status::invalid_argument(format!(
            "access mode {}: a loosefs volume is read-only; use accessModes: [ReadOnlyMany]",
            mode.as_str_name()
        )));
    }
    let source = r
        .volume_context
        .get("source")
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "volume {}: volumeAttributes has no `source` (a path on the node, or the \
                 URL of a bucket's object or prefix, or of a web server's file)",
                r.volume_id
            ))
        })?
        .trim()
        .to_string();
    if source.starts_with('-') {
        return Err(Status::invalid_argument(format!(
            "volume {}: source {source:?} starts with `-`: give a path on the node or a URL",
            r.volume_id
        )));
    }
    let args = super::mount_options::mount_args(
        &flags,
        r.volume_context.get("mountOptions").map(String::as_str),
    )
    .map_err(|e| Status::invalid_argument(format!("volume {}: {e}", r.volume_id)))?;
    Ok(Publish {
        volume_id: r.volume_id.clone(),
        source,
        args,
    })
}

/// NodePublishVolume on `target`, once checked: already published (healthy) is `OK`; a mount
/// whose daemon died is taken down and made again.
fn publish(config: &NodeConfig, target: &Path, p: &Publish) -> Result<(), Status> {
    let want = mount_source(&p.volume_id);
    if let Some(fstype) = crate::mount_table::mount_fstype(target) {
        let source = crate::mount_table::mount_source(target).unwrap_or_default();
        if !is_ours(target, &want) {
            return Err(Status::already_exists(format!(
                "{}: already holds another mount ({fstype} of {source})",
                target.display()
            )));
        }
        match statfs_within(target, HEALTH_CHECK) {
            Some(Ok(())) => return Ok(()),
            None => {
                return Err(Status::aborted(format!(
                    "volume {}: its daemon is still starting; retry",
                    p.volume_id
                )));
            }
            Some(Err(e)) => {
                log::warn!(
                    "volume {}: the mount at {} answers {e} (its daemon ended): mounting it again",
                    p.volume_id,
                    target.display()
                );
                unmount_ours(target, &want)?;
            }
        }
    }
    let (conn, owner) =
        mounter::connect(&config.mounter).map_err(|e| Status::unavailable(format!("{e:#}")))?;
    let dir = volume_dir(config, target);
    prepare_dir(&dir, owner)?;
    if let Err(e) = std::fs::create_dir_all(target) {
        return Err(Status::internal(format!(
            "cannot make the target {}: {e}",
            target.display()
        )));
    }
    // Again once made: no part of it became a link meanwhile.
    no_links_below(&config.kubelet_root(), target)?;
    let dev = crate::mount::mount_fuse(target, &want, true, Some(owner), true)
        .map_err(|e| Status::internal(format!("{}: {e:#}", target.display())))?;
    let req = Request {
        volume_id: p.volume_id.clone(),
        source: p.source.clone(),
        args: p.args.clone(),
        dir: dir.clone(),
        kept: None,
    };
    // The plugin's copy, handed to the next mounter if this one ends ([`super::held`]).
    let copy = dev
        .try_clone()
        .map_err(|e| Status::internal(format!("cannot keep a copy of the connection: {e}")))?;
    let outcome = mounter::hand_over(conn, dev, &req, &config.mounter)
        .map_err(|e| Status::unavailable(format!("{e:#}")))
        .and_then(|events| wait_ready(config, target, &p.volume_id, events));
    match outcome {
        Ok((kept, events)) => {
            let held = super::held::Held {
                volume_id: p.volume_id.clone(),
                target: target.to_path_buf(),
                source_name: want.clone(),
                dev: copy,
                req: Request { kept, ..req },
            };
            super::held::watch(config.mounter.clone(), held, events);
            log::info!(
                "volume {}: {} published at {}",
                p.volume_id,
                p.source,
                target.display()
            );
            Ok(())
        }
        Err(status) if status.code() == tonic::Code::Aborted => Err(status),
        Err(status) => {
            // Nothing of this publish is left mounted after a failure.
            let _ = unmount_ours(target, &want);
            let _ = std::fs::remove_dir(target);
            remove_tree(&dir);
            Err(status)
        }
    }
}

/// Makes the volume's directory, empty, owned by the mounter's user, 0700. The work directory
/// is shared with the mounter, whose user may plant a name there: the directory is made new
/// (an existing name fails it), then opened without following a link and chowned and chmodded
/// through that descriptor, so root never changes what a planted link points at.
fn prepare_dir(dir: &Path, owner: (u32, u32)) -> Result<(), Status> {
    remove_tree(dir);
    own_new_dir(dir, owner).map_err(|e| {
        Status::internal(format!(
            "cannot make the volume directory {} (--work-dir): {e}",
            dir.display()
        ))
    })
}

/// Makes `dir` (its parent exists), then gives it to `(uid, gid)` with mode 0700 through a
/// descriptor opened with `O_NOFOLLOW`. Errors: `dir` exists (even as a link), or a step failed.
fn own_new_dir(dir: &Path, (uid, gid): (u32, u32)) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
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

/// Waits until the mount answers `statfs` (the daemon is serving), or the daemon ends, or
/// the publish timeout passes.
///
/// Returns the keeper's offer line if it came already, and the mounter's later events.
fn wait_ready(
    config: &NodeConfig,
    target: &Path,
    volume_id: &str,
    events: impl Iterator<Item = Event> + Send + 'static,
) -> Result<(Option<String>, super::held::Events), Status> {
    enum Seen {
        Ready(nix::Result<()>),
        Daemon(Event),
    }
    let mut kept = None;
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (tx, t) = (tx.clone(), target.to_path_buf());
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
                         (see the loosefs-mounter container's log)"
                    )));
                }
            },
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err(Status::aborted(format!(
                    "volume {volume_id}: its daemon is not serving after {} s (a first index \
                     of a large source takes a while); the kubelet retries",
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
fn daemon_failed(volume_id: &str, code: i32, tail: &str) -> Status {
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

/// NodeUnpublishVolume of `volume_id` on `target`: unmounts this volume's mount there (its
/// daemon then ends), removes the target and the volume's directory. `OK` when the volume is
/// not published there (spec.md: "the volume is not found"); a mount that is not this volume's
/// (another volume, another file system) is left as it is, with the target and directory
/// under it, and logged.
fn unpublish(config: &NodeConfig, target: &Path, volume_id: &str) -> Result<(), Status> {
    let want = mount_source(volume_id);
    super::held::forget(target);
    unmount_ours(target, &want)?;
    if let Some(fstype) = crate::mount_table::mount_fstype(target) {
        let source = crate::mount_table::mount_source(target).unwrap_or_default();
        log::warn!(
            "volume {volume_id}: {} holds another mount ({fstype} of {source}), left as it is",
            target.display()
        );
        return Ok(());
    }
    match std::fs::remove_dir(target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Status::internal(format!(
                "cannot remove the target {}: {e}",
                target.display()
            )));
        }
    }
    remove_tree(&volume_dir(config, target));
    Ok(())
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Rpc<proto::NodePublishVolumeRequest>,
    ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let p = check_publish(&r)?;
        let target = check_target(&self.config, &r.target_path)?;
        self.locked(target, move |c, t| publish(c, t, &p)).await?;
        Ok(Response::new(proto::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Rpc<proto::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is missing"));
        }
        let target = check_target(&self.config, &r.target_path)?;
        let id = r.volume_id.clone();
        self.locked(target, move |c, t| unpublish(c, t, &id))
            .await?;
        log::info!("volume {}: unpublished {}", r.volume_id, r.target_path);
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Rpc<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        // No staging, no stats, no expansion: publish and unpublish only.
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn node_get_info(
        &self,
        _: Rpc<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }

    async fn node_stage_volume(
        &self,
        _: Rpc<proto::NodeStageVolumeRequest>,
    ) -> Result<Response<proto::NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("loosefs does not stage volumes"))
    }

    async fn node_unstage_volume(
        &self,
        _: Rpc<proto::NodeUnstageVolumeRequest>,
    ) -> Result<Response<proto::NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("loosefs does not stage volumes"))
    }

    async fn node_get_volume_stats(
        &self,
        _: Rpc<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented(
            "no volume stats: `loosefs stats TARGET` shows a volume's",
        ))
    }

    async fn node_expand_volume(
        &self,
        _: Rpc<proto::NodeExpandVolumeRequest>,
    ) -> Result<Response<proto::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("a loosefs volume is read-only"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        NodeConfig {
            driver_name: "csi.loosefs.dev".into(),
            node_id: "n1".into(),
            mounter: "/run/m.sock".into(),
            work_dir: "/var/lib/loosefs-csi".into(),
            kubelet_dir: "/var/lib/kubelet".into(),
            publish_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn targets_outside_the_kubelet_directory_are_refused() {
        let c = config();
        assert!(check_target(&c, "/var/lib/kubelet/pods/u/volumes/x/mount").is_ok());
        for bad in [
            "",
            "relative",
            "/etc",
            "/var/lib/kubelet/../../etc",
            "/var/lib/kubeletx/a",
            "/var/lib/kubelet",
            "/var/lib/kubelet/",
        ] {
            let e = check_target(&c, bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn a_target_is_taken_in_canonical_form() {
        let c = config();
        for given in [
            "/var/lib/kubelet/pods/u/volumes/x/mount/",
            "/var/lib/kubelet//pods/u/./volumes/x//mount",
        ] {
            assert_eq!(
                check_target(&c, given).unwrap(),
                PathBuf::from("/var/lib/kubelet/pods/u/volumes/x/mount"),
                "{given}"
            );
        }
    }

    #[test]
    fn a_target_that_is_or_lies_under_a_link_is_refused() {
        // reliability-probe.md, csi-target-symlink-escape.
        let d = tempfile::tempdir().unwrap();
        let kubelet = d.path().join("kubelet");
        let outside = d.path().join("outside");
        std::fs::create_dir_all(kubelet.join("pods/a/volumes")).unwrap();
        std::fs::create_dir_all(kubelet.join("pods/b")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, kubelet.join("pods/a/volumes/mount")).unwrap();
        std::os::unix::fs::symlink(&outside, kubelet.join("pods/b/volumes")).unwrap();
        let c = NodeConfig {
            kubelet_dir: kubelet.clone(),
            ..config()
        };
        for bad in ["pods/a/volumes/mount", "pods/b/volumes/x/mount"] {
            let e = check_target(&c, kubelet.join(bad).to_str().unwrap()).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(
                e.message().contains("symbolic link"),
                "{bad}: {}",
                e.message()
            );
        }
        assert!(
            check_target(
                &c,
                kubelet.join("pods/a/volumes/new/mount").to_str().unwrap()
            )
            .is_ok()
        );
        // The kubelet directory itself reached through a link: fine, and resolved.
        let link = d.path().join("kubelet-link");
        std::os::unix::fs::symlink(&kubelet, &link).unwrap();
        let c = NodeConfig {
            kubelet_dir: link,
            ..config()
        };
        let got =
            check_target(&c, d.path().join("kubelet-link/pods/a/m").to_str().unwrap()).unwrap();
        assert_eq!(
            got,
            std::fs::canonicalize(&kubelet).unwrap().join("pods/a/m")
        );
    }

    #[test]
    fn a_source_that_looks_like_an_option_is_refused() {
        let mut r = proto::NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "/var/lib/kubelet/pods/u/m".into(),
            volume_capability: Some(proto::VolumeCapability {
                access_mode: Some(proto::volume_capability::AccessMode {
                    mode: Mode::MultiNodeReaderOnly as i32,
                }),
                access_type: Some(AccessType::Mount(Default::default())),
            }),
            ..Default::default()
        };
        r.volume_context
            .insert("source".into(), "-owarm=/d,metrics_addr=127.0.0.1:9".into());
        let e = check_publish(&r).err().unwrap();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        r.volume_context.insert("source".into(), "/d".into());
        assert!(check_publish(&r).is_ok());
    }

    #[test]
    fn a_volume_directory_is_made_new_and_never_through_a_link() {
        // The mounter's user may plant a name in the shared work directory: root must not
        // chown or chmod what it points at.
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let before = std::fs::metadata(&elsewhere).unwrap();
        let planted = d.path().join("planted");
        std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
        assert!(own_new_dir(&planted, (65534, 65534)).is_err());
        let after = std::fs::metadata(&elsewhere).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((after.uid(), after.mode()), (before.uid(), before.mode()));
        // Another user's only where this test may give it away (root).
        let uid = match nix::unistd::geteuid().is_root() {
            true => 65534,
            false => nix::unistd::geteuid().as_raw(),
        };
        let fresh = d.path().join("fresh");
        own_new_dir(&fresh, (uid, uid)).unwrap();
        let m = std::fs::symlink_metadata(&fresh).unwrap();
        assert!(m.is_dir() && m.mode() & 0o777 == 0o700 && m.uid() == uid);
    }

    #[test]
    fn a_volume_names_its_mount_without_separators() {
        assert_eq!(mount_source("pv a,b"), "loosefs:csi/pv_a_b");
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
