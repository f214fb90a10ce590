//! What the driver tells of a volume's health: NodeGetVolumeStats (`GET_VOLUME_STATS`) answers a
//! staged or published volume's usage as its file system reports it, and its condition
//! (`VOLUME_CONDITION`): normal while its daemon answers, abnormal — with the reason and where
//! its log is — when the mount answers ENOTCONN (the daemon and its keeper are gone and no
//! mounter took the volume over) or does not answer within [`HEALTH_CHECK`].

use super::proto::{self, volume_usage::Unit};
use super::target::{is_ours, mount_source, statvfs_within};
use super::{HEALTH_CHECK, NodeConfig};
use std::path::Path;
use tonic::Status;

/// NodeGetVolumeStats of `volume_id` at `path` (a staging or target path, checked and
/// canonical). Errors: `NOT_FOUND` when the volume is not mounted there.
pub(super) fn volume_stats(
    config: &NodeConfig,
    volume_id: &str,
    path: &Path,
) -> Result<proto::NodeGetVolumeStatsResponse, Status> {
    if !is_ours(path, &mount_source(volume_id)) {
        return Err(Status::not_found(format!(
            "volume {volume_id} is not staged or published at {}",
            path.display()
        )));
    }
    let log = super::work_dir::log_dir(config, volume_id).join("daemon.log");
    let abnormal = |message: String| proto::NodeGetVolumeStatsResponse {
        usage: vec![],
        volume_condition: Some(proto::VolumeCondition {
            abnormal: true,
            message,
        }),
    };
    Ok(match statvfs_within(path, HEALTH_CHECK) {
        Some(Ok(s)) => {
            let size = s.fragment_size();
            let usage = |unit: Unit, total: u64, free: u64| proto::VolumeUsage {
                available: free as i64,
                total: total as i64,
                used: total.saturating_sub(free) as i64,
                unit: unit as i32,
            };
            proto::NodeGetVolumeStatsResponse {
                usage: vec![
                    usage(Unit::Bytes, s.blocks() * size, s.blocks_available() * size),
                    usage(Unit::Inodes, s.files(), s.files_available()),
                ],
                volume_condition: Some(proto::VolumeCondition {
                    abnormal: false,
                    message: "served by its daemon".into(),
                }),
            }
        }
        None => abnormal(format!(
            "its daemon does not answer within {} s (busy or hung); its log: {}",
            HEALTH_CHECK.as_secs(),
            log.display()
        )),
        Some(Err(e)) => abnormal(format!(
            "not served: the mount answers {e} — its daemon and keeper are gone and no mounter \
             took it over; unpublish and unstage it (the pods' restart does) to serve it again; \
             its log: {}",
            log.display()
        )),
    })
}
