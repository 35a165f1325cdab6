"""The Python runner of the cross-language behaviour suite (scenarios.json describes the steps).

    python runner.py URL SCENARIOS OUT RUN

Runs every scenario through the `sepp` package against the server at URL and writes what it
observed to OUT, in the format of the Rust runner (src/bin/behaviour_runner.rs). To restart the
server it prints ``restart-server`` and waits for ``restarted`` on standard input.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import sepp

DEADLINE_S = 30.0


class Runner:
    def __init__(self, client: sepp.SeppClient, run: str) -> None:
        self.client = client
        self.run = run
        self.jobs: dict[str, str] = {}
        self.worker: Optional[sepp.Worker] = None
        self.running: Optional[asyncio.Task[sepp.WorkerReport]] = None
        self.stopping = asyncio.Event()
        self.started = 0

    def text(self, v: Any) -> str:
        if isinstance(v, str):
            return v.replace("{run}", self.run)
        s, n = v["repeat"]
        return str(s) * int(n)

    def request(self, spec: dict[str, Any]) -> tuple[sepp.EnqueueRequest, Optional[str]]:
        payload = spec.get("payload")
        scheduled = spec.get("scheduled_in_ms")
        request = sepp.EnqueueRequest(
            self.text(spec.get("queue", "")),
            self.text(spec.get("job_type", "")),
            payload=(
                None
                if payload is None
                else sepp.Payload(payload["data"].encode(), payload["encoding"])
            ),
            idempotency_key=(
                None if "idempotency_key" not in spec else self.text(spec["idempotency_key"])
            ),
            priority=spec.get("priority"),
            max_attempts=spec.get("max_attempts"),
            custom=spec.get("custom"),
            trace_context=(
                None
                if "traceparent" not in spec
                else sepp.TraceContext(spec["traceparent"], spec.get("tracestate"))
            ),
            scheduled_at=(
                None
                if scheduled is None
                else datetime.now(timezone.utc) + timedelta(milliseconds=scheduled)
            ),
        )
        name = spec.get("as")
        return request, None if name is None else self.text(name)

    async def step(self, kind: str, arg: Any) -> Any:
        if kind == "enqueue":
            request, name = self.request(arg)
            try:
                ack = await self.client.enqueue(request)
            except sepp.JobRejectedError as e:
                return {"rejected": rejection(e.rejection)}
            if name is not None:
                self.jobs[name] = ack.job_id
            return {"accepted": True, "deduplicated": ack.deduplicated}
        if kind == "enqueue_batch":
            pairs = [self.request(spec) for spec in arg]
            results = await self.client.enqueue_batch([r for r, _ in pairs])
            record = []
            for result, (_, name) in zip(results, pairs):
                if isinstance(result, sepp.Rejection):
                    record.append({"rejected": rejection(result)})
                else:
                    if name is not None:
                        self.jobs[name] = result.job_id
                    record.append({"accepted": True, "deduplicated": result.deduplicated})
            return record
        if kind == "enqueue_atomic":
            try:
                acks = await self.client.enqueue_atomic([self.request(s)[0] for s in arg])
            except sepp.JobRejectedError as e:
                return {
                    "rejected": [
                        {"index": i, "rejection": rejection(r)} for i, r in e.failures
                    ]
                }
            return {"committed": len(acks)}
        if kind == "start_worker":
            self.start_worker(arg)
            return None
        if kind == "wait_started":
            await wait_until(lambda: _ready(self.started >= int(arg)), "handlers to start")
            return None
        if kind == "wait_jobs":
            for name, state in arg.items():
                job_id = self.jobs[name]

                async def there(job_id: str = job_id, state: str = state) -> bool:
                    return reached((await self.client.get_job(job_id)).state, state)

                await wait_until(there, f"job {name!r} to be {state}")
            return None
        if kind == "stop_worker":
            assert self.worker is not None and self.running is not None
            self.stopping.set()
            self.worker.stop()
            report = await self.running
            self.worker = self.running = None
            return {
                "acked": report.acked,
                "nacked": report.nacked,
                "lease_lost": report.lease_lost,
                "abandoned": report.abandoned,
            }
        if kind == "restart_server":
            print("restart-server", flush=True)
            line = await asyncio.to_thread(sys.stdin.readline)
            if line.strip() != "restarted":
                raise RuntimeError(f"expected `restarted`, got {line!r}")
            return None
        if kind == "jobs":
            record = {}
            for name in arg:
                info = await self.client.get_job(self.jobs[name])
                record[name] = {
                    "state": info.state,
                    "attempt": info.attempt,
                    "dead_letter_cause": info.dead_letter_cause,
                    "last_reason": info.last_reason,
                }
            return record
        if kind == "carried":
            record = {}
            for name in arg:
                info = await self.client.get_job(self.jobs[name])
                payload, trace = info.payload, info.trace_context
                record[name] = {
                    "payload": (
                        None
                        if payload is None
                        else {"encoding": payload.encoding, "data_hex": payload.data.hex()}
                    ),
                    "custom": info.custom,
                    "trace_context": (
                        None
                        if trace is None
                        else {"traceparent": trace.traceparent, "tracestate": trace.tracestate}
                    ),
                }
            return record
        if kind == "dead_letters":
            page = await self.client.list_dead_letters(self.text(arg), page_size=100)
            records = [
                {
                    "job_type": r.job.job_type,
                    "cause": r.cause,
                    "final_attempt": r.final_attempt,
                    "last_reason": r.last_reason,
                }
                for r in page.records
            ]
            return sorted(records, key=lambda r: json.dumps(r["job_type"]))
        if kind == "queue_stats":
            s = await self.client.get_queue_stats(self.text(arg))
            return {
                "ready": s.ready,
                "scheduled": s.scheduled,
                "in_flight": s.in_flight,
                "dead_lettered": s.dead_lettered,
            }
        raise ValueError(f"unknown step {kind!r}")

    def start_worker(self, spec: dict[str, Any]) -> None:
        def ms(key: str) -> Optional[timedelta]:
            return None if key not in spec else timedelta(milliseconds=spec[key])

        options: dict[str, Any] = {
            "wait_timeout": ms("wait_timeout_ms") or timedelta(milliseconds=500),
            "handle_signals": False,
        }
        for key, name in [
            ("lease_duration_ms", "lease_duration"),
            ("shutdown_timeout_ms", "shutdown_timeout"),
            ("handler_timeout_ms", "handler_timeout"),
        ]:
            if key in spec:
                options[name] = ms(key)
        if "auto_extend" in spec:
            options["auto_extend"] = spec["auto_extend"]
        if "max_in_flight" in spec:
            options["max_in_flight"] = spec["max_in_flight"]
        worker = sepp.Worker(self.client, [self.text(q) for q in spec["queues"]], **options)
        for job_type, behaviour in spec["handlers"].items():
            worker.handle(job_type, self.handler(behaviour))
        self.stopping = asyncio.Event()
        self.started = 0
        self.worker = worker
        self.running = asyncio.ensure_future(worker.run())

    def handler(self, behaviour: Any) -> sepp.Handler:
        async def handle(ctx: sepp.JobContext) -> None:
            self.started += 1
            if behaviour == "ack":
                return
            if behaviour == "hang":
                await asyncio.Event().wait()  # cancelled when the engine lets go
            if behaviour == "finish_on_stop":
                await self.stopping.wait()
                return
            [(kind, arg)] = behaviour.items()
            if kind == "retry":
                raise sepp.HandlerError.retry(arg)
            if kind == "retry_after":
                raise sepp.HandlerError.retry_after(timedelta(milliseconds=arg[0]), arg[1])
            if kind == "permanent":
                raise sepp.HandlerError.permanent(arg)
            if kind == "raise":
                raise RuntimeError(arg)
            raise ValueError(f"unknown behaviour {behaviour!r}")

        return handle


async def _ready(value: bool) -> bool:
    return value


async def wait_until(check: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def reached(state: str, wanted: str) -> bool:
    return state in ("UNKNOWN", "ACKED") if wanted == "gone" else state == wanted


def rejection(r: sepp.Rejection) -> dict[str, Any]:
    fields = {
        key: getattr(r, key)
        for key in ("queue", "limit", "actual", "encoding", "allowed", "job_type", "key")
        if getattr(r, key) is not None
    }
    return {"code": r.code, "message": r.message, "fields": fields}


async def main(url: str, scenarios: str, out: str, run: str) -> None:
    with open(scenarios) as f:
        script = json.load(f)
    async with await sepp.SeppClient.connect(url) as client:
        runner = Runner(client, run)
        results = []
        for scenario in script["scenarios"]:
            records = []
            for step in scenario["steps"]:
                [(kind, arg)] = step.items()
                record = await runner.step(kind, arg)
                if record is not None:
                    records.append({"step": kind, "record": record})
            results.append({"name": scenario["name"], "records": records})
    with open(out, "w") as f:
        json.dump({"scenarios": results}, f, indent=2)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
