//! Automatic retries reuse idempotency keys: a server that loses the first reply still ends
//! with one job, and the retried call reports `deduplicated = true`.

use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use sepp_proto::v1::queue_service_server::{QueueService, QueueServiceServer};
use sepp_rs::{EnqueueRequest, ErrorCode, RetryPolicy, SeppClient};
use sepp_server::testing::TestServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Forwards everything to the real server, but loses the reply of the first `drops`
/// EnqueueBatch calls after they were committed.
struct LossyProxy {
    upstream: QueueServiceClient<Channel>,
    drops: Arc<AtomicU32>,
}

#[tonic::async_trait]
impl QueueService for LossyProxy {
    async fn enqueue_batch(
        &self,
        r: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let resp = self.upstream.clone().enqueue_batch(r.into_inner()).await?;
        if self
            .drops
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("reply lost on the way back"));
        }
        Ok(resp)
    }
    async fn enqueue_atomic(
        &self,
        r: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueAtomicResponse>, Status> {
        self.upstream.clone().enqueue_atomic(r.into_inner()).await
    }
    async fn reserve(
        &self,
        r: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        self.upstream.clone().reserve(r.into_inner()).await
    }
    async fn ack(&self, r: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        self.upstream.clone().ack(r.into_inner()).await
    }
    async fn nack(
        &self,
        r: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        self.upstream.clone().nack(r.into_inner()).await
    }
    async fn extend(
        &self,
        r: Request<pb::ExtendRequest>,
    ) -> Result<Response<pb::ExtendResponse>, Status> {
        self.upstream.clone().extend(r.into_inner()).await
    }
    async fn drain_dead_letters(
        &self,
        r: Request<pb::DrainDeadLettersRequest>,
    ) -> Result<Response<pb::DrainDeadLettersResponse>, Status> {
        self.upstream
            .clone()
            .drain_dead_letters(r.into_inner())
            .await
    }
    async fn get_server_info(
        &self,
        r: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        self.upstream.clone().get_server_info(r.into_inner()).await
    }
}

async fn lossy(server: &TestServer, drops: Arc<AtomicU32>) -> String {
    let upstream = QueueServiceClient::connect(server.url()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(QueueServiceServer::new(LossyProxy { upstream, drops }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        first_retry_delay: Duration::from_millis(10),
        ..RetryPolicy::default()
    }
}

#[tokio::test]
async fn a_keyed_enqueue_whose_reply_was_lost_is_retried_into_a_dedup_hit() {
    let server = TestServer::start(|_| {}).await;
    let drops = Arc::new(AtomicU32::new(1));
    let url = lossy(&server, drops.clone()).await;
    let client = SeppClient::builder(url)
        .retry_policy(policy())
        .connect()
        .await
        .unwrap();
    let ack = client
        .enqueue(
            EnqueueRequest::new("q", "t")
                .unwrap()
                .with_idempotency_key("k"),
        )
        .await
        .unwrap();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "the first reply was dropped"
    );
    assert!(
        ack.deduplicated,
        "the retry should have hit the first attempt's record"
    );
    let direct = SeppClient::connect(server.url()).await.unwrap();
    assert_eq!(
        direct.get_queue_stats("q").await.unwrap().ready,
        1,
        "exactly one job"
    );
}

#[tokio::test]
async fn an_unkeyed_enqueue_is_not_retried_once_it_may_have_committed() {
    let server = TestServer::start(|_| {}).await;
    let drops = Arc::new(AtomicU32::new(1));
    let url = lossy(&server, drops).await;
    let client = SeppClient::builder(url)
        .retry_policy(policy())
        .connect()
        .await
        .unwrap();
    let err = client
        .enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Transport);
    let direct = SeppClient::connect(server.url()).await.unwrap();
    assert_eq!(
        direct.get_queue_stats("q").await.unwrap().ready,
        1,
        "no second job"
    );
}

#[tokio::test]
async fn with_retries_turned_off_nothing_is_retried() {
    let server = TestServer::start(|_| {}).await;
    let drops = Arc::new(AtomicU32::new(1));
    let url = lossy(&server, drops).await;
    let client = SeppClient::builder(url)
        .no_retries()
        .connect()
        .await
        .unwrap();
    let err = client
        .enqueue(
            EnqueueRequest::new("q", "t")
                .unwrap()
                .with_idempotency_key("k"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Transport);
}
