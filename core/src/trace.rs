//! Trace propagation, producer → server → worker: the rule every language follows.
//!
//! - **Enqueue**: a request's own `trace_context` is sent as it is; a request without one gets
//!   the producer's current trace context, when there is one (in Rust: OpenTelemetry's current
//!   context, with the `opentelemetry` feature; Python and Node pass the current context of
//!   their own OpenTelemetry API as the request's, see [`current_or`]). No context: nothing is
//!   sent, and the job starts no trace.
//! - **Handle**: a worker runs each handler inside a span named [`HANDLER_SPAN`], of kind
//!   consumer, whose parent is the job's stored trace context when it is a valid W3C
//!   `traceparent` ([`parse_traceparent`]); otherwise the span starts a new trace. Its
//!   attributes are [`handler_span_attributes`]. A handler error marks the span's status as
//!   error with the reason.
//!
//! The server's `sepp.enqueue` span is a child of the same context, so a trace reads producer
//! span → `sepp.enqueue` (server) and producer span → `sepp.handle` (worker).

use crate::job::{Job, TraceContext};

/// The name of the span a worker runs a handler in.
pub const HANDLER_SPAN: &str = "sepp.handle";

/// Longest `tracestate` taken from the current context, in bytes (W3C's limit); a longer one
/// is left out rather than have the job refused.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A parsed W3C `traceparent` (version `00`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanParent {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, not all zero.
    pub span_id: [u8; 8],
    /// The `trace-flags` byte (bit 0: sampled).
    pub flags: u8,
}

fn hex_into(s: &str, out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(())
}

/// Parses a `traceparent` header: `00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>`, with
/// non-zero ids. `None` for anything else (a worker then starts a new trace).
pub fn parse_traceparent(s: &str) -> Option<SpanParent> {
    let mut parts = s.trim().split('-');
    let (Some(version), Some(trace), Some(span), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    if version != "00" {
        return None;
    }
    let mut p = SpanParent {
        trace_id: [0; 16],
        span_id: [0; 8],
        flags: 0,
    };
    hex_into(trace, &mut p.trace_id)?;
    hex_into(span, &mut p.span_id)?;
    let mut f = [0u8; 1];
    hex_into(flags, &mut f)?;
    p.flags = f[0];
    if p.trace_id == [0; 16] || p.span_id == [0; 8] {
        return None;
    }
    Some(p)
}

/// Formats a `traceparent` header.
pub fn format_traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], flags: u8) -> String {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("00-{}-{}-{flags:02x}", hex(trace_id), hex(span_id))
}

/// The trace context an enqueue sends: the request's own, else `current` (the producer's
/// current context, read by the caller from its language's tracing API), else none. A
/// `current` whose `traceparent` does not parse is not sent; its `tracestate` is left out when
/// empty or longer than [`MAX_TRACESTATE_BYTES`].
pub fn current_or(
    explicit: Option<&TraceContext>,
    current: Option<TraceContext>,
) -> Option<TraceContext> {
    if let Some(t) = explicit {
        return Some(t.clone());
    }
    let c = current?;
    parse_traceparent(&c.traceparent)?;
    Some(TraceContext {
        traceparent: c.traceparent,
        tracestate: c
            .tracestate
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_BYTES),
    })
}

/// The current trace context of this process's Rust code: OpenTelemetry's current span
/// context with the `opentelemetry` feature, none without it.
pub(crate) fn current_context() -> Option<TraceContext> {
    #[cfg(feature = "opentelemetry")]
    {
        otel::current()
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        None
    }
}

/// What a worker's handler span is: its name, attributes and parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerSpan {
    /// [`HANDLER_SPAN`].
    pub name: &'static str,
    /// [`handler_span_attributes`].
    pub attributes: Vec<(&'static str, String)>,
    /// The job's trace context when its `traceparent` is valid: the span's parent. `None`:
    /// the span starts a new trace.
    pub parent: Option<TraceContext>,
}

/// The handler span of `job`, for a worker in any language.
pub fn handler_span(job: &Job) -> HandlerSpan {
    HandlerSpan {
        name: HANDLER_SPAN,
        attributes: handler_span_attributes(job),
        parent: job
            .trace_context
            .clone()
            .filter(|t| parse_traceparent(&t.traceparent).is_some()),
    }
}

/// The attributes of a job's handler span (OpenTelemetry messaging conventions plus sepp's).
pub fn handler_span_attributes(job: &Job) -> Vec<(&'static str, String)> {
    vec![
        ("messaging.system", "sepp".to_string()),
        ("messaging.operation.type", "process".to_string()),
        ("messaging.destination.name", job.queue.clone()),
        ("messaging.message.id", job.id.clone()),
        ("sepp.job_type", job.job_type.clone()),
        ("sepp.attempt", job.attempt.to_string()),
    ]
}

/// The Rust side of the rule, over OpenTelemetry's API (feature `opentelemetry`): the current
/// context at enqueue, and the handler span of the Rust [`crate::Worker`].
#[cfg(feature = "opentelemetry")]
pub(crate) mod otel {
    use super::{HANDLER_SPAN, SpanParent, handler_span_attributes, parse_traceparent};
    use crate::job::{Job, TraceContext};
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
    };
    use opentelemetry::{Context, KeyValue};

    /// OpenTelemetry's current span context as a W3C trace context, if it is valid.
    pub(crate) fn current() -> Option<TraceContext> {
        let cx = Context::current();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        Some(TraceContext {
            traceparent: super::format_traceparent(
                &sc.trace_id().to_bytes(),
                &sc.span_id().to_bytes(),
                sc.trace_flags().to_u8(),
            ),
            tracestate: Some(sc.trace_state().header()),
        })
    }

    /// The context a job's handler runs in: a [`HANDLER_SPAN`] span from the global tracer,
    /// child of the job's trace context when it has a valid one.
    pub(crate) fn handler_context(job: &Job) -> Context {
        let parent = job
            .trace_context
            .as_ref()
            .and_then(|t| parse_traceparent(&t.traceparent).map(|p| (p, t.tracestate.clone())))
            .map_or_else(Context::new, |(p, state): (SpanParent, _)| {
                let state = state
                    .and_then(|s| s.parse::<TraceState>().ok())
                    .unwrap_or_default();
                Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(p.trace_id),
                    SpanId::from_bytes(p.span_id),
                    TraceFlags::new(p.flags),
                    true,
                    state,
                ))
            });
        let tracer = opentelemetry::global::tracer("sepp-rs");
        let span = tracer
            .span_builder(HANDLER_SPAN)
            .with_kind(SpanKind::Consumer)
            .with_attributes(
                handler_span_attributes(job)
                    .into_iter()
                    .map(|(k, v)| KeyValue::new(k, v)),
            )
            .start_with_context(&tracer, &parent);
        parent.with_span(span)
    }

    /// Marks the handler span of `cx` as failed with `reason`.
    pub(crate) fn failed(cx: &Context, reason: &str) {
        cx.span()
            .set_status(opentelemetry::trace::Status::error(reason.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_parses_only_in_the_w3c_form() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let p = parse_traceparent(tp).expect("valid");
        assert_eq!(p.span_id, [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]);
        assert_eq!(p.flags, 1);
        assert_eq!(format_traceparent(&p.trace_id, &p.span_id, p.flags), tp);
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_explicit_context_wins_then_the_current_one_if_valid() {
        let mine = TraceContext {
            traceparent: "00-11111111111111111111111111111111-2222222222222222-01".into(),
            tracestate: None,
        };
        let cur = TraceContext {
            traceparent: "00-33333333333333333333333333333333-4444444444444444-01".into(),
            tracestate: Some(String::new()),
        };
        assert_eq!(current_or(Some(&mine), Some(cur.clone())), Some(mine));
        assert_eq!(
            current_or(None, Some(cur.clone())),
            Some(TraceContext {
                tracestate: None,
                ..cur
            })
        );
        let junk = TraceContext {
            traceparent: "nope".into(),
            tracestate: None,
        };
        assert_eq!(current_or(None, Some(junk)), None);
        assert_eq!(current_or(None, None), None);
    }
}
