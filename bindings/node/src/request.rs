//! What JavaScript sends: connect options, [`EnqueueRequest`], [`ReserveOptions`],
//! [`NackOptions`] and [`DrainDeadLettersOptions`].
//!
//! Each is read from an untyped argument in two steps: `read` checks presence and types (a
//! `TypeError` otherwise), `into_core` checks that the values can be represented in the core's
//! types (the operation's sepp error otherwise). The core's own checks (non-empty names,
//! priority 0 to 9, key length, positive lease, ...) run in the core.

use crate::job::{Payload, TraceContext};
use crate::read::{BadInput, Fields};
use crate::value::{self, CustomValue, Date};
use napi::bindgen_prelude::Unknown;
use napi_derive::napi;
use sepp_rs::client::{SeppClientBuilder, TlsOptions as CoreTlsOptions};
use std::collections::HashMap;

/// Settings of a client. Every field is optional.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct ConnectOptions {
    /// Sent as `authorization: Bearer <apiKey>` on every call; printable ASCII.
    pub api_key: Option<String>,
    /// TLS settings. Giving them (even `{}`) turns TLS on, as an `https://` url does.
    pub tls: Option<TlsOptions>,
    /// Deadline of each call, in milliseconds (Reserve adds its `waitTimeoutMs`); `null` for
    /// no deadline.
    /// @default 30000
    #[napi(ts_type = "number | null")]
    pub rpc_timeout_ms: Option<Option<f64>>,
    /// How long establishing the connection may take, in milliseconds.
    /// @default 10000
    pub connect_timeout_ms: Option<f64>,
    /// Largest response accepted, in bytes.
    /// @default 16777216
    pub max_receive_bytes: Option<f64>,
    /// Automatic retries, only where a retry is safe (a keyed enqueue, ack, nack, extend,
    /// getServerInfo; never reserve or drainDeadLetters). On by default (2 retries, 3 tries
    /// in all); fields left out take the defaults; `null` turns retries off.
    #[napi(ts_type = "RetryPolicy | null")]
    pub retry_policy: Option<Option<RetryPolicy>>,
    /// Whether `enqueue` calls made concurrently on this client leave together as one
    /// `EnqueueBatch` call, each caller still getting its own result (docs/coalescing.md).
    /// `false`: one call per `enqueue`. An `enqueue` on an idle client leaves at once either
    /// way.
    /// @default true
    pub coalesce: Option<bool>,
    /// Most coalesced batches in flight at once, at least 1; enqueues made while all are in
    /// flight wait for the next.
    /// @default 2
    pub max_batches_in_flight: Option<f64>,
}

/// TLS settings for the connection.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct TlsOptions {
    /// PEM of the CA that signed the server's certificate (text or bytes). Unset: the public
    /// web roots.
    #[napi(ts_type = "string | Uint8Array")]
    pub ca_pem: Option<Vec<u8>>,
    /// The name to verify the certificate against. Unset: the url's host.
    pub domain: Option<String>,
    /// PEM certificate chain this client presents, for a server that asks for client
    /// certificates (mutual TLS). Set together with `clientKeyPem`.
    #[napi(ts_type = "string | Uint8Array")]
    pub client_cert_pem: Option<Vec<u8>>,
    /// PEM private key of `clientCertPem`.
    #[napi(ts_type = "string | Uint8Array")]
    pub client_key_pem: Option<Vec<u8>>,
}

/// How a failed call is retried: up to `maxRetries` more times, with pauses growing
/// exponentially (full jitter) between them. Unset fields take the defaults.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct RetryPolicy {
    /// Retries after the first try (0 makes one try).
    /// @default 2
    pub max_retries: Option<f64>,
    /// Upper bound of the pause before the first retry, in milliseconds.
    /// @default 50
    pub first_retry_delay_ms: Option<f64>,
    /// Upper bound of any pause, in milliseconds.
    /// @default 2000
    pub max_retry_delay_ms: Option<f64>,
    /// Growth of the bound per retry.
    /// @default 2
    pub multiplier: Option<f64>,
    /// Tries in all, the first included (`maxRetries + 1`).
    /// @deprecated Use `maxRetries`.
    pub max_attempts: Option<f64>,
    /// @deprecated Use `firstRetryDelayMs`.
    pub initial_backoff_ms: Option<f64>,
    /// @deprecated Use `maxRetryDelayMs`.
    pub max_backoff_ms: Option<f64>,
}

impl ConnectOptions {
    /// Reads the `options` argument of `connect`.
    pub fn read(value: Option<Unknown<'_>>) -> Result<Self, BadInput> {
        let Some(f) = Fields::optional(value, "options")? else {
            return Ok(ConnectOptions {
                api_key: None,
                tls: None,
                rpc_timeout_ms: None,
                connect_timeout_ms: None,
                max_receive_bytes: None,
                retry_policy: None,
                coalesce: None,
                max_batches_in_flight: None,
            });
        };
        let tls = match f.object("tls")? {
            Some(t) => Some(TlsOptions {
                ca_pem: t.text_or_bytes("caPem")?,
                domain: t.string("domain")?,
                client_cert_pem: t.text_or_bytes("clientCertPem")?,
                client_key_pem: t.text_or_bytes("clientKeyPem")?,
            }),
            None => None,
        };
        // `null` (no retries) is not the same as leaving the field out (the default policy).
        let retry_policy = match f.object("retryPolicy")? {
            Some(r) => Some(Some(RetryPolicy {
                max_retries: r.number("maxRetries")?,
                first_retry_delay_ms: r.number("firstRetryDelayMs")?,
                max_retry_delay_ms: r.number("maxRetryDelayMs")?,
                multiplier: r.number("multiplier")?,
                max_attempts: r.number("maxAttempts")?,
                initial_backoff_ms: r.number("initialBackoffMs")?,
                max_backoff_ms: r.number("maxBackoffMs")?,
            })),
            None if f.is_null("retryPolicy")? => Some(None),
            None => None,
        };
        // `null` (no deadline) is not the same as leaving the field out (the default).
        let rpc_timeout_ms = match f.get("rpcTimeoutMs")? {
            None if f.is_null("rpcTimeoutMs")? => Some(None),
            None => None,
            Some(_) => Some(f.number("rpcTimeoutMs")?),
        };
        Ok(ConnectOptions {
            api_key: f.string("apiKey")?,
            tls,
            rpc_timeout_ms,
            connect_timeout_ms: f.number("connectTimeoutMs")?,
            max_receive_bytes: f.number("maxReceiveBytes")?,
            retry_policy,
            coalesce: f.boolean("coalesce")?,
            max_batches_in_flight: f.number("maxBatchesInFlight")?,
        })
    }

    /// Applies the options to a core client builder.
    ///
    /// # Errors
    /// A message for a value the core cannot hold (a negative duration, a fractional count).
    pub fn apply(self, mut b: SeppClientBuilder) -> Result<SeppClientBuilder, String> {
        if let Some(key) = self.api_key {
            b = b.api_key(key);
        }
        if let Some(tls) = self.tls {
            b = b.tls(CoreTlsOptions {
                ca_pem: tls.ca_pem,
                domain: tls.domain,
                client_cert_pem: tls.client_cert_pem,
                client_key_pem: tls.client_key_pem,
            });
        }
        if let Some(t) = self.rpc_timeout_ms {
            let t = t
                .map(|ms| value::duration("options.rpcTimeoutMs", ms))
                .transpose()?;
            b = b.rpc_timeout(t);
        }
        if let Some(ms) = self.connect_timeout_ms {
            b = b.connect_timeout(value::duration("options.connectTimeoutMs", ms)?);
        }
        if let Some(n) = self.max_receive_bytes {
            b = b.max_receive_bytes(value::uint32("options.maxReceiveBytes", n)? as usize);
        }
        if let Some(on) = self.coalesce {
            b = b.coalesce(on);
        }
        if let Some(n) = self.max_batches_in_flight {
            b = b.max_batches_in_flight(value::uint32("options.maxBatchesInFlight", n)? as usize);
        }
        if let Some(None) = self.retry_policy {
            b = b.no_retries();
        }
        if let Some(Some(r)) = self.retry_policy {
            let mut p = sepp_rs::RetryPolicy::default();
            let field = |name: &str| format!("options.retryPolicy.{name}");
            for (new, old, names) in [
                (r.max_retries, r.max_attempts, "maxRetries and maxAttempts"),
                (
                    r.first_retry_delay_ms,
                    r.initial_backoff_ms,
                    "firstRetryDelayMs and initialBackoffMs",
                ),
                (
                    r.max_retry_delay_ms,
                    r.max_backoff_ms,
                    "maxRetryDelayMs and maxBackoffMs",
                ),
            ] {
                if new.is_some() && old.is_some() {
                    return Err(format!(
                        "options.retryPolicy: give one of {names}, not both"
                    ));
                }
            }
            if let Some(n) = r.max_retries {
                p.max_retries = value::uint32(&field("maxRetries"), n)?;
            }
            // `maxAttempts` (deprecated) counted the first try too.
            if let Some(n) = r.max_attempts {
                p.max_retries = value::uint32(&field("maxAttempts"), n)?.saturating_sub(1);
            }
            if let Some(ms) = r.first_retry_delay_ms.or(r.initial_backoff_ms) {
                p.first_retry_delay = value::duration(&field("firstRetryDelayMs"), ms)?;
            }
            if let Some(ms) = r.max_retry_delay_ms.or(r.max_backoff_ms) {
                p.max_retry_delay = value::duration(&field("maxRetryDelayMs"), ms)?;
            }
            if let Some(m) = r.multiplier {
                p.multiplier = m;
            }
            b = b.retry_policy(p);
        }
        Ok(b)
    }
}

/// One job to enqueue.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct EnqueueRequest {
    /// Target queue; non-empty.
    pub queue: String,
    /// Job type; non-empty.
    pub job_type: String,
    /// Optional data: non-empty bytes and their encoding hint.
    pub payload: Option<Payload>,
    /// Optional idempotency key: 1 to `maxIdempotencyKeyBytes` UTF-8 bytes (256 unless the
    /// server says otherwise), compared byte for byte, scoped to the queue. An enqueue with a
    /// key seen on the queue within the dedup window returns the original job's id with
    /// `deduplicated: true` and creates nothing.
    pub idempotency_key: Option<String>,
    /// 0 (lowest) to 9 (highest); unset takes the queue's default.
    pub priority: Option<f64>,
    /// Deliveries before the job is dead-lettered, at least 1; unset takes the queue's
    /// default; the server clamps it to its ceiling.
    pub max_attempts: Option<f64>,
    /// Custom entries; keys non-empty. A `number` that is an integer is sent as an int64, any
    /// other as a double; a `bigint` must fit in an int64.
    pub custom: Option<HashMap<String, CustomValue>>,
    /// W3C trace context.
    pub trace_context: Option<TraceContext>,
    /// Not ready before this time; unset (or past) means at once.
    pub scheduled_at: Option<Date>,
}

impl EnqueueRequest {
    /// Reads a request argument at `path` (`request`, `requests[2]`).
    pub fn read(value: Option<Unknown<'_>>, path: &str) -> Result<Self, BadInput> {
        let f = Fields::required(value, path)?;
        let payload = match f.object("payload")? {
            Some(p) => Some(Payload {
                data: p.required_bytes("data")?,
                encoding: p.required_string("encoding")?,
            }),
            None => None,
        };
        let trace_context = match f.object("traceContext")? {
            Some(t) => Some(TraceContext {
                traceparent: t.required_string("traceparent")?,
                tracestate: t.string("tracestate")?,
            }),
            None => None,
        };
        Ok(EnqueueRequest {
            queue: f.required_string("queue")?,
            job_type: f.required_string("jobType")?,
            payload,
            idempotency_key: f.string("idempotencyKey")?,
            priority: f.number("priority")?,
            max_attempts: f.number("maxAttempts")?,
            custom: f.custom("custom")?,
            trace_context,
            scheduled_at: f.date("scheduledAt")?,
        })
    }

    /// The core's request, or the rejection for a value the core's types cannot hold (a
    /// fractional or negative count, an invalid `Date`, a `bigint` outside int64), which is
    /// `INVALID_REQUEST` naming the field as the core's checks do (`priority is -1: expected
    /// an integer from 0 to 4294967295`, the message Python gives). The core's own checks run
    /// when the request is sent, so a bad job is a rejection in its slot of a batch.
    pub fn into_core(self) -> Result<sepp_rs::EnqueueRequest, sepp_rs::Rejection> {
        let invalid = |message: String| sepp_rs::Rejection::InvalidRequest { message };
        let mut custom = std::collections::BTreeMap::new();
        for (k, v) in self.custom.unwrap_or_default() {
            let value = value::custom_to_core(&format!("custom[{k:?}]"), v).map_err(invalid)?;
            custom.insert(k, value);
        }
        let count = |name: &str, n: Option<f64>| {
            n.map(|n| value::uint32(name, n))
                .transpose()
                .map_err(invalid)
        };
        Ok(sepp_rs::EnqueueRequest {
            queue: self.queue,
            job_type: self.job_type,
            payload: self.payload.map(|p| sepp_rs::Payload {
                data: p.data.to_vec(),
                encoding: p.encoding,
            }),
            idempotency_key: self.idempotency_key,
            priority: count("priority", self.priority)?,
            max_attempts: count("max_attempts", self.max_attempts)?,
            custom,
            trace_context: self.trace_context.map(|t| sepp_rs::TraceContext {
                traceparent: t.traceparent,
                tracestate: t.tracestate,
            }),
            scheduled_at: self
                .scheduled_at
                .map(|d| d.to_system_time("scheduled_at"))
                .transpose()
                .map_err(invalid)?,
        })
    }
}

/// What a reserve asks for.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct ReserveOptions {
    /// Queues to take jobs from, in order of preference; at least one.
    pub queues: Vec<String>,
    /// How long the jobs are leased, in milliseconds; positive. The server clamps it to the
    /// smallest `max_lease_duration_ms` of the queues (see `leaseExpiresAt`).
    pub lease_duration_ms: f64,
    /// How long to wait for a job when none is ready, in milliseconds; unset returns at once.
    /// The server clamps it to its `max_wait_timeout_ms`.
    pub wait_timeout_ms: Option<f64>,
    /// At most this many jobs; at least 1; the server clamps it to `max_reserve_batch`.
    /// @default 1
    pub max_jobs: Option<f64>,
    /// A label for the lease, shown by job inspection.
    pub worker_id: Option<String>,
}

impl ReserveOptions {
    /// Reads the `options` argument of `reserve`.
    pub fn read(value: Option<Unknown<'_>>) -> Result<Self, BadInput> {
        let f = Fields::required(value, "options")?;
        Ok(ReserveOptions {
            queues: f.required_strings("queues")?,
            lease_duration_ms: f.required_number("leaseDurationMs")?,
            wait_timeout_ms: f.number("waitTimeoutMs")?,
            max_jobs: f.number("maxJobs")?,
            worker_id: f.string("workerId")?,
        })
    }

    /// The core's options.
    ///
    /// # Errors
    /// A message naming the field for a value the core cannot hold.
    pub fn into_core(self) -> Result<sepp_rs::ReserveOptions, String> {
        let lease = value::duration("options.leaseDurationMs", self.lease_duration_ms)?;
        let mut o = sepp_rs::ReserveOptions::new(self.queues, lease);
        if let Some(ms) = self.wait_timeout_ms {
            o = o.with_wait_timeout(value::duration("options.waitTimeoutMs", ms)?);
        }
        if let Some(n) = self.max_jobs {
            o = o.with_max_jobs(value::uint32("options.maxJobs", n)?);
        }
        if let Some(w) = self.worker_id {
            o = o.with_worker_id(w);
        }
        Ok(o)
    }
}

/// How a nacked job is retried.
pub enum NackRetry {
    /// `'default'`: the queue's retry policy.
    Default,
    /// `{ delayMs }`: retry after this many milliseconds.
    Delay(f64),
    /// `'deadLetter'`: dead-letter at once.
    DeadLetter,
}

/// Options of a nack.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct NackOptions {
    /// `'default'` (the queue's retry policy: `retry_delay_ms`, `retry_backoff`), `{ delayMs }`
    /// (retry after that many milliseconds, clamped to the schedule horizon), or
    /// `'deadLetter'` (dead-letter at once). Either retry dead-letters the job on its last
    /// attempt.
    /// @default 'default'
    #[napi(ts_type = "'default' | 'deadLetter' | { delayMs: number }")]
    pub retry: Option<NackRetry>,
    /// Why the delivery failed; kept with a dead letter as `lastReason`.
    pub reason: Option<String>,
}

impl NackOptions {
    /// Reads the `options` argument of `nack`.
    pub fn read(value: Option<Unknown<'_>>) -> Result<Self, BadInput> {
        let Some(f) = Fields::optional(value, "options")? else {
            return Ok(NackOptions {
                retry: None,
                reason: None,
            });
        };
        let path = f.path("retry");
        let expected = || {
            BadInput::Type(format!(
                "{path} must be 'default', 'deadLetter' or {{ delayMs: number }}"
            ))
        };
        let retry = match f.get("retry")? {
            None => None,
            Some(v) if v.get_type()? == napi::ValueType::String => {
                match f.string("retry")?.as_deref() {
                    Some("default") => Some(NackRetry::Default),
                    Some("deadLetter") => Some(NackRetry::DeadLetter),
                    _ => return Err(expected()),
                }
            }
            Some(v) if v.get_type()? == napi::ValueType::Object => {
                let delay = f.object("retry")?.ok_or_else(expected)?;
                Some(NackRetry::Delay(delay.required_number("delayMs")?))
            }
            Some(_) => return Err(expected()),
        };
        Ok(NackOptions {
            retry,
            reason: f.string("reason")?,
        })
    }

    /// The core's retry choice.
    ///
    /// # Errors
    /// A message for a negative or non-finite `delayMs`.
    pub fn core_retry(&self) -> Result<sepp_rs::NackRetry, String> {
        Ok(match self.retry {
            None | Some(NackRetry::Default) => sepp_rs::NackRetry::Default,
            Some(NackRetry::DeadLetter) => sepp_rs::NackRetry::DeadLetter,
            Some(NackRetry::Delay(ms)) => {
                sepp_rs::NackRetry::Delay(value::duration("options.retry.delayMs", ms)?)
            }
        })
    }
}

/// Options of `drainDeadLetters`.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct DrainDeadLettersOptions {
    /// Only this queue's dead letters; unset: every queue's.
    pub queue: Option<String>,
    /// At most this many records; at least 1.
    pub max: f64,
}

impl DrainDeadLettersOptions {
    /// Reads the `options` argument of `drainDeadLetters`.
    pub fn read(value: Option<Unknown<'_>>) -> Result<Self, BadInput> {
        let f = Fields::required(value, "options")?;
        Ok(DrainDeadLettersOptions {
            queue: f.string("queue")?,
            max: f.required_number("max")?,
        })
    }
}
