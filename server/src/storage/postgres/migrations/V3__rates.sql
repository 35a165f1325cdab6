-- Per-minute counts of each queue's enqueued, acked, nacked and dead-lettered jobs, for the
-- queues dashboard's rates (the last hour). Every server adds what it did each few seconds
-- (INSERT ... ON CONFLICT DO UPDATE adding its counts), so a bucket is the sum over servers;
-- buckets older than an hour are deleted by the same statements.
CREATE TABLE sepp_rates (
    minute        bigint NOT NULL,
    queue         text COLLATE "C" NOT NULL,
    enqueued      bigint NOT NULL,
    acked         bigint NOT NULL,
    nacked        bigint NOT NULL,
    dead_lettered bigint NOT NULL,
    PRIMARY KEY (minute, queue)
);
