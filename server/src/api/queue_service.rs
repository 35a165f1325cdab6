//! `sepp.v1.QueueService`: one short method per RPC that converts, calls [`Queue`] and maps
//! the error.

use super::check_reply_budget;
use super::convert::{
    dead_letter_out, duration_arg, enqueue_in, job_out, ms_duration, ms_timestamp, rejection_out,
    reserve_input,
};
use crate::queue::reserve::{ReplyRoom, RoomHandle, Unbounded};
use crate::queue::{NackStrategy, Queue};
use crate::rpc_span;
use crate::telemetry::{adopt_trace_context, exported, link_trace_context, sampled};
use prost::Message;
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_server::QueueService;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// The gRPC face of a [`Queue`].
pub(crate) struct QueueApi {
    pub(crate) queue: Arc<Queue>,
}

/// The span of an enqueue (`name`), named after its first job's queue and, before it is
/// entered, put under the trace of its first job that carries one.
fn enqueue_span(name: &'static str, jobs: &[pb::EnqueueRequest]) -> tracing::Span {
    let parent = jobs.iter().find_map(|j| j.trace_context.as_ref());
    let sampled = sampled(parent.map(|t| t.traceparent.as_str()));
    let span = if name == "sepp.enqueue" {
        rpc_span!(
            sampled,
            "sepp.enqueue",
            jobs = jobs.len(),
            queue = tracing::field::Empty,
            job_id = tracing::field::Empty,
            outcome = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        )
    } else {
        rpc_span!(
            sampled,
            "sepp.enqueue_atomic",
            jobs = jobs.len(),
            queue = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        )
    };
    if let Some(first) = jobs.first() {
        span.record("queue", first.queue.as_str());
    }
    if let Some(t) = parent {
        adopt_trace_context(&span, &t.traceparent, t.tracestate.as_deref(), sampled);
    }
    span
}

/// Records a single job's id and outcome on the current span.
/// Records an enqueue's result on its span, when the span is exported ([`exported`]).
fn record_one(span: &tracing::Span, outcome: &crate::queue::model::JobOutcome) {
    if !exported(span) {
        return;
    }
    let (job_id, what) = match outcome {
        Ok(a) if a.deduplicated => (a.job_id.to_string(), "deduplicated"),
        Ok(a) => (a.job_id.to_string(), "created"),
        Err(r) => (String::new(), r.kind()),
    };
    span.record("job_id", job_id);
    span.record("outcome", what);
}

/// Records a settled job's outcome on the current span, when it is exported ([`exported`]).
fn record_outcome(outcome: &'static str) {
    let span = tracing::Span::current();
    if exported(&span) {
        span.record("outcome", outcome);
    }
}

fn ack_out(a: crate::queue::model::Accepted) -> pb::EnqueueResponse {
    pb::EnqueueResponse {
        job_id: a.job_id.to_string(),
        deduplicated: a.deduplicated,
        original_state: a
            .original_state
            .map(|s| super::convert::job_state_out(s) as i32),
        replaced: a.replaced,
    }
}

/// The room the connection layer gives the call's reply (`server.reply_buffer_bytes`), or
/// none to bound it when the call did not come through it (in-process callers).
fn reply_room<T>(req: &Request<T>) -> Option<RoomHandle> {
    req.extensions().get::<RoomHandle>().cloned()
}

/// The room `handle` names, else [`Unbounded`].
fn room_of(handle: &Option<RoomHandle>) -> &dyn ReplyRoom {
    handle.as_ref().map_or(&Unbounded, |h| &*h.0)
}

/// The bodies of the RPCs whose span [`QueueService`]'s methods make (sampled or not) before
/// they run.
impl QueueApi {
    async fn reserve_in(
        &self,
        req: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        let room = reply_room(&req);
        let input = reserve_input("", req.into_inner())?;
        let jobs = self.queue.reserve_within(input, room_of(&room)).await?;
        let span = tracing::Span::current();
        span.record("jobs", jobs.len());
        // One job's id and attempt, for the exported span only ([`exported`]): the one log line
        // that can follow (a reply over its budget) is about replies of several jobs.
        if let [one] = jobs.as_slice()
            && exported(&span)
        {
            span.record("job_id", one.id.to_string());
            span.record("attempt", one.attempt);
        }
        Ok(Response::new(self.reserve_reply("reserve", jobs)))
    }

    /// Leased jobs as a Reserve reply; links their trace contexts to the call's span.
    fn reserve_reply(&self, call: &str, jobs: Vec<crate::domain::Job>) -> pb::ReserveResponse {
        for j in &jobs {
            if let Some(t) = &j.trace_context {
                link_trace_context(&t.traceparent);
            }
        }
        let reply = pb::ReserveResponse {
            jobs: jobs.into_iter().map(job_out).collect(),
        };
        check_reply_budget(
            call,
            reply.jobs.len(),
            reply.encoded_len(),
            self.queue.limits().max_reserve_reply_bytes,
        );
        reply
    }

    async fn ack_in(
        &self,
        req: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let room = reply_room(&req);
        let r = req.into_inner();
        let Some(then) = r.then_reserve else {
            self.queue.ack(&r.job_id, r.attempt).await?;
            record_outcome("acked");
            return Ok(Response::new(pb::AckResponse {
                job_id: r.job_id,
                next: None,
            }));
        };
        let input = reserve_input("then_reserve.", then)?;
        let jobs = self
            .queue
            .ack_then_reserve_within(&r.job_id, r.attempt, input, room_of(&room))
            .await?;
        record_outcome("acked");
        let next = jobs.map(|jobs| self.reserve_reply("ack then reserve", jobs));
        Ok(Response::new(pb::AckResponse {
            job_id: r.job_id,
            next,
        }))
    }

    async fn nack_in(
        &self,
        req: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        use pb::nack_retry::Strategy;
        let r = req.into_inner();
        let strategy = match r.retry.and_then(|x| x.strategy) {
            None | Some(Strategy::Default(_)) => NackStrategy::Default,
            Some(Strategy::Delay(d)) => {
                NackStrategy::Delay(duration_arg("retry.delay", Some(&d))?.unwrap_or_default())
            }
            Some(Strategy::DeadLetter(_)) => NackStrategy::DeadLetter,
        };
        let dead_lettered = self
            .queue
            .nack(&r.job_id, r.attempt, strategy, r.reason)
            .await?;
        record_outcome(if dead_lettered {
            "dead_lettered"
        } else {
            "retried"
        });
        Ok(Response::new(pb::NackResponse {
            job_id: r.job_id,
            dead_lettered,
        }))
    }

    async fn extend_in(
        &self,
        req: Request<pb::ExtendRequest>,
    ) -> Result<Response<pb::ExtendResponse>, Status> {
        let r = req.into_inner();
        let expires = self
            .queue
            .extend(
                &r.job_id,
                r.attempt,
                duration_arg("lease_duration", r.lease_duration.as_ref())?,
            )
            .await?;
        Ok(Response::new(pb::ExtendResponse {
            job_id: r.job_id,
            lease_expires_at: Some(ms_timestamp(expires)),
        }))
    }
}

#[tonic::async_trait]
impl QueueService for QueueApi {
    async fn enqueue_batch(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let span = enqueue_span("sepp.enqueue", &req.get_ref().jobs);
        let inputs = req.into_inner().jobs.into_iter().map(enqueue_in).collect();
        let outcomes = self
            .queue
            .enqueue_batch(inputs)
            .instrument(span.clone())
            .await?;
        if let [one] = outcomes.as_slice() {
            record_one(&span, one);
        }
        let results = outcomes
            .into_iter()
            .map(|o| pb::JobResult {
                outcome: Some(match o {
                    Ok(a) => pb::job_result::Outcome::Success(ack_out(a)),
                    Err(r) => pb::job_result::Outcome::Rejection(rejection_out(r)),
                }),
            })
            .collect();
        Ok(Response::new(pb::EnqueueBatchResponse { results }))
    }

    async fn enqueue_atomic(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueAtomicResponse>, Status> {
        let span = enqueue_span("sepp.enqueue_atomic", &req.get_ref().jobs);
        let inputs = req.into_inner().jobs.into_iter().map(enqueue_in).collect();
        let outcome = match self.queue.enqueue_atomic(inputs).instrument(span).await? {
            Ok(acks) => pb::enqueue_atomic_response::Outcome::Success(pb::EnqueueAtomicSuccess {
                responses: acks.into_iter().map(ack_out).collect(),
            }),
            Err(failures) => {
                pb::enqueue_atomic_response::Outcome::Rejection(pb::BatchValidationFailure {
                    errors: failures
                        .into_iter()
                        .map(|(index, r)| pb::JobValidationError {
                            index,
                            rejection: Some(rejection_out(r)),
                        })
                        .collect(),
                })
            }
        };
        Ok(Response::new(pb::EnqueueAtomicResponse {
            outcome: Some(outcome),
        }))
    }

    async fn reserve(
        &self,
        req: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        let span = rpc_span!(
            sampled(None),
            "sepp.reserve",
            queue = req
                .get_ref()
                .queues
                .first()
                .map(String::as_str)
                .unwrap_or_default(),
            jobs = tracing::field::Empty,
            job_id = tracing::field::Empty,
            attempt = tracing::field::Empty,
        );
        self.reserve_in(req).instrument(span).await
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        let span = rpc_span!(
            sampled(None),
            "sepp.ack",
            job_id = req.get_ref().job_id.as_str(),
            attempt = req.get_ref().attempt,
            outcome = tracing::field::Empty,
        );
        self.ack_in(req).instrument(span).await
    }

    async fn nack(
        &self,
        req: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        let span = rpc_span!(
            sampled(None),
            "sepp.nack",
            job_id = req.get_ref().job_id.as_str(),
            attempt = req.get_ref().attempt,
            outcome = tracing::field::Empty,
        );
        self.nack_in(req).instrument(span).await
    }

    async fn extend(
        &self,
        req: Request<pb::ExtendRequest>,
    ) -> Result<Response<pb::ExtendResponse>, Status> {
        let span = rpc_span!(
            sampled(None),
            "sepp.extend",
            job_id = req.get_ref().job_id.as_str(),
            attempt = req.get_ref().attempt,
        );
        self.extend_in(req).instrument(span).await
    }
    #[tracing::instrument(name = "sepp.drain_dead_letters", skip_all)]
    async fn drain_dead_letters(
        &self,
        req: Request<pb::DrainDeadLettersRequest>,
    ) -> Result<Response<pb::DrainDeadLettersResponse>, Status> {
        let r = req.into_inner();
        let records = self.queue.drain_dead_letters(r.queue, r.max).await?;
        let reply = pb::DrainDeadLettersResponse {
            records: records.into_iter().map(dead_letter_out).collect(),
        };
        check_reply_budget(
            "drain",
            reply.records.len(),
            reply.encoded_len(),
            self.queue.limits().max_reserve_reply_bytes,
        );
        Ok(Response::new(reply))
    }

    #[tracing::instrument(name = "sepp.get_server_info", skip_all)]
    async fn get_server_info(
        &self,
        _req: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        let info = self.queue.server_info();
        let l = &*info.limits;
        let d = &*l.defaults;
        Ok(Response::new(pb::GetServerInfoResponse {
            server_version: info.version.to_string(),
            supported_protocol_versions: vec!["v1".to_string()],
            server_time: Some(ms_timestamp(info.server_time)),
            restricts_encodings: d.allowed_encodings.is_some(),
            allowed_encodings: d.allowed_encodings.clone().unwrap_or_default(),
            max_payload_bytes: d.max_payload_bytes,
            max_custom_entries: d.max_custom_entries,
            max_custom_total_bytes: d.max_custom_total_bytes,
            max_custom_key_bytes: d.max_custom_key_bytes,
            max_queue_name_bytes: l.max_queue_name_bytes,
            max_job_type_bytes: l.max_job_type_bytes,
            max_idempotency_key_bytes: l.max_idempotency_key_bytes,
            max_schedule_horizon: Some(ms_duration(d.max_schedule_horizon_ms)),
            max_enqueue_batch: l.max_enqueue_batch,
            max_reserve_batch: l.max_reserve_batch,
            max_reserve_queues: l.max_reserve_queues,
            max_wait_timeout: Some(ms_duration(l.max_wait_timeout_ms)),
            max_lease_duration: Some(ms_duration(d.max_lease_duration_ms)),
            strict_queues: l.strict_queues,
            dead_letter_retention_enabled: l.dead_letter_retention_enabled,
            dedup_window: Some(ms_duration(d.dedup_window_ms)),
            max_reason_bytes: l.max_reason_bytes,
            max_reserve_reply_bytes: l.max_reserve_reply_bytes,
            max_trace_context_bytes: l.max_trace_context_bytes,
            max_worker_id_bytes: l.max_worker_id_bytes,
            max_encoding_bytes: l.max_encoding_bytes,
        }))
    }
}
