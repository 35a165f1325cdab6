//! The gRPC edge: the only module that names tonic or prost. Handlers convert, call one
//! `crate::queue::Queue` method and map the error; no policy lives here.
//!
//! - `queue_service`: `sepp.v1.QueueService`.
//! - `admin_service`: `sepp.admin.v1.AdminService` (inspection and repair).
//! - `grpc.health.v1.Health` (unauthenticated, for probes) and gRPC server reflection (v1 and
//!   v1alpha, behind the API keys like the sepp services).
//!
//! `admission` tells the connection layer, from a call's headers alone, whether the call is
//! admitted (its API key) and how its request is read, so that a caller without a key never
//! gets a byte of its request buffered.

pub(crate) mod admin_service;
pub mod auth;
mod convert;
mod decode_check;
pub(crate) mod queue_service;
mod status;
mod timed;

use crate::config::{Config, Role, ServerConfig};
use crate::queue::Queue;
use decode_check::DecodeChecked;
use sepp_proto::admin::v1::admin_service_server::AdminServiceServer;
use sepp_proto::v1::queue_service_server::QueueServiceServer;
use std::sync::Arc;

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
    /// The API keys could not be loaded.
    #[error("{0}")]
    Auth(#[from] crate::config::ConfigError),
}

/// The assembled routes, TLS and health reporter; [`crate::net`] serves them.
pub struct Edge {
    /// Every gRPC service, routed by path.
    pub routes: tonic::service::Routes,
    /// The TLS acceptor when `server.tls_cert_path` is set.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Health status of `sepp.v1.QueueService`.
    pub health: HealthReporter,
    /// The API-key check and request shape of each call, for [`crate::net`].
    pub admit: crate::net::AdmitFn,
    /// The API keys in force ([`auth::ApiKeyAuth::reload`] on SIGHUP).
    pub auth: auth::ApiKeyAuth,
}

/// Largest request message the health service reads, in bytes: its requests name a service
/// and nothing else. Open to everyone (probes carry no API key), so its budget is small.
pub const HEALTH_MAX_MESSAGE_BYTES: usize = 4096;

/// Largest request message of server reflection, in bytes: a request names a file, a symbol
/// or a service, each far shorter.
pub const REFLECTION_MAX_MESSAGE_BYTES: usize = 64 * 1024;

const HEALTH: &str = "/grpc.health.v1.Health/";
const REFLECTION: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// How [`crate::net`] reads the request of a call on `path`: server reflection's request is a
/// stream (a client such as grpcurl sends its next request only after the answer to the
/// last), limited to [`REFLECTION_MAX_MESSAGE_BYTES`] per message; every other call sends one
/// message, of at most [`HEALTH_MAX_MESSAGE_BYTES`] for the health service and `max_message`
/// (`limits.max_message_bytes`) for the sepp services. The enqueues, Ack, Nack, Extend,
/// GetServerInfo, health and the admin calls that answer a few fields (queue stats, a key's
/// record, pause, resume, backup, purge and delete counts) have small replies, so
/// unread replies never hold them back (`server.reply_buffer_bytes`); every other call can
/// answer with up to a whole message and is held back, and the admin calls that only read
/// may also be refused after they ran (see [`crate::net::Reply`]). A path not named here is
/// taken to write. Reserve and Ack (whose `then_reserve` leases) lease only what fits in the
/// room their connection has for replies.
pub fn request_shape(path: &str, max_message: usize) -> crate::net::RequestShape {
    let (max_message_bytes, streaming) = if path.starts_with(HEALTH) {
        (HEALTH_MAX_MESSAGE_BYTES, false)
    } else if REFLECTION.iter().any(|r| path.starts_with(r)) {
        (REFLECTION_MAX_MESSAGE_BYTES, true)
    } else {
        (max_message, false)
    };
    const SMALL_REPLIES: [&str; 15] = [
        "/sepp.v1.QueueService/Enqueue",
        "/sepp.v1.QueueService/EnqueueBatch",
        "/sepp.v1.QueueService/EnqueueAtomic",
        "/sepp.v1.QueueService/Ack",
        "/sepp.v1.QueueService/Nack",
        "/sepp.v1.QueueService/Extend",
        "/sepp.v1.QueueService/GetServerInfo",
        "/sepp.admin.v1.AdminService/GetQueueStats",
        "/sepp.admin.v1.AdminService/LookupIdempotencyKey",
        "/sepp.admin.v1.AdminService/ForgetIdempotencyKey",
        "/sepp.admin.v1.AdminService/PauseQueue",
        "/sepp.admin.v1.AdminService/ResumeQueue",
        "/sepp.admin.v1.AdminService/Backup",
        "/sepp.admin.v1.AdminService/PurgeQueue",
        "/sepp.admin.v1.AdminService/DeleteQueue",
    ];
    const READS: [&str; 6] = [
        "/sepp.admin.v1.AdminService/GetJob",
        "/sepp.admin.v1.AdminService/ListDeadLetters",
        "/sepp.admin.v1.AdminService/ListQueues",
        "/sepp.admin.v1.AdminService/ListJobs",
        "/sepp.admin.v1.AdminService/ListSchedules",
        "/sepp.admin.v1.AdminService/GetQueueRates",
    ];
    let reply = if path.starts_with(HEALTH) || SMALL_REPLIES.contains(&path) {
        crate::net::Reply::Small
    } else if READS.contains(&path) {
        crate::net::Reply::Reads
    } else {
        crate::net::Reply::Writes
    };
    crate::net::RequestShape {
        max_message_bytes,
        streaming,
        reply,
        leases: matches!(
            path,
            "/sepp.v1.QueueService/Reserve" | "/sepp.v1.QueueService/Ack"
        ),
    }
}

/// The store fills Reserve, DrainDeadLetters and ListDeadLetters replies by
/// `queue::reply`'s bound; the real encoding (`len` bytes, `items` jobs or records) must not
/// pass the budget (a single item is sent whatever its size). Logged as an error (and a debug
/// assertion) if it ever does, which would mean the bound is wrong.
pub(crate) fn check_reply_budget(what: &str, items: usize, len: usize, budget: u64) {
    let len = len as u64;
    if items > 1 && len > budget {
        debug_assert!(
            false,
            "{what} reply of {len} bytes passes the budget {budget}"
        );
        tracing::error!(what, len, budget, "reply passes max_reserve_reply_bytes");
    }
}

/// The role a call needs, from its path: enqueues need `producer`; Reserve, Ack, Nack and
/// Extend need `worker`; DrainDeadLetters and the admin service need `admin`; anything else
/// (GetServerInfo, reflection) needs only a known key. Returns the role and the call's name.
pub fn required_role(path: &str) -> (Option<Role>, &str) {
    const QUEUE: &str = "/sepp.v1.QueueService/";
    const ADMIN: &str = "/sepp.admin.v1.AdminService/";
    if let Some(m) = path.strip_prefix(QUEUE) {
        let role = match m {
            "Enqueue" | "EnqueueBatch" | "EnqueueAtomic" => Some(Role::Producer),
            "Reserve" | "Ack" | "Nack" | "Extend" => Some(Role::Worker),
            "DrainDeadLetters" => Some(Role::Admin),
            _ => None,
        };
        (role, m)
    } else if let Some(m) = path.strip_prefix(ADMIN) {
        (Some(Role::Admin), m)
    } else {
        (None, path)
    }
}

/// Admits a call from its headers, before any of its body is read: every path but the health
/// service's needs an API key when auth is on (`UNAUTHENTICATED` otherwise) with the role
/// [`required_role`] names (`PERMISSION_DENIED` otherwise); the request is then read as
/// [`request_shape`] says.
fn admission(auth: auth::ApiKeyAuth, max_message: usize) -> crate::net::AdmitFn {
    Arc::new(move |parts: &http::request::Parts| {
        let path = parts.uri.path();
        if !path.starts_with(HEALTH) {
            let (role, call) = required_role(path);
            auth.check(&parts.headers, role, call)?;
        }
        Ok(request_shape(path, max_message))
    })
}

fn tls_config(s: &ServerConfig) -> Result<Option<tokio_rustls::TlsAcceptor>, ApiError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let (Some(cert), Some(key)) = (&s.tls_cert_path, &s.tls_key_path) else {
        return Ok(None);
    };
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| ApiError::Tls(format!("cannot read {}: {e}", p.display())))
    };
    let certs = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ApiError::Tls(format!(
                "{}: not a PEM certificate chain: {e}",
                cert.display()
            ))
        })?;
    let private = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| ApiError::Tls(format!("{}: not a PEM private key: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ApiError::Tls(e.to_string()))?;
    let builder = match &s.tls_client_ca_path {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&read(ca)?) {
                let c = c.map_err(|e| {
                    ApiError::Tls(format!("{}: not a PEM certificate: {e}", ca.display()))
                })?;
                roots
                    .add(c)
                    .map_err(|e| ApiError::Tls(format!("{}: {e}", ca.display())))?;
            }
            if roots.is_empty() {
                return Err(ApiError::Tls(format!(
                    "{}: no certificate in server.tls_client_ca_path",
                    ca.display()
                )));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| ApiError::Tls(format!("{}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut tls = builder
        .with_single_cert(certs, private)
        .map_err(|e| ApiError::Tls(e.to_string()))?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))))
}

/// Builds the services for `queue` under `config`.
///
/// # Errors
/// [`ApiError`] when TLS files are unreadable or invalid.
pub async fn build(config: &Config, queue: Arc<Queue>) -> Result<Edge, ApiError> {
    let max_message = usize::try_from(config.limits.max_message_bytes).unwrap_or(usize::MAX);
    let auth = auth::ApiKeyAuth::from_config(&config.auth)?;

    let metrics = queue.metrics().clone();
    let admin_svc = AdminServiceServer::new(admin_service::AdminApi {
        queue: queue.clone(),
        auth: auth.clone(),
    })
    .max_decoding_message_size(max_message);
    let admin_svc = timed::Timed::new(admin_svc, metrics.clone());
    let queue_svc = QueueServiceServer::new(queue_service::QueueApi { queue })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(usize::MAX);
    let queue_svc = timed::Timed::new(queue_svc, metrics);
    let (health, health_svc) = tonic_health::server::health_reporter();
    let health_svc = DecodeChecked::<_, tonic_health::pb::HealthCheckRequest>::new(
        health_svc.max_decoding_message_size(HEALTH_MAX_MESSAGE_BYTES),
        HEALTH_MAX_MESSAGE_BYTES,
    );
    health
        .set_serving::<QueueServiceServer<queue_service::QueueApi>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(sepp_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ApiError::Reflection(e.to_string()))?
        .max_decoding_message_size(REFLECTION_MAX_MESSAGE_BYTES);
    let reflection_v1 = DecodeChecked::<_, tonic_reflection::pb::v1::ServerReflectionRequest>::new(
        reflection_v1,
        REFLECTION_MAX_MESSAGE_BYTES,
    );
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(sepp_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| ApiError::Reflection(e.to_string()))?
        .max_decoding_message_size(REFLECTION_MAX_MESSAGE_BYTES);
    let reflection_v1alpha = DecodeChecked::<
        _,
        tonic_reflection::pb::v1alpha::ServerReflectionRequest,
    >::new(reflection_v1alpha, REFLECTION_MAX_MESSAGE_BYTES);

    let tls = tls_config(&config.server)?;
    let routes = tonic::service::Routes::new(health_svc)
        .add_service(queue_svc)
        .add_service(admin_svc)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .prepare();
    Ok(Edge {
        routes,
        tls,
        health,
        admit: admission(auth.clone(), max_message),
        auth,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::queue::clock::ManualClock;
    use crate::queue::limits::Limits;
    use crate::queue::model::EnqueueInput;
    use crate::storage::Store;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStore};
    use tonic_health::ServingStatus;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus as Wire;
    use tonic_health::pb::health_server::Health;
    use tonic_health::server::HealthService;

    async fn status(svc: &HealthService, service: &str) -> i32 {
        svc.check(tonic::Request::new(HealthCheckRequest {
            service: service.into(),
        }))
        .await
        .expect("check")
        .into_inner()
        .status
    }

    /// A write that fails turns the health service NOT_SERVING, for `""` and for
    /// `sepp.v1.QueueService`, and the failed enqueue gets `UNAVAILABLE`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_turns_health_not_serving() {
        let dir = tempfile::tempdir().expect("temp dir");
        let t0 = 1_700_000_000_000;
        let store = Arc::new(
            EmbeddedStore::open(
                EmbeddedOptions {
                    path: dir.path().join("data"),
                    persist_mode: crate::domain::PersistMode::Buffer,
                    min_free_bytes: 0,
                },
                t0,
            )
            .expect("open"),
        );
        let queue = Queue::new(
            store.clone(),
            Arc::new(Limits::from_config(&Config::default()).expect("limits")),
            Arc::new(ManualClock::new(t0)),
            tokio_util::sync::CancellationToken::new(),
        );
        let (reporter, _) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", ServingStatus::Serving)
            .await;
        let svc = HealthService::from_health_reporter(reporter.clone());
        let stop = tokio_util::sync::CancellationToken::new();
        let forward = tokio::spawn(forward_storage_health(
            store.health(),
            reporter,
            stop.clone(),
        ));
        let job = || EnqueueInput {
            queue: "q".into(),
            job_type: "t".into(),
            ..Default::default()
        };
        queue
            .enqueue_batch(vec![job()])
            .await
            .expect("a write works");
        assert_eq!(status(&svc, "").await, Wire::Serving as i32);

        store.inject_commit_failure();
        let err = queue.enqueue_batch(vec![job()]).await.expect_err("refused");
        assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unavailable);
        // The forwarder runs on its own task: wait for the status it sets.
        let queue_service = "sepp.v1.QueueService";
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while status(&svc, "").await != Wire::NotServing as i32
            || status(&svc, queue_service).await != Wire::NotServing as i32
        {
            assert!(tokio::time::Instant::now() < deadline, "still serving");
            tokio::task::yield_now().await;
        }
        stop.cancel();
        forward.await.expect("forwarder");
        store.close().await.expect("close");
    }
}
