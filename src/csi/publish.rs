//! A pod's use of a staged volume: NodePublishVolume bind-mounts the volume's staging path
//! read-only at the pod's target path ([`super::volume`] staged it, one daemon per volume per
//! node); NodeUnpublishVolume unmounts that bind and nothing else. The daemon keeps serving the
//! volume's other pods.
//!
//! A loosefs volume is read-only whatever is asked: a target is always bound `MS_RDONLY`. A
//! publish with `readonly=false` and a reader-only access mode (the spec's only modes this
//! driver accepts) is published read-only too, as the access mode requires; it is recorded, so
//! that a republish of the same target with the other `readonly` is `ALREADY_EXISTS`.

use super::target::{
    another_mount_left, is_ours, mount_source, no_links_below, statvfs_within, unmount_ours,
};
use super::volume::record_of;
use super::work_dir::{hashed, read_json, remove_record, staged, state_dir, write_json};
use super::{HEALTH_CHECK, NodeConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tonic::Status;

/// What a publish asks for, checked.
pub(super) struct Publish {
    /// What the volume would be staged with (the same PV's source, options and Secret names).
    pub asked: super::volume::Stage,
    /// The staging path the kubelet names (canonical).
    pub staging: PathBuf,
    /// The request's `readonly`.
    pub readonly: bool,
}

/// What a target was published with (root's state directory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Published {
    volume_id: String,
    readonly: bool,
}

fn record_path(config: &NodeConfig, target: &Path) -> PathBuf {
    state_dir(config)
        .join("targets")
        .join(format!("{}.json", hashed(&[&target.to_string_lossy()])))
}

/// NodePublishVolume of `p` at `target` (checked, canonical). `FAILED_PRECONDITION`: the volume
/// is not staged at the staging path, or was staged with other options; `ALREADY_EXISTS`: the
/// target holds another mount, or this volume published with the other `readonly`; `OK` when
/// it is published there already and answers. A target whose mount no longer answers is bound
/// again.
pub(super) fn publish(config: &NodeConfig, target: &Path, p: &Publish) -> Result<(), Status> {
    let id = &p.asked.volume_id;
    let want = mount_source(id);
    let Some(staged) = staged(config, id).filter(|r| r.staging == p.staging) else {
        return Err(Status::failed_precondition(format!(
            "volume {id} is not staged at {} (NodeStageVolume first)",
            p.staging.display()
        )));
    };
    if !is_ours(&p.staging, &want) {
        return Err(Status::failed_precondition(format!(
            "volume {id} is not mounted at its staging path {} (NodeStageVolume again)",
            p.staging.display()
        )));
    }
    // The daemon was given its Secret at the stage (nodeStageSecretRef); a publish's own
    // (nodePublishSecretRef) cannot reach a daemon that serves other pods too.
    if !p.asked.secrets.is_empty() && p.asked.secrets.names() != staged.secret_names {
        return Err(Status::failed_precondition(format!(
            "volume {id}: a Secret given at publish (nodePublishSecretRef) cannot reach the \
             volume's daemon, which its stage started: name it in nodeStageSecretRef"
        )));
    }
    let mut mine = record_of(&p.asked, &p.staging);
    mine.secret_names = staged.secret_names.clone();
    let differs = staged.differences(&mine);
    let record = record_path(config, target);
    let asked = Published {
        volume_id: id.clone(),
        readonly: p.readonly,
    };
    if let Some(fstype) = crate::mount_table::mount_fstype(target) {
        let source = crate::mount_table::mount_source(target).unwrap_or_default();
        if !is_ours(target, &want) {
            return Err(Status::already_exists(format!(
                "{}: already holds another mount ({fstype} of {source})",
                target.display()
            )));
        }
        let before: Option<Published> = read_json(&record);
        if before.as_ref().is_some_and(|b| *b != asked) || !differs.is_empty() {
            return Err(Status::already_exists(format!(
                "volume {id} is published at {} with {}; unpublish it before publishing it \
                 with other options",
                target.display(),
                if differs.is_empty() {
                    format!("readonly={}", before.is_none_or(|b| b.readonly))
                } else {
                    differs.join(", ")
                }
            )));
        }
        match statvfs_within(target, HEALTH_CHECK) {
            Some(Ok(_)) => return Ok(()),
            None => {
                return Err(Status::aborted(format!(
                    "volume {id}: its daemon does not answer yet; retry"
                )));
            }
            Some(Err(e)) => {
                log::warn!(
                    "volume {id}: the mount at {} answers {e}: binding it again",
                    target.display()
                );
                unmount_ours(target, &want)?;
            }
        }
    }
    if !differs.is_empty() {
        return Err(Status::failed_precondition(format!(
            "volume {id} is staged at {} with {}: a publish must ask what its stage did",
            p.staging.display(),
            differs.join(", ")
        )));
    }
    std::fs::create_dir_all(target).map_err(|e| {
        Status::internal(format!("cannot make the target {}: {e}", target.display()))
    })?;
    // Again once made: no part of it became a link meanwhile.
    no_links_below(&config.kubelet_root(), target)?;
    bind_read_only(&p.staging, target).inspect_err(|_| {
        let _ = std::fs::remove_dir(target);
    })?;
    write_json(&record, &asked)?;
    log::info!(
        "volume {id}: published at {} (read-only{})",
        target.display(),
        if p.readonly {
            ""
        } else {
            ", as its reader-only access mode requires, though readonly=false was asked"
        }
    );
    Ok(())
}

/// Binds `staging` at `target`, then makes that bind read-only, nosuid and nodev (a bind takes
/// its flags only from a remount). Errors: `INTERNAL`; nothing is left bound.
fn bind_read_only(staging: &Path, target: &Path) -> Result<(), Status> {
    use nix::mount::{MsFlags, mount};
    mount(
        Some(staging),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        Status::internal(format!(
            "cannot bind {} at {}: {e}",
            staging.display(),
            target.display()
        ))
    })?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    if let Err(e) = mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
        let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
        return Err(Status::internal(format!(
            "cannot make the bind at {} read-only: {e}",
            target.display()
        )));
    }
    Ok(())
}

/// NodeUnpublishVolume of `volume_id` at `target`: unmounts this volume's bind there and removes
/// the target; the staged daemon keeps serving. `OK` when it is not published there; a mount
/// that is not this volume's is left as it is, with the target, and logged.
pub(super) fn unpublish(config: &NodeConfig, target: &Path, volume_id: &str) -> Result<(), Status> {
    let want = mount_source(volume_id);
    unmount_ours(target, &want)?;
    if another_mount_left(target, volume_id) {
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
    remove_record(&record_path(config, target));
    Ok(())
}
