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
use sepp_server::testing::ServerProcess as Process;
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

/// A real server exporting its spans to an in-process OTLP receiver.
async fn traced_server(dir: &std::path::Path) -> (Process, Receiver) {
    traced_server_with(dir, "").await
}

/// [`traced_server`] with more `[tracing]` keys.
async fn traced_server_with(dir: &std::path::Path, tracing_keys: &str) -> (Process, Receiver) {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[tracing]\notlp_endpoint = \"http://{otlp}\"\n\
         service_name = \"sepp-test\"\n{tracing_keys}\n[logging]\nformat = \"json\"\n",
        dir.join("data").display()
    );
    (ServerProcess::start(dir, &toml), receiver)
}

/// Stops `server` with SIGTERM (it flushes its spans first) and returns the spans received once
/// every one of `names` is among them.
async fn spans_after_stop(server: &mut Process, receiver: &Receiver, names: &[&str]) -> Vec<Span> {
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
        let got: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        if names.iter().all(|n| got.contains(n)) {
            break spans;
        }
        assert!(Instant::now() < deadline, "spans received: {got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = server.child.wait();
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_runs_from_the_producer_through_the_server_to_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, receiver) = traced_server(dir.path()).await;

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
    let spans = spans_after_stop(
        &mut server,
        &receiver,
        &["sepp.enqueue", "sepp.reserve", "sepp.ack"],
    )
    .await;

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

/// The sampling decision is made per call before its span exists: with `sample_ratio = 0`, a
/// call under a producer's sampled trace context is exported (as its child), one under an
/// unsampled context is not, and calls without one are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_follows_its_producers_sampling_decision_or_the_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, receiver) = traced_server_with(dir.path(), "sample_ratio = 0.0").await;
    let sampled_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let unsampled_trace = "0af7651916cd43dd8448eb211c80319c";
    let c = SeppClient::connect(server.url()).await.unwrap();
    let enqueue = |tp: Option<String>| {
        let mut r = EnqueueRequest::new("sampling", "t").unwrap();
        if let Some(tp) = tp {
            r = r.with_trace_context(tp, None);
        }
        c.enqueue(r)
    };
    enqueue(Some(format!("00-{unsampled_trace}-b7ad6b7169203331-00")))
        .await
        .unwrap();
    enqueue(None).await.unwrap();
    let jobs = c
        .reserve(ReserveOptions::new(["sampling"], Duration::from_secs(30)).with_max_jobs(2))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 2);
    for j in &jobs {
        c.ack(&j.id, j.attempt).await.unwrap();
    }
    let sampled = enqueue(Some(format!("00-{sampled_trace}-00f067aa0ba902b7-01")))
        .await
        .unwrap();

    spans_after_stop(&mut server, &receiver, &["sepp.enqueue"]).await;
    // The server has exited: everything it exported has arrived.
    let spans = receiver.0.lock().unwrap().clone();
    let names: Vec<(&str, String)> = spans
        .iter()
        .map(|s| (s.name.as_str(), hex(&s.trace_id)))
        .collect();
    assert_eq!(
        names,
        [("sepp.enqueue", sampled_trace.to_string())],
        "only the call under the sampled context is exported"
    );
    assert_eq!(hex(&spans[0].parent_span_id), "00f067aa0ba902b7");
    let job_id = spans[0]
        .attributes
        .iter()
        .find(|a| a.key == "job_id")
        .and_then(|a| a.value.as_ref())
        .map(|v| format!("{:?}", v.value))
        .unwrap_or_default();
    assert!(job_id.contains(&sampled.job_id), "{job_id}");
}

/// The spans this test process ended (the producer's and the worker's), through the
/// OpenTelemetry SDK installed as the global tracer provider.
#[derive(Clone, Debug, Default)]
struct Collected(Arc<Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

impl opentelemetry_sdk::trace::SpanExporter for Collected {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

/// The Rust client with its `opentelemetry` feature: a producer's current span goes out with
/// the job without being set on the request, the server's `sepp.enqueue` span is its child, and
/// the Worker runs the handler inside a `sepp.handle` span that is its child too, current while
/// the handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_producer_and_worker_carry_their_opentelemetry_context_across_the_server() {
    use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
    use opentelemetry::{Context, context::FutureExt};

    let collected = Collected::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(collected.clone())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let dir = tempfile::tempdir().unwrap();
    let (mut server, receiver) = traced_server(dir.path()).await;
    let c = SeppClient::connect(server.url()).await.unwrap();

    // Hop 1: the producer enqueues inside its own span; the request sets no trace context.
    let producer = provider.tracer("shop").start("checkout");
    let pcx = Context::current_with_span(producer);
    let (p_trace, p_span) = {
        let sc = pcx.span().span_context().clone();
        (sc.trace_id(), sc.span_id())
    };
    c.enqueue(EnqueueRequest::new("traced", "t").unwrap())
        .with_context(pcx.clone())
        .await
        .unwrap();
    pcx.span().end();

    // Hop 3: the worker's handler sees its own span as the current one.
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    let seen_tx = Arc::new(Mutex::new(Some(seen_tx)));
    let worker = sepp_rs::Worker::builder(c.clone(), ["traced"])
        .handle("t", move |_job| {
            let seen_tx = seen_tx.clone();
            async move {
                let sc = Context::current().span().span_context().clone();
                if let Some(tx) = seen_tx.lock().unwrap().take() {
                    let _ = tx.send(sc);
                }
                Ok(())
            }
        })
        .build();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run_until(async move {
        let _ = stop_rx.await;
    }));
    let in_handler = tokio::time::timeout(Duration::from_secs(30), seen_rx)
        .await
        .expect("the handler ran")
        .unwrap();
    let _ = stop_tx.send(());
    run.await.unwrap().unwrap();

    assert_eq!(in_handler.trace_id(), p_trace);
    let local = collected.0.lock().unwrap().clone();
    let handle = local
        .iter()
        .find(|s| s.name == sepp_rs::trace::HANDLER_SPAN)
        .unwrap_or_else(|| panic!("a sepp.handle span among {local:?}"));
    assert_eq!(handle.span_context.trace_id(), p_trace);
    assert_eq!(handle.parent_span_id, p_span);
    assert!(handle.parent_span_is_remote);
    assert_eq!(handle.span_context.span_id(), in_handler.span_id());
    assert_eq!(handle.span_kind, opentelemetry::trace::SpanKind::Consumer);
    assert!(
        handle
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "messaging.destination.name"
                && kv.value.as_str() == "traced")
    );

    // Hop 2: the server's enqueue span is a child of the producer's span.
    let spans = spans_after_stop(&mut server, &receiver, &["sepp.enqueue"]).await;
    let enqueue = spans.iter().find(|s| s.name == "sepp.enqueue").unwrap();
    assert_eq!(hex(&enqueue.trace_id), p_trace.to_string());
    assert_eq!(hex(&enqueue.parent_span_id), p_span.to_string());
}
