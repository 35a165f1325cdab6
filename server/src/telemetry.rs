//! Logs and traces (`[logging]`, `[tracing]`, `docs/operations.md`).
//!
//! - [`init`] installs the process's subscriber: the log filter (`SEPP_LOG`, else
//!   `[logging] level`), text or JSON lines on standard error (JSON lines carry the fields of
//!   the current spans, `trace_id` among them), and, when `[tracing]` exports, an
//!   OpenTelemetry layer sending the sampled calls' spans over OTLP/gRPC.
//! - [`sampled`]: the sampling decision, made when a call starts, before its span exists: a
//!   call under a job's trace context follows the producer's decision, any other call is
//!   sampled at `sample_ratio`. An unsampled call's span is made on a callsite the
//!   OpenTelemetry layer ignores ([`UNSAMPLED`]), so it costs what it costs with tracing off
//!   (it still carries its fields into the log lines).
//! - [`adopt_trace_context`]: the span of a call about a job becomes a child of the W3C trace
//!   context the producer stored with the job (`traceparent`), and records its `trace_id`, so
//!   one trace runs producer → server → worker.

use crate::config::{Config, LogFormat};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The target of the spans of unsampled calls: the OpenTelemetry layer takes only targets
/// under `sepp_server`, the log layer takes every target.
pub const UNSAMPLED: &str = "sepp::unsampled";

/// `sample_ratio` scaled to `u64::MAX` (a call is sampled when a random `u64` is below it);
/// 0 while nothing is exported.
static SAMPLE_BELOW: AtomicU64 = AtomicU64::new(0);

/// Whether a call's span is exported. `parent`: the `traceparent` of the job the call is
/// about, when it carries one (its sampled flag decides); otherwise a random draw at
/// `tracing.sample_ratio`. Always false while nothing is exported.
pub fn sampled(parent: Option<&str>) -> bool {
    let below = SAMPLE_BELOW.load(Ordering::Relaxed);
    if below == 0 {
        return false;
    }
    if let Some(flags) = parent.and_then(trace_flags) {
        return flags & 1 == 1;
    }
    below == u64::MAX || draw() < below
}

/// The `trace-flags` byte of a valid W3C `traceparent`.
fn trace_flags(traceparent: &str) -> Option<u8> {
    trace_id(traceparent)?;
    let flags = traceparent.rsplit('-').next()?;
    (flags.len() == 2).then(|| u8::from_str_radix(flags, 16).ok())?
}

/// A per-thread xorshift draw (sampling needs no more than that; no lock, no syscall).
fn draw() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64;
            let here = &t as *const u64 as u64;
            (t ^ here.rotate_left(32)) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

/// The spans whose sampling [`sampled`] decided before they were made (they reach the
/// OpenTelemetry layer only when sampled); the RPCs a busy server answers most.
pub const HEAD_SAMPLED: [&str; 6] = [
    "sepp.enqueue",
    "sepp.enqueue_atomic",
    "sepp.reserve",
    "sepp.ack",
    "sepp.nack",
    "sepp.extend",
];

/// The exporter's sampler: the [`HEAD_SAMPLED`] spans are kept (they were sampled already);
/// the other spans (admin calls, rare RPCs) are sampled as before, parent-based at
/// `sample_ratio`.
#[derive(Debug, Clone)]
struct HeadSampled {
    others: opentelemetry_sdk::trace::Sampler,
}

impl opentelemetry_sdk::trace::ShouldSample for HeadSampled {
    fn should_sample(
        &self,
        parent_context: Option<&opentelemetry::Context>,
        trace_id: opentelemetry::trace::TraceId,
        name: &str,
        span_kind: &opentelemetry::trace::SpanKind,
        attributes: &[opentelemetry::KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> opentelemetry_sdk::trace::SamplingResult {
        if HEAD_SAMPLED.contains(&name) {
            return opentelemetry_sdk::trace::SamplingResult {
                decision: opentelemetry_sdk::trace::SamplingDecision::RecordAndSample,
                attributes: Vec::new(),
                trace_state: parent_context
                    .map(|cx| cx.span().span_context().trace_state().clone())
                    .unwrap_or_default(),
            };
        }
        self.others
            .should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}

/// The span of one RPC: `$name` with its fields, on the exported callsite when `$sampled`,
/// else on [`UNSAMPLED`] (same name and fields, for the log lines).
#[macro_export]
macro_rules! rpc_span {
    ($sampled:expr, $name:literal $(, $($fields:tt)*)?) => {
        if $sampled {
            ::tracing::info_span!($name $(, $($fields)*)?)
        } else {
            ::tracing::info_span!(target: $crate::telemetry::UNSAMPLED, $name $(, $($fields)*)?)
        }
    };
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
                .with_sampler(HeadSampled {
                    others: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                        config.tracing.sample_ratio,
                    ))),
                })
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
            let ratio = config.tracing.sample_ratio.clamp(0.0, 1.0);
            let below = if ratio >= 1.0 {
                u64::MAX
            } else {
                (ratio * u64::MAX as f64) as u64
            };
            // A ratio of 0 samples only calls under a sampled producer's trace context.
            SAMPLE_BELOW.store(below.max(1), Ordering::Relaxed);
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

/// Whether `span` is exported (made on a sampled call's callsite, not on [`UNSAMPLED`]).
/// Fields known only once a call's work is done (its outcome, the new job's id) are recorded
/// only on such spans: the log layer prints a span's fields only with the events inside it,
/// and none comes after them, while it would still format every recorded field (about 7 % of
/// a unique-key enqueue's server CPU at the default `info` level).
pub fn exported(span: &tracing::Span) -> bool {
    span.metadata().is_some_and(|m| m.target() != UNSAMPLED)
}

/// Makes `span` (not yet entered) a child of the trace context a producer sent with its job,
/// and records its `trace_id` (for JSON logs, with or without export). Without an
/// OpenTelemetry layer the parent is not kept, only the field.
pub fn adopt_trace_context(
    span: &tracing::Span,
    traceparent: &str,
    tracestate: Option<&str>,
    sampled: bool,
) {
    if let Some(id) = trace_id(traceparent) {
        span.record("trace_id", id);
    }
    if !sampled {
        // Its span is not exported: no parent to keep.
        return;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampled_flag_is_read_from_a_valid_traceparent_only() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            trace_flags(&format!("00-{id}-00f067aa0ba902b7-01")),
            Some(1)
        );
        assert_eq!(
            trace_flags(&format!("00-{id}-00f067aa0ba902b7-00")),
            Some(0)
        );
        assert_eq!(trace_flags(&format!("00-{id}-00f067aa0ba902b7-0")), None);
        assert_eq!(trace_flags("00-nothex-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_flags(""), None);
    }

    #[test]
    fn draws_spread_over_the_range() {
        let below = u64::MAX / 4;
        let hits = (0..10_000).filter(|_| draw() < below).count();
        assert!(
            (2_000..3_000).contains(&hits),
            "{hits} of 10,000 below a quarter"
        );
    }
}
