//! `[tracing]`: the real binary exports its spans over OTLP/gRPC to an in-process receiver. A
//! producer's W3C trace context, sent with a job, parents the server's `sepp.enqueue` span;
//! the job carries it to the worker, whose Reserve span links to it: one trace from the
//! producer through the server to the worker.

mod common;

use common::ServerProcess;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use sepp_rs::{EnqueueRequest, ReserveOptions, SeppClient};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every span the server exported.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_runs_from_the_producer_through_the_server_to_the_worker() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[tracing]\notlp_endpoint = \"http://{otlp}\"\n\
         service_name = \"sepp-test\"\n[logging]\nformat = \"json\"\n",
        dir.path().join("data").display()
    );
    let mut server = ServerProcess::start(dir.path(), &toml);

    // Hop 1, the producer: its span's context goes with the job.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let producer_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{producer_span}-01");
    let c = SeppClient::connect(server.url()).await.unwrap();
    let ack = c
        .enqueue(
            EnqueueRequest::new("traced", "t")
                .unwrap()
                .with_trace_context(traceparent.clone(), None),
        )
        .await
        .unwrap();

    // Hop 3, the worker: the job brings the producer's context, to start the handler's span
    // under it.
    let jobs = c
        .reserve(ReserveOptions::new(["traced"], Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    let carried = jobs[0]
        .trace_context
        .as_ref()
        .expect("the job's trace context");
    assert_eq!(carried.traceparent, traceparent);
    c.ack(&jobs[0].id, jobs[0].attempt).await.unwrap();

    // SIGTERM: the server flushes its spans before it exits.
    let pid = server.child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = receiver.0.lock().unwrap().clone();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        if ["sepp.enqueue", "sepp.reserve", "sepp.ack"]
            .iter()
            .all(|n| names.contains(n))
        {
            break spans;
        }
        assert!(Instant::now() < deadline, "spans received: {names:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = server.child.wait();

    // Hop 2, the server: its enqueue span is a child of the producer's span, in its trace.
    let enqueue = spans.iter().find(|s| s.name == "sepp.enqueue").unwrap();
    assert_eq!(hex(&enqueue.trace_id), trace_id);
    assert_eq!(hex(&enqueue.parent_span_id), producer_span);
    let attr = |s: &Span, k: &str| {
        s.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.as_ref())
            .map(|v| format!("{:?}", v.value))
            .unwrap_or_default()
    };
    assert!(attr(enqueue, "queue").contains("traced"));
    assert!(attr(enqueue, "job_id").contains(&ack.job_id));
    assert!(attr(enqueue, "outcome").contains("created"));
    // The worker's Reserve links to the producer's span; its ack names the job and attempt.
    let reserve = spans.iter().find(|s| s.name == "sepp.reserve").unwrap();
    assert!(
        reserve
            .links
            .iter()
            .any(|l| hex(&l.trace_id) == trace_id && hex(&l.span_id) == producer_span),
        "{:?}",
        reserve.links
    );
    let ack_span = spans.iter().find(|s| s.name == "sepp.ack").unwrap();
    assert!(attr(ack_span, "job_id").contains(&ack.job_id));
    assert!(attr(ack_span, "outcome").contains("acked"));
}
