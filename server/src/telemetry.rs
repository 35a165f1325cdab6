//! Logs and traces (`[logging]`, `[tracing]`, `docs/operations.md`).
//!
//! - [`init`] installs the process's subscriber: the log filter (`SEPP_LOG`, else
//!   `[logging] level`), text or JSON lines on standard error (JSON lines carry the fields of
//!   the current spans, `trace_id` among them), and, when `[tracing]` exports, an
//!   OpenTelemetry layer sending every span over OTLP/gRPC with a parent-based ratio sampler.
//! - [`adopt_trace_context`]: the span of a call about a job becomes a child of the W3C trace
//!   context the producer stored with the job (`traceparent`), and records its `trace_id`, so
//!   one trace runs producer → server → worker.

use crate::config::{Config, LogFormat};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the trace exporter running; [`Telemetry::shutdown`] flushes what is buffered.
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "trace exporter shutdown");
        }
    }
}

/// Installs the global subscriber for `config` (call once, inside the tokio runtime: the
/// exporter's batches run on it).
///
/// # Errors
/// The OTLP exporter could not be built (a bad `tracing.otlp_endpoint`), or a subscriber is
/// already installed.
pub fn init(config: &Config) -> Result<Telemetry, String> {
    let filter = EnvFilter::try_from_env("SEPP_LOG").unwrap_or_else(|_| {
        EnvFilter::try_new(format!(
            "{},lsm_tree=warn,fjall=warn,opentelemetry=warn,h2=warn,tonic=warn,hyper=warn",
            config.logging.level
        ))
        .unwrap_or_else(|_| EnvFilter::new("info,lsm_tree=warn,fjall=warn"))
    });
    let fmt: Box<dyn Layer<_> + Send + Sync> = match config.logging.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let (otel, provider) = match config.tracing.endpoint() {
        None => (None, None),
        Some(endpoint) => {
            use opentelemetry::trace::TracerProvider as _;
            use opentelemetry_otlp::WithExportConfig;
            use opentelemetry_sdk::trace::{Sampler, span_processor_with_async_runtime};
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|e| format!("tracing.otlp_endpoint {endpoint:?}: {e}"))?;
            let batches = span_processor_with_async_runtime::BatchSpanProcessor::builder(
                exporter,
                opentelemetry_sdk::runtime::Tokio,
            )
            .build();
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_span_processor(batches)
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                    config.tracing.sample_ratio,
                ))))
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(config.tracing.service_name.clone())
                        .build(),
                )
                .build();
            let tracer = provider.tracer("sepp");
            // Only the server's own spans (the per-RPC spans and what runs inside them), at
            // info and above, whatever the log filter says.
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                    m.target().starts_with("sepp_server") && *m.level() <= tracing::Level::INFO
                }));
            (Some(layer), Some(provider))
        }
    };
    // The log filter applies to the log lines only, not to the spans exported.
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init()
        .map_err(|e| e.to_string())?;
    Ok(Telemetry { provider })
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), if it is one.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_, id) = (parts.next()?, parts.next()?);
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Makes `span` (not yet entered) a child of the trace context a producer sent with its job,
/// and records its `trace_id` (for JSON logs, with or without export). Without an
/// OpenTelemetry layer the parent is not kept, only the field.
pub fn adopt_trace_context(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    if let Some(id) = trace_id(traceparent) {
        span.record("trace_id", id);
    }
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    if let Some(s) = tracestate {
        carrier.insert("tracestate".to_string(), s.to_string());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Links the current span (a Reserve's) to the trace of a job it hands out.
pub fn link_trace_context(traceparent: &str) {
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    let cx = TraceContextPropagator::new().extract(&carrier);
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        tracing::Span::current().add_link(sc);
    }
}
