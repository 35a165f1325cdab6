//! `sepp.admin.v1.AdminService`: job and key inspection, dead-letter repair, pause/resume,
//! queue stats. One short method per RPC.

use super::convert::{
    cause_out, dead_letter_out, job_state_out, ms_duration, ms_timestamp, payload_out,
    trace_context_out, value_out,
};
use crate::domain::{JobInfo, ListState, QueueStats};
use crate::queue::Queue;
use crate::queue::admin::SelectorInput;
use crate::queue::schedule::{ScheduleView, Spec};
use sepp_proto::admin::v1 as pb;
use sepp_proto::admin::v1::admin_service_server::AdminService;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The gRPC face of the operator calls.
pub(crate) struct AdminApi {
    pub(crate) queue: Arc<Queue>,
    /// To name the API key of an operator action in the audit log.
    pub(crate) auth: super::auth::ApiKeyAuth,
}

/// A job on the wire: with what it carries (payload, custom entries, trace context) only when
/// `with_content`, which GetJob's reply is; listing and cancel replies stay small.
fn info_out(j: JobInfo, with_content: bool) -> pb::JobInfo {
    let content = j.content.filter(|_| with_content).unwrap_or_default();
    pb::JobInfo {
        job_id: j.id.to_string(),
        state: job_state_out(j.state) as i32,
        queue: j.queue,
        job_type: j.job_type,
        attempt: j.attempt,
        max_attempts: j.max_attempts,
        priority: u32::from(j.priority),
        enqueued_at: Some(ms_timestamp(j.enqueued_at)),
        scheduled_at: j.scheduled_at.map(ms_timestamp),
        lease_expires_at: j.lease_expires_at.map(ms_timestamp),
        last_reason: j.last_reason,
        finished_at: j.finished_at.map(ms_timestamp),
        dead_letter_cause: j.dead_letter_cause.map_or(0, |c| cause_out(c) as i32),
        idempotency_key: j.idempotency_key,
        worker_id: j.worker_id,
        payload: content.payload.map(payload_out),
        custom: content
            .custom
            .into_iter()
            .map(|(k, v)| (k, value_out(v)))
            .collect(),
        trace_context: content.trace_context.map(trace_context_out),
    }
}

/// A job in a listing or a cancel reply: without what it carries.
fn summary_out(j: JobInfo) -> pb::JobInfo {
    info_out(j, false)
}

fn stats_out(queue: String, s: QueueStats) -> pb::GetQueueStatsResponse {
    pb::GetQueueStatsResponse {
        queue,
        ready: s.ready,
        scheduled: s.scheduled,
        in_flight: s.in_flight,
        dead_lettered: s.dead_lettered,
        dedup_records: s.dedup_records,
        paused: s.paused,
    }
}

fn list_state_in(state: i32) -> Result<ListState, Status> {
    match pb::JobState::try_from(state) {
        Ok(pb::JobState::Ready) => Ok(ListState::Ready),
        Ok(pb::JobState::Scheduled) => Ok(ListState::Scheduled),
        Ok(pb::JobState::InFlight) => Ok(ListState::InFlight),
        Ok(pb::JobState::DeadLettered) => Ok(ListState::DeadLettered),
        _ => Err(Status::invalid_argument(format!(
            "state {state} cannot be listed: use READY, SCHEDULED, IN_FLIGHT or DEAD_LETTERED"
        ))),
    }
}

fn schedule_out(v: ScheduleView) -> pb::ScheduleInfo {
    let s = &v.schedule;
    pb::ScheduleInfo {
        name: s.name.clone(),
        queue: s.queue.clone(),
        job_type: s.job_type.clone(),
        spec: Some(match &s.spec {
            Spec::Cron { expr, .. } => pb::schedule_info::Spec::Cron(expr.clone()),
            Spec::Every { ms } => pb::schedule_info::Spec::Every(ms_duration(*ms)),
        }),
        timezone: s.spec.zone_name().to_string(),
        catch_up: s.catch_up,
        next_tick: v.next_tick.map(ms_timestamp),
        last_tick: v.last.map(|l| ms_timestamp(l.tick)),
        last_job_id: v.last.map(|l| l.job_id.to_string()).unwrap_or_default(),
        last_enqueued_at: v.last.map(|l| ms_timestamp(l.enqueued_at)),
    }
}

fn unknown_job(id: String) -> pb::JobInfo {
    pb::JobInfo {
        job_id: id,
        state: pb::JobState::Unknown as i32,
        ..Default::default()
    }
}

fn selector_in(s: Option<pb::DeadLetterSelector>) -> SelectorInput {
    let s = s.unwrap_or_default();
    SelectorInput {
        job_ids: s.job_ids,
        queue: s.queue,
        max: s.max,
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    #[tracing::instrument(name = "sepp.admin.get_job", skip_all)]
    async fn get_job(
        &self,
        req: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        let id = req.into_inner().job_id;
        let job = match self.queue.get_job(&id).await? {
            Some(info) => info_out(info, true),
            None => unknown_job(id),
        };
        Ok(Response::new(pb::GetJobResponse { job: Some(job) }))
    }

    #[tracing::instrument(name = "sepp.admin.lookup_idempotency_key", skip_all)]
    async fn lookup_idempotency_key(
        &self,
        req: Request<pb::LookupIdempotencyKeyRequest>,
    ) -> Result<Response<pb::LookupIdempotencyKeyResponse>, Status> {
        let r = req.into_inner();
        let rec = self
            .queue
            .lookup_idempotency_key(&r.queue, &r.idempotency_key)
            .await?;
        Ok(Response::new(match rec {
            Some(k) => pb::LookupIdempotencyKeyResponse {
                found: true,
                job_id: k.job_id.to_string(),
                created_at: Some(ms_timestamp(k.created_at)),
                expires_at: Some(ms_timestamp(k.expires_at)),
            },
            None => pb::LookupIdempotencyKeyResponse::default(),
        }))
    }

    #[tracing::instrument(name = "sepp.admin.release_leases", skip_all)]
    async fn release_leases(
        &self,
        req: Request<pb::ReleaseLeasesRequest>,
    ) -> Result<Response<pb::ReleaseLeasesResponse>, Status> {
        let api_key = self.auth.caller(req.metadata().as_ref());
        let r = req.into_inner();
        let ids = self.queue.release_leases(&r.worker_id).await?;
        tracing::warn!(
            target: "sepp::audit",
            action = "release_leases",
            api_key = api_key.as_deref().unwrap_or("-"),
            worker_id = %r.worker_id,
            released = ids.len(),
            "leases released by an operator"
        );
        Ok(Response::new(pb::ReleaseLeasesResponse {
            job_ids: ids.iter().map(ToString::to_string).collect(),
        }))
    }

    #[tracing::instrument(name = "sepp.admin.forget_idempotency_key", skip_all)]
    async fn forget_idempotency_key(
        &self,
        req: Request<pb::ForgetIdempotencyKeyRequest>,
    ) -> Result<Response<pb::ForgetIdempotencyKeyResponse>, Status> {
        let api_key = self.auth.caller(req.metadata().as_ref());
        let r = req.into_inner();
        let rec = self
            .queue
            .forget_idempotency_key(&r.queue, &r.idempotency_key)
            .await?;
        // The audit record: who forgot which key, and when (the log line's own timestamp).
        tracing::warn!(
            target: "sepp::audit",
            action = "forget_idempotency_key",
            api_key = api_key.as_deref().unwrap_or("-"),
            queue = %r.queue,
            idempotency_key = %r.idempotency_key,
            forgotten = rec.is_some(),
            job_id = %rec.map(|k| k.job_id.to_string()).unwrap_or_default(),
            at_ms = self.queue.clock().now(),
            "idempotency key forgotten by an operator"
        );
        Ok(Response::new(match rec {
            Some(k) => pb::ForgetIdempotencyKeyResponse {
                forgotten: true,
                job_id: k.job_id.to_string(),
            },
            None => pb::ForgetIdempotencyKeyResponse::default(),
        }))
    }

    #[tracing::instrument(name = "sepp.admin.list_dead_letters", skip_all)]
    async fn list_dead_letters(
        &self,
        req: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let r = req.into_inner();
        let page = self
            .queue
            .list_dead_letters(r.queue, r.page_size, &r.page_token)
            .await?;
        let reply = pb::ListDeadLettersResponse {
            records: page.records.into_iter().map(dead_letter_out).collect(),
            next_page_token: page.next_page_token,
        };
        super::check_reply_budget(
            "list_dead_letters",
            reply.records.len(),
            prost::Message::encoded_len(&reply),
            self.queue.limits().max_reserve_reply_bytes,
        );
        Ok(Response::new(reply))
    }

    #[tracing::instrument(name = "sepp.admin.requeue_dead_letters", skip_all)]
    async fn requeue_dead_letters(
        &self,
        req: Request<pb::RequeueDeadLettersRequest>,
    ) -> Result<Response<pb::RequeueDeadLettersResponse>, Status> {
        let sel = selector_in(req.into_inner().selector);
        let ids = self.queue.requeue_dead_letters(sel).await?;
        Ok(Response::new(pb::RequeueDeadLettersResponse {
            job_ids: ids.into_iter().map(|i| i.to_string()).collect(),
        }))
    }

    #[tracing::instrument(name = "sepp.admin.delete_dead_letters", skip_all)]
    async fn delete_dead_letters(
        &self,
        req: Request<pb::DeleteDeadLettersRequest>,
    ) -> Result<Response<pb::DeleteDeadLettersResponse>, Status> {
        let sel = selector_in(req.into_inner().selector);
        let ids = self.queue.delete_dead_letters(sel).await?;
        Ok(Response::new(pb::DeleteDeadLettersResponse {
            job_ids: ids.into_iter().map(|i| i.to_string()).collect(),
        }))
    }

    #[tracing::instrument(name = "sepp.admin.backup", skip_all)]
    async fn backup(
        &self,
        req: Request<pb::BackupRequest>,
    ) -> Result<Response<pb::BackupResponse>, Status> {
        let dir = req.into_inner().dir;
        let report = self.queue.backup(&dir).await?;
        tracing::info!(
            dir,
            records = report.records,
            bytes = report.bytes,
            "backup written"
        );
        Ok(Response::new(pb::BackupResponse {
            records: report.records,
            bytes: report.bytes,
        }))
    }

    #[tracing::instrument(name = "sepp.admin.pause_queue", skip_all)]
    async fn pause_queue(
        &self,
        req: Request<pb::PauseQueueRequest>,
    ) -> Result<Response<pb::PauseQueueResponse>, Status> {
        self.queue.set_paused(&req.into_inner().queue, true).await?;
        Ok(Response::new(pb::PauseQueueResponse {}))
    }

    #[tracing::instrument(name = "sepp.admin.resume_queue", skip_all)]
    async fn resume_queue(
        &self,
        req: Request<pb::ResumeQueueRequest>,
    ) -> Result<Response<pb::ResumeQueueResponse>, Status> {
        self.queue
            .set_paused(&req.into_inner().queue, false)
            .await?;
        Ok(Response::new(pb::ResumeQueueResponse {}))
    }

    #[tracing::instrument(name = "sepp.admin.get_queue_stats", skip_all)]
    async fn get_queue_stats(
        &self,
        req: Request<pb::GetQueueStatsRequest>,
    ) -> Result<Response<pb::GetQueueStatsResponse>, Status> {
        let queue = req.into_inner().queue;
        let s = self.queue.queue_stats(&queue).await?;
        Ok(Response::new(stats_out(queue, s)))
    }

    #[tracing::instrument(name = "sepp.admin.list_queues", skip_all)]
    async fn list_queues(
        &self,
        req: Request<pb::ListQueuesRequest>,
    ) -> Result<Response<pb::ListQueuesResponse>, Status> {
        let r = req.into_inner();
        let page = self.queue.list_queues(r.page_size, &r.page_token).await?;
        let reply = pb::ListQueuesResponse {
            queues: page
                .queues
                .into_iter()
                .map(|(q, s)| stats_out(q, s))
                .collect(),
            next_page_token: page.next_page_token,
        };
        super::check_reply_budget(
            "list_queues",
            reply.queues.len(),
            prost::Message::encoded_len(&reply),
            self.queue.limits().max_reserve_reply_bytes,
        );
        Ok(Response::new(reply))
    }

    #[tracing::instrument(name = "sepp.admin.list_schedules", skip_all)]
    async fn list_schedules(
        &self,
        _req: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        let views = self.queue.list_schedules().await?;
        Ok(Response::new(pb::ListSchedulesResponse {
            schedules: views.into_iter().map(schedule_out).collect(),
        }))
    }

    #[tracing::instrument(name = "sepp.admin.list_jobs", skip_all)]
    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let r = req.into_inner();
        let state = list_state_in(r.state)?;
        let page = self
            .queue
            .list_jobs(&r.queue, state, r.page_size, &r.page_token)
            .await?;
        let reply = pb::ListJobsResponse {
            jobs: page.jobs.into_iter().map(summary_out).collect(),
            next_page_token: page.next_page_token,
        };
        super::check_reply_budget(
            "list_jobs",
            reply.jobs.len(),
            prost::Message::encoded_len(&reply),
            self.queue.limits().max_reserve_reply_bytes,
        );
        Ok(Response::new(reply))
    }

    #[tracing::instrument(name = "sepp.admin.cancel_job", skip_all)]
    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        let r = req.into_inner();
        let by_id = (!r.job_id.is_empty()).then_some(r.job_id.as_str());
        let by_key = (!r.queue.is_empty() || !r.idempotency_key.is_empty())
            .then_some((r.queue.as_str(), r.idempotency_key.as_str()));
        let (cancelled, info) = self.queue.cancel_job(by_id, by_key).await?;
        Ok(Response::new(pb::CancelJobResponse {
            cancelled,
            job: Some(info.map_or_else(|| unknown_job(r.job_id.clone()), summary_out)),
        }))
    }

    #[tracing::instrument(name = "sepp.admin.purge_queue", skip_all)]
    async fn purge_queue(
        &self,
        req: Request<pb::PurgeQueueRequest>,
    ) -> Result<Response<pb::PurgeQueueResponse>, Status> {
        let r = req.into_inner();
        let (ids, more) = self.queue.purge_queue(&r.queue, r.max).await?;
        Ok(Response::new(pb::PurgeQueueResponse {
            purged: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            more,
        }))
    }

    #[tracing::instrument(name = "sepp.admin.delete_queue", skip_all)]
    async fn delete_queue(
        &self,
        req: Request<pb::DeleteQueueRequest>,
    ) -> Result<Response<pb::DeleteQueueResponse>, Status> {
        let api_key = self.auth.caller(req.metadata().as_ref());
        let queue = req.into_inner().queue;
        let was = self.queue.delete_queue(&queue).await?;
        tracing::warn!(
            target: "sepp::audit",
            action = "delete_queue",
            api_key = api_key.as_deref().unwrap_or("-"),
            queue = %queue,
            dedup_records = was.dedup_records,
            was_paused = was.paused,
            "queue deleted by an operator"
        );
        Ok(Response::new(pb::DeleteQueueResponse {
            dedup_records: was.dedup_records,
            was_paused: was.paused,
        }))
    }

    #[tracing::instrument(name = "sepp.admin.get_queue_rates", skip_all)]
    async fn get_queue_rates(
        &self,
        req: Request<pb::GetQueueRatesRequest>,
    ) -> Result<Response<pb::GetQueueRatesResponse>, Status> {
        let r = req.into_inner();
        let report = self
            .queue
            .queue_rates(r.queue.as_deref(), r.page_size, &r.page_token)
            .await?;
        let series = |q: &crate::queue::rates::QueueRates,
                      f: fn(&crate::storage::RateCounts) -> u64| {
            q.minutes.iter().map(f).collect::<Vec<u64>>()
        };
        Ok(Response::new(pb::GetQueueRatesResponse {
            first_minute: Some(ms_timestamp(report.first_minute * 60_000)),
            queues: report
                .queues
                .iter()
                .map(|q| pb::QueueRates {
                    queue: q.queue.clone(),
                    enqueued: series(q, |c| c.enqueued),
                    acked: series(q, |c| c.acked),
                    nacked: series(q, |c| c.nacked),
                    dead_lettered: series(q, |c| c.dead_lettered),
                })
                .collect(),
            next_page_token: report.next_page_token,
        }))
    }
}
