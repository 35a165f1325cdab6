//! A gRPC proxy in front of a test server, for the tests that need to see or disturb what a
//! client sends: it forwards the queue service and can lose replies or count settlements.

use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use sepp_proto::v1::queue_service_server::{QueueService, QueueServiceServer};
use sepp_server::testing::TestServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// What the proxy does besides forwarding; shared with the test, which reads and sets them.
#[derive(Default, Clone)]
pub(crate) struct Tamper {
    /// How many EnqueueBatch replies to lose (after the server committed the call).
    pub(crate) drop_enqueue_replies: Arc<AtomicU32>,
    /// Acks and nacks that passed.
    pub(crate) settlements: Arc<AtomicUsize>,
}

struct Proxy {
    upstream: QueueServiceClient<Channel>,
    tamper: Tamper,
}

#[tonic::async_trait]
impl QueueService for Proxy {
    async fn enqueue_batch(
        &self,
        r: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let resp = self.upstream.clone().enqueue_batch(r.into_inner()).await?;
        if self
            .tamper
            .drop_enqueue_replies
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
        self.tamper.settlements.fetch_add(1, Ordering::SeqCst);
        self.upstream.clone().ack(r.into_inner()).await
    }
    async fn nack(
        &self,
        r: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        self.tamper.settlements.fetch_add(1, Ordering::SeqCst);
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

/// Starts a proxy in front of `server`; returns its URL.
pub(crate) async fn proxy(server: &TestServer, tamper: Tamper) -> String {
    let upstream = QueueServiceClient::connect(server.url()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(QueueServiceServer::new(Proxy { upstream, tamper }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}
