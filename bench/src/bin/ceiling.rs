//! The ceiling: a `sepp.v1` server that stores nothing.
//!
//! It answers `EnqueueBatch` and `EnqueueAtomic` with a fresh UUID per job (never a dedup hit),
//! `Reserve` with no jobs after no wait, `Ack`, `Nack` and `Extend` with success, and
//! `GetServerInfo` with the server's default limits. What a load generator measures against it
//! is the cost of gRPC itself on this machine (tonic, HTTP/2, protobuf, the tokio runtime and
//! the loopback): no server of the protocol can answer faster with the same stack, so sepp's
//! rate divided by this one is the fraction of the ceiling sepp reaches. Run it beside sepp in
//! the same sitting (`bench/compare` does), never compare with a figure from another run.
//!
//! ```sh
//! cargo run --release -p sepp-bench --bin ceiling -- --listen 127.0.0.1:50061
//! ```

use clap::Parser;
use sepp_proto::prost_types::{Duration, Timestamp};
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_server::{QueueService, QueueServiceServer};
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

#[derive(Parser)]
#[command(about = "A sepp.v1 server that stores nothing: the gRPC ceiling for benchmarks")]
struct Args {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
}

/// The limits sepp announces by default (docs/configuration.md), so that clients size their
/// batches and payloads as they would against sepp.
fn server_info() -> pb::GetServerInfoResponse {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = |s: i64| {
        Some(Duration {
            seconds: s,
            nanos: 0,
        })
    };
    pb::GetServerInfoResponse {
        server_version: format!("ceiling-{}", env!("CARGO_PKG_VERSION")),
        supported_protocol_versions: vec!["v1".to_string()],
        server_time: Some(Timestamp {
            seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
        }),
        restricts_encodings: false,
        allowed_encodings: Vec::new(),
        max_payload_bytes: 1 << 20,
        max_custom_entries: 64,
        max_custom_total_bytes: 64 << 10,
        max_custom_key_bytes: 256,
        max_queue_name_bytes: 256,
        max_job_type_bytes: 256,
        max_idempotency_key_bytes: 512,
        max_schedule_horizon: secs(365 * 24 * 3600),
        max_enqueue_batch: 1000,
        max_reserve_batch: 1000,
        max_reserve_queues: 32,
        max_wait_timeout: secs(60),
        max_lease_duration: secs(12 * 3600),
        strict_queues: false,
        dead_letter_retention_enabled: true,
        dedup_window: secs(24 * 3600),
        max_reason_bytes: 4096,
        max_reserve_reply_bytes: 4 << 20,
        max_trace_context_bytes: 1024,
        max_worker_id_bytes: 256,
        max_encoding_bytes: 128,
    }
}

fn accepted(_job: &pb::EnqueueRequest) -> pb::EnqueueResponse {
    pb::EnqueueResponse {
        job_id: uuid::Uuid::new_v4().to_string(),
        deduplicated: false,
        ..Default::default()
    }
}

struct Ceiling;

#[tonic::async_trait]
impl QueueService for Ceiling {
    async fn enqueue_batch(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let results = req
            .get_ref()
            .jobs
            .iter()
            .map(|j| pb::JobResult {
                outcome: Some(pb::job_result::Outcome::Success(accepted(j))),
            })
            .collect();
        Ok(Response::new(pb::EnqueueBatchResponse { results }))
    }

    async fn enqueue_atomic(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueAtomicResponse>, Status> {
        let responses = req.get_ref().jobs.iter().map(accepted).collect();
        Ok(Response::new(pb::EnqueueAtomicResponse {
            outcome: Some(pb::enqueue_atomic_response::Outcome::Success(
                pb::EnqueueAtomicSuccess { responses },
            )),
        }))
    }

    async fn reserve(
        &self,
        _req: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        Ok(Response::new(pb::ReserveResponse::default()))
    }

    async fn ack(
        &self,
        _req: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        Ok(Response::new(pb::AckResponse::default()))
    }

    async fn nack(
        &self,
        _req: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        Ok(Response::new(pb::NackResponse::default()))
    }

    async fn extend(
        &self,
        _req: Request<pb::ExtendRequest>,
    ) -> Result<Response<pb::ExtendResponse>, Status> {
        Ok(Response::new(pb::ExtendResponse::default()))
    }

    async fn drain_dead_letters(
        &self,
        _req: Request<pb::DrainDeadLettersRequest>,
    ) -> Result<Response<pb::DrainDeadLettersResponse>, Status> {
        Ok(Response::new(pb::DrainDeadLettersResponse::default()))
    }

    async fn get_server_info(
        &self,
        _req: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        Ok(Response::new(server_info()))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("ceiling listening on {}", listener.local_addr()?);
    // TCP_NODELAY on every accepted connection, as sepp's own accept loop sets it. The
    // builder's `tcp_nodelay` is ignored by `serve_with_incoming*` (tonic's docs say so): before
    // this, Nagle's algorithm met the client's delayed ACKs and every batch of 100 waited about
    // 40 ms (the ceiling's p50 of 44 ms in docs/benchmarks.md until 2026-12-06).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(QueueServiceServer::new(Ceiling))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
