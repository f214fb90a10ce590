//! The CSI Node service: one daemon per volume per node, shared by the node's pods.
//! NodeStageVolume mounts a volume at the kubelet's staging path and hands it to the mounter
//! ([`super::volume`]); NodePublishVolume binds it read-only into a pod's target
//! ([`super::publish`]); NodeGetVolumeStats says whether it is served ([`super::health`]).
//! Every call is idempotent, and what is staged or published is read back from the mount table
//! (`fuse.loosefs` of `loosefs:csi/VOLUME`) and root's records, so a restarted node plugin finds
//! every volume its predecessor served.
//!
//! Errors are CSI codes (spec.md, "Error Scheme"): `INVALID_ARGUMENT` for a missing or bad
//! field, option, `volume_context` key or Secret key (nothing is mounted); `ALREADY_EXISTS` for
//! a path that holds another mount, or this volume with other options; `FAILED_PRECONDITION`
//! for a publish before its stage, or an unstage while pods hold the volume; `ABORTED` while
//! another call works on the same volume or path, or a daemon is still starting; `NOT_FOUND` /
//! `PERMISSION_DENIED` when the daemon cannot find or read the source; `UNAVAILABLE` when no
//! mounter answers; `INTERNAL` otherwise. The message says what to do.

use super::NodeConfig;
use super::proto::volume_capability::{AccessType, access_mode::Mode};
use super::proto::{self, node_server::Node};
use super::publish::Publish;
use super::secrets::Secrets;
use super::target::check_target;
use super::volume::Stage;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use tonic::{Request as Rpc, Response, Status};

/// `volume_context` keys the kubelet adds (`podInfoOnMount`, `tokenRequests`): taken as given.
const KUBELET_KEYS: &str = "csi.storage.k8s.io/";

/// `volume_context` keys a PersistentVolume's `volumeAttributes` may give.
const ATTRIBUTES: &[&str] = &["source", "mountOptions"];

/// The Node service over a [`NodeConfig`].
pub struct NodeService {
    config: Arc<NodeConfig>,
    /// Volumes and paths a call is working on (a second call on one of them is `ABORTED`).
    busy: Arc<Mutex<HashSet<String>>>,
}

impl NodeService {
    /// The service for `config`.
    pub fn new(config: Arc<NodeConfig>) -> NodeService {
        NodeService {
            config,
            busy: Arc::default(),
        }
    }

    /// Runs `work` on a blocking thread while holding the volume `volume_id` and the path
    /// `path`: a call on either while another works on it is `ABORTED` (the spec's answer; the
    /// kubelet retries).
    async fn locked<T: Send + 'static>(
        &self,
        volume_id: &str,
        path: &std::path::Path,
        work: impl FnOnce(&NodeConfig) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        let keys = [
            format!("volume {volume_id}"),
            format!("path {}", path.display()),
        ];
        {
            let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = keys.iter().find(|k| busy.contains(*k)) {
                return Err(Status::aborted(format!(
                    "another call is working on this {k}; retry"
                )));
            }
            busy.extend(keys.iter().cloned());
        }
        let (config, busy) = (self.config.clone(), self.busy.clone());
        let result = tokio::task::spawn_blocking(move || {
            let r = work(&config);
            let mut b = busy.lock().unwrap_or_else(|p| p.into_inner());
            for k in &keys {
                b.remove(k);
            }
            r
        })
        .await;
        result.unwrap_or_else(|e| Err(Status::internal(format!("the call failed: {e}"))))
    }
}

/// Checks what a stage or publish says of the volume: its id, capability (a file system, a
/// reader-only access mode), `volume_context` (its `source`, `mountOptions`, no key the driver
/// does not know, not an inline ephemeral volume) and Secret. Errors: `INVALID_ARGUMENT`,
/// naming the field.
fn check_volume(
    volume_id: &str,
    cap: Option<&proto::VolumeCapability>,
    context: &std::collections::HashMap<String, String>,
    secrets: &std::collections::HashMap<String, String>,
) -> Result<Stage, Status> {
    if volume_id.is_empty() {
        return Err(Status::invalid_argument("volume_id is missing"));
    }
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is missing"))?;
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
    if context
        .get("csi.storage.k8s.io/ephemeral")
        .is_some_and(|v| v == "true")
    {
        return Err(Status::invalid_argument(format!(
            "volume {volume_id}: an inline ephemeral volume; this driver serves PersistentVolumes \
             only (volumeLifecycleModes: [Persistent]): a pod spec may not name a source itself"
        )));
    }
    let mut unknown: Vec<&str> = context
        .keys()
        .map(String::as_str)
        .filter(|k| !k.starts_with(KUBELET_KEYS) && !ATTRIBUTES.contains(k))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(Status::invalid_argument(format!(
            "volume {volume_id}: volumeAttributes {} the driver does not know (it takes {}; \
             loosefs options go in mountOptions)",
            unknown.join(", "),
            ATTRIBUTES.join(", ")
        )));
    }
    let source = context
        .get("source")
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "volume {volume_id}: volumeAttributes has no `source` (a path on the node, or \
                 the URL of a bucket's object or prefix, or of a web server's file)"
            ))
        })?
        .trim()
        .to_string();
    if source.starts_with('-') {
        return Err(Status::invalid_argument(format!(
            "volume {volume_id}: source {source:?} starts with `-`: give a path on the node or a URL"
        )));
    }
    let args =
        super::mount_options::mount_args(&flags, context.get("mountOptions").map(String::as_str))
            .map_err(|e| Status::invalid_argument(format!("volume {volume_id}: {e}")))?;
    let secrets = Secrets::from_request(secrets)
        .map_err(|e| Status::invalid_argument(format!("volume {volume_id}: {e}")))?;
    Ok(Stage {
        volume_id: volume_id.to_string(),
        source,
        args,
        secrets,
    })
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Rpc<proto::NodeStageVolumeRequest>,
    ) -> Result<Response<proto::NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        let s = check_volume(
            &r.volume_id,
            r.volume_capability.as_ref(),
            &r.volume_context,
            &r.secrets,
        )?;
        let staging = check_target(&self.config, &r.staging_target_path, "staging_target_path")?;
        let path = staging.clone();
        self.locked(&r.volume_id, &path, move |c| {
            super::volume::stage(c, &staging, &s)
        })
        .await?;
        Ok(Response::new(proto::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Rpc<proto::NodeUnstageVolumeRequest>,
    ) -> Result<Response<proto::NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is missing"));
        }
        let staging = check_target(&self.config, &r.staging_target_path, "staging_target_path")?;
        let (path, id) = (staging.clone(), r.volume_id.clone());
        self.locked(&r.volume_id, &path, move |c| {
            super::volume::unstage(c, &staging, &id)
        })
        .await?;
        log::info!("volume {}: unstaged {}", r.volume_id, r.staging_target_path);
        Ok(Response::new(proto::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Rpc<proto::NodePublishVolumeRequest>,
    ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let asked = check_volume(
            &r.volume_id,
            r.volume_capability.as_ref(),
            &r.volume_context,
            &r.secrets,
        )?;
        let target = check_target(&self.config, &r.target_path, "target_path")?;
        if r.staging_target_path.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {}: no staging_target_path (this driver stages: NodeStageVolume first)",
                r.volume_id
            )));
        }
        let staging = check_target(&self.config, &r.staging_target_path, "staging_target_path")?;
        let p = Publish {
            asked,
            staging,
            readonly: r.readonly,
        };
        let path = target.clone();
        self.locked(&r.volume_id, &path, move |c| {
            super::publish::publish(c, &target, &p)
        })
        .await?;
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
        let target = check_target(&self.config, &r.target_path, "target_path")?;
        let (path, id) = (target.clone(), r.volume_id.clone());
        self.locked(&r.volume_id, &path, move |c| {
            super::publish::unpublish(c, &target, &id)
        })
        .await?;
        log::info!("volume {}: unpublished {}", r.volume_id, r.target_path);
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Rpc<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is missing"));
        }
        let path = check_target(&self.config, &r.volume_path, "volume_path")?;
        let config = self.config.clone();
        let id = r.volume_id.clone();
        tokio::task::spawn_blocking(move || super::health::volume_stats(&config, &id, &path))
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("the call failed: {e}"))))
            .map(Response::new)
    }

    async fn node_get_capabilities(
        &self,
        _: Rpc<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        use proto::node_service_capability::{Rpc as Cap, Type, rpc::Type as Kind};
        let caps = [
            Kind::StageUnstageVolume,
            Kind::GetVolumeStats,
            Kind::VolumeCondition,
        ];
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: caps
                .into_iter()
                .map(|k| proto::NodeServiceCapability {
                    r#type: Some(Type::Rpc(Cap { r#type: k as i32 })),
                })
                .collect(),
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

    fn context(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn capability() -> proto::VolumeCapability {
        proto::VolumeCapability {
            access_mode: Some(proto::volume_capability::AccessMode {
                mode: Mode::MultiNodeReaderOnly as i32,
            }),
            access_type: Some(AccessType::Mount(Default::default())),
        }
    }

    #[test]
    fn a_source_that_looks_like_an_option_is_refused() {
        let cap = capability();
        let bad = context(&[("source", "-owarm=/d,metrics_addr=127.0.0.1:9")]);
        let e = check_volume("v", Some(&cap), &bad, &Default::default())
            .err()
            .unwrap();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let good = context(&[("source", "/d"), ("csi.storage.k8s.io/pod.name", "p")]);
        assert!(check_volume("v", Some(&cap), &good, &Default::default()).is_ok());
    }

    #[test]
    fn unknown_attributes_and_inline_volumes_are_refused_by_name() {
        let cap = capability();
        let typo = context(&[("source", "/d"), ("mountOption", "warm")]);
        let e = check_volume("v", Some(&cap), &typo, &Default::default())
            .err()
            .unwrap();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("mountOption "), "{}", e.message());
        let inline = context(&[("source", "/d"), ("csi.storage.k8s.io/ephemeral", "true")]);
        let e = check_volume("v", Some(&cap), &inline, &Default::default())
            .err()
            .unwrap();
        assert!(e.message().contains("ephemeral"), "{}", e.message());
    }
}
