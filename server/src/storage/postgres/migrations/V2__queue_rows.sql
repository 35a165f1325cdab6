-- Every queue has a row in sepp_queues from its first job (or pause) until an operator deletes
-- it (DeleteQueue), so that limits.max_queues can count queues and ListQueues pages one table.
-- Before this version only paused queues had one: give every queue that holds a job one.
-- Tombstones (stage 4) are left out: they are what stays of finished jobs, not a queue.
INSERT INTO sepp_queues (name, paused)
SELECT DISTINCT queue, false FROM sepp_jobs WHERE stage <> 4
ON CONFLICT (name) DO NOTHING;
