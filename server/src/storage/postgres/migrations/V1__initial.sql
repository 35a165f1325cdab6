-- sepp's PostgreSQL schema, version 1. Every time is Unix milliseconds (bigint), as the queue's
-- clock gives it: the database's clock is never read. docs/postgres.md explains each index.

-- Enqueue order: a job's place among the ready jobs of its priority.
CREATE SEQUENCE sepp_job_seq AS bigint;

CREATE TABLE sepp_jobs (
    id               uuid PRIMARY KEY,
    queue            text COLLATE "C" NOT NULL,
    job_type         text NOT NULL,
    priority         smallint NOT NULL,
    seq              bigint NOT NULL,
    enqueued_at      bigint NOT NULL,
    attempt          integer NOT NULL,
    max_attempts     integer NOT NULL,
    -- 0 ready, 1 scheduled, 2 in flight, 3 dead letter, 4 tombstone
    stage            smallint NOT NULL,
    due_at           bigint,
    lease_expires_at bigint,
    -- 0 attempts exhausted, 1 rejected, 2 lease expired, 3 admin
    dead_cause       smallint,
    failed_at        bigint,
    finished_at      bigint,
    tomb_until       bigint,
    worker_id        text,
    last_reason      text,
    dedup_until      bigint,
    reply_bytes      integer NOT NULL,
    -- job type, payload, trace context, custom map, scheduled_at, idempotency key, in the
    -- embedded backend's record format; NULL once the job is a tombstone
    body             bytea
);

-- Reserve: the ready jobs of one queue, highest priority then enqueue order.
CREATE INDEX sepp_jobs_ready ON sepp_jobs (queue, priority DESC, seq) WHERE stage = 0;
-- The sweeper: due scheduled jobs, expired leases, dead letters past retention, tombstones.
CREATE INDEX sepp_jobs_scheduled ON sepp_jobs (due_at) WHERE stage = 1;
CREATE INDEX sepp_jobs_lease ON sepp_jobs (lease_expires_at) WHERE stage = 2;
CREATE INDEX sepp_jobs_tombstone ON sepp_jobs (tomb_until) WHERE stage = 4;
-- Dead letters oldest first, of every queue and of one queue (drain, list, retention).
CREATE INDEX sepp_jobs_dead ON sepp_jobs (failed_at, id) WHERE stage = 3;
CREATE INDEX sepp_jobs_dead_queue ON sepp_jobs (queue, failed_at, id) WHERE stage = 3;
-- Queue depth (max_queue_depth) and the counts of GetQueueStats.
CREATE INDEX sepp_jobs_queue_stage ON sepp_jobs (queue, stage);

-- Dedup records: one per (queue, key); the unique key decides concurrent enqueues of a key.
CREATE TABLE sepp_dedup (
    queue      text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    job_id     uuid NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL,
    -- what defined the job (key_conflict = "reject"), the 64 bits as a signed bigint; else NULL
    fingerprint bigint,
    PRIMARY KEY (queue, key)
);
-- The sweeper's purge of expired records.
CREATE INDEX sepp_dedup_expiry ON sepp_dedup (expires_at);

-- Paused queues.
CREATE TABLE sepp_queues (
    name   text COLLATE "C" PRIMARY KEY,
    paused boolean NOT NULL
);
