//! The gRPC edge: the only module that names tonic or prost. Handlers convert, call one
//! `crate::queue::Queue` method and map the error; no policy lives here.
//!
//! - `queue_service`: `sepp.v1.QueueService`.
//! - `admin_service`: `sepp.admin.v1.AdminService` (inspection and repair).
//! - `grpc.health.v1.Health` (unauthenticated, for probes) and gRPC server reflection (v1 and
//!   v1alpha, behind the API keys like the sepp services).

mod admin_service;
mod auth;
mod convert;
mod queue_service;
mod status;

use crate::config::{Config, ServerConfig};
use crate::queue::Queue;
use sepp_proto::admin::v1::admin_service_server::AdminServiceServer;
use sepp_proto::v1::queue_service_server::QueueServiceServer;
use std::sync::Arc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Identity, Server, ServerTlsConfig};

pub use tonic_health::server::HealthReporter;

/// Errors while building the gRPC server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A TLS file could not be read or used.
    #[error("tls: {0}")]
    Tls(String),
    /// The reflection service could not be built.
    #[error("reflection: {0}")]
    Reflection(String),
}

/// The assembled router plus the health reporter (to flip to NOT_SERVING at shutdown).
pub struct Edge {
    /// The tonic router, ready to serve.
    pub router: tonic::transport::server::Router,
    /// Health status of `sepp.v1.QueueService`.
    pub health: HealthReporter,
}

fn tls_config(s: &ServerConfig) -> Result<Option<ServerTlsConfig>, ApiError> {
    let (Some(cert), Some(key)) = (&s.tls_cert_path, &s.tls_key_path) else {
        return Ok(None);
    };
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| ApiError::Tls(format!("cannot read {}: {e}", p.display())))
    };
    let identity = Identity::from_pem(read(cert)?, read(key)?);
    Ok(Some(ServerTlsConfig::new().identity(identity)))
}

/// Builds the services for `queue` under `config`.
///
/// # Errors
/// [`ApiError`] when TLS files are unreadable or invalid.
pub async fn build(config: &Config, queue: Arc<Queue>) -> Result<Edge, ApiError> {
    let max_message = usize::try_from(config.limits.max_message_bytes).unwrap_or(usize::MAX);
    let auth = auth::ApiKeyAuth::new(config.auth.api_keys.clone());

    let admin_svc = AdminServiceServer::new(admin_service::AdminApi {
        queue: queue.clone(),
    })
    .max_decoding_message_size(max_message);
    let queue_svc = QueueServiceServer::new(queue_service::QueueApi { queue })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(usize::MAX);
    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_serving::<QueueServiceServer<queue_service::QueueApi>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(sepp_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ApiError::Reflection(e.to_string()))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(sepp_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| ApiError::Reflection(e.to_string()))?;

    // Generous fixed HTTP/2 windows: many small concurrent calls per connection are the
    // normal load of a job queue.
    let mut builder = Server::builder()
        .initial_connection_window_size(16 * 1024 * 1024)
        .initial_stream_window_size(2 * 1024 * 1024)
        .tcp_nodelay(true);
    if let Some(tls) = tls_config(&config.server)? {
        builder = builder
            .tls_config(tls)
            .map_err(|e| ApiError::Tls(e.to_string()))?;
    }
    let router = builder
        .add_service(health_svc)
        .add_service(InterceptedService::new(queue_svc, auth.clone()))
        .add_service(InterceptedService::new(admin_svc, auth.clone()))
        .add_service(InterceptedService::new(reflection_v1, auth.clone()))
        .add_service(InterceptedService::new(reflection_v1alpha, auth));
    Ok(Edge { router, health })
}

/// Flips the health status to NOT_SERVING (at shutdown).
pub async fn set_not_serving(health: &HealthReporter) {
    health
        .set_not_serving::<QueueServiceServer<queue_service::QueueApi>>()
        .await;
}

/// Forwards the store's health to the health service (both `""` and `sepp.v1.QueueService`)
/// until `stop`: NOT_SERVING while storage refuses writes (no space left, a failed write),
/// SERVING again once it takes them.
pub async fn forward_storage_health(
    mut storage: tokio::sync::watch::Receiver<crate::storage::StorageHealth>,
    health: HealthReporter,
    stop: tokio_util::sync::CancellationToken,
) {
    use tonic::server::NamedService;
    use tonic_health::ServingStatus;
    const QUEUE: &str = <QueueServiceServer<queue_service::QueueApi> as NamedService>::NAME;
    loop {
        let serving = *storage.borrow_and_update() == crate::storage::StorageHealth::Serving;
        if stop.is_cancelled() {
            return;
        }
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        health.set_service_status("", status).await;
        health.set_service_status(QUEUE, status).await;
        tokio::select! {
            changed = storage.changed() => if changed.is_err() { return },
            _ = stop.cancelled() => return,
        }
    }
}
