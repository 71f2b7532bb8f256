//! The CSI Identity service and kubelet's plugin registration service.

use tonic::{Request, Response, Status};

use crate::proto::identity_server::Identity;
use crate::proto::plugin_capability::service::Type as ServiceType;
use crate::proto::plugin_capability::volume_expansion::Type as ExpansionType;
use crate::proto::plugin_capability::{Service, Type as CapType, VolumeExpansion};
use crate::proto::*;
use crate::registration::registration_server::Registration;
use crate::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::supervisor::Supervisor;
use crate::DRIVER_NAME;

/// The Identity service.
pub struct IdentityService {
    /// The daemon whose answers make the plugin healthy.
    pub supervisor: Supervisor,
    /// Whether this process serves the Controller service.
    pub controller: bool,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = vec![PluginCapability {
            r#type: Some(CapType::VolumeExpansion(VolumeExpansion {
                r#type: ExpansionType::Online as i32,
            })),
        }];
        if self.controller {
            capabilities.push(PluginCapability {
                r#type: Some(CapType::Service(Service {
                    r#type: ServiceType::ControllerService as i32,
                })),
            });
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    /// Healthy only while fs-supervisor answers on its control socket.
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        match self.supervisor.status().await {
            Ok(_) => Ok(Response::new(ProbeResponse { ready: Some(true) })),
            Err(status) => Err(Status::failed_precondition(format!(
                "{}; baton-csi is not ready until fs-supervisor answers at {}",
                status.message(),
                self.supervisor.socket.display()
            ))),
        }
    }
}

/// kubelet's plugin watcher asks this service who the plugin is.
pub struct RegistrationService {
    /// The CSI socket as kubelet sees it.
    pub endpoint: String,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec!["1.0.0".to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER_NAME, "registered with kubelet");
        } else {
            tracing::error!(
                driver = DRIVER_NAME,
                error = status.error,
                "kubelet refused the registration"
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
