//! The CSI Identity service: the driver's name and version, no plugin capability (a node-only
//! driver: no controller service, no topology), and a probe that is ready while the mounter
//! answers at its socket (the livenessprobe sidecar's `/healthz` reports it; docs/CLUSTERS.md).

use super::proto::{self, identity_server::Identity};
use tonic::{Request, Response, Status};

/// The Identity service of a driver named `name` (a DNS-like name the PersistentVolumes and
/// the `CSIDriver` object give as `driver`).
pub struct IdentityService {
    /// The driver's name.
    pub name: String,
    /// The mounter's socket, which [`Identity::probe`] checks.
    pub mounter: std::path::PathBuf,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<proto::GetPluginInfoRequest>,
    ) -> Result<Response<proto::GetPluginInfoResponse>, Status> {
        Ok(Response::new(proto::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: [("commit".to_string(), env!("LOOSEFS_COMMIT").to_string())].into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<proto::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(proto::GetPluginCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn probe(
        &self,
        _: Request<proto::ProbeRequest>,
    ) -> Result<Response<proto::ProbeResponse>, Status> {
        let socket = self.mounter.clone();
        let answered = tokio::task::spawn_blocking(move || super::mounter::ping(&socket)).await;
        match answered {
            Ok(Ok(())) => Ok(Response::new(proto::ProbeResponse { ready: Some(true) })),
            Ok(Err(e)) => {
                log::warn!("probe: not ready: {e:#}");
                Err(Status::failed_precondition(format!("not ready: {e:#}")))
            }
            Err(e) => Err(Status::internal(format!("the probe failed: {e}"))),
        }
    }
}
