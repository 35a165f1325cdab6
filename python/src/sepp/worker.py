"""Workers: async handlers run on jobs leased from sepp queues.

A `Worker` only runs handlers. The core's worker engine (the same as under the Rust and Node
workers) does everything else: it reserves jobs in batches sized to the free slots, extends
their leases while they are held, backs off while the server is unreachable, nacks the jobs of
a type without a handler, frees the slot of a lost lease without a call (the server's lease
expiry decides), nacks a job whose handler runs past `handler_timeout`, gives running handlers
`shutdown_timeout` at shutdown and nacks the rest, and counts it all. The worker runs each
job's handler as an asyncio task on the loop that called `Worker.run`, and reports the way it
ended as an outcome:

- it returns: the job is acked;
- it raises `HandlerError.retry()`: nacked, retried per the queue's policy (dead-lettered on
  the last attempt); `HandlerError.retry_after(delay)`: retried after `delay`;
  `HandlerError.permanent()`: dead-lettered at once;
- it raises anything else: nacked with the queue's policy, the exception's message as the
  reason, and the worker goes on.

When the engine lets go of a job first (its lease is lost, its handler ran past
`handler_timeout`, or the shutdown grace period ended), the handler is cancelled.

`await worker.run()` runs until `worker.stop()`, SIGTERM or SIGINT. It then stops reserving,
gives the running handlers `shutdown_timeout` to finish, cancels the rest and nacks their jobs.

Example::

    import asyncio
    from datetime import timedelta

    import sepp


    async def main() -> None:
        async with await sepp.SeppClient.connect("http://127.0.0.1:50051") as client:
            worker = sepp.Worker(client, ["emails"], max_in_flight=20)

            @worker.handler("receipt")
            async def send_receipt(ctx: sepp.JobContext) -> None:
                if ctx.job.payload is None:
                    raise sepp.HandlerError.permanent("no order in the payload")
                ...  # send it; an exception means "retry later"

            report = await worker.run()  # until SIGTERM or Ctrl-C
            print(report)


    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
from datetime import datetime, timedelta
from typing import Any, Awaitable, Callable, Optional, Sequence, TypeVar, final

from sepp import _tracing
from sepp._native import Engine, EngineOptions, Job, Lease, Outcome, SeppClient, WorkerReport
from sepp.errors import SeppError

__all__ = ["Handler", "HandlerError", "JobContext", "Worker", "WorkerReport"]

_log = logging.getLogger("sepp.worker")


class HandlerError(Exception):
    """Raised by a handler to say why its job failed and what to do with it.

    Build one with `retry`, `retry_after` or `permanent`::

        raise HandlerError.retry_after(timedelta(minutes=5), "rate limited")

    Any other exception from a handler counts as `HandlerError.retry()` with the exception as
    the reason.

    Attributes:
        outcome: What the worker reports to the engine for the job.
    """

    outcome: Outcome

    def __init__(self, outcome: Outcome) -> None:
        """Wraps an outcome; prefer the constructors `retry`, `retry_after` and `permanent`.

        Args:
            outcome: A failure outcome (not `Outcome.success()`).

        Raises:
            TypeError: `outcome` is not an `Outcome`.
            ValueError: `outcome` is a success.
        """
        if not isinstance(outcome, Outcome):
            raise TypeError(
                f"outcome must be a sepp Outcome, not {type(outcome).__name__}: "
                "use HandlerError.retry(), .retry_after(delay) or .permanent()"
            )
        if outcome.kind == "success":
            raise ValueError("a HandlerError reports a failure: return from the handler to ack")
        super().__init__(outcome)
        self.outcome = outcome

    @classmethod
    def retry(cls, reason: Optional[str] = None) -> HandlerError:
        """Fails the job; it is retried per the queue's retry policy (`retry_delay_ms`,
        `retry_backoff`) and dead-lettered on its last attempt.

        Args:
            reason: Why, kept as the job's last reason.

        Returns:
            The exception to raise.
        """
        return cls(Outcome.retry(reason))

    @classmethod
    def retry_after(cls, delay: timedelta, reason: Optional[str] = None) -> HandlerError:
        """Fails the job; it is retried after `delay` and dead-lettered on its last attempt.

        Args:
            delay: The wait before the next delivery; 0 or more. The server clamps it to the
                queue's schedule horizon.
            reason: Why, kept as the job's last reason.

        Returns:
            The exception to raise.

        Raises:
            TypeError: `delay` is not a `timedelta`.
            InvalidArgumentError: `delay` is negative.
        """
        return cls(Outcome.retry_after(delay, reason))

    @classmethod
    def permanent(cls, reason: Optional[str] = None) -> HandlerError:
        """Fails the job for good: it is dead-lettered now, whatever attempts remain.

        Args:
            reason: Why, kept with the dead letter.

        Returns:
            The exception to raise.
        """
        return cls(Outcome.permanent(reason))

    @property
    def reason(self) -> Optional[str]:
        """The reason given, if any."""
        return self.outcome.reason

    def __str__(self) -> str:
        reason = self.outcome.reason or "no reason"
        if self.outcome.kind == "retry_after":
            return f"retry after {self.outcome.delay} ({reason})"
        if self.outcome.kind == "permanent":
            return f"permanent failure ({reason})"
        return f"retry ({reason})"

    def __repr__(self) -> str:
        return f"HandlerError({self.outcome!r})"


@final
class JobContext:
    """What a handler gets: the job and its lease."""

    __slots__ = ("_lease",)

    def __init__(self, lease: Lease) -> None:
        self._lease = lease

    @property
    def job(self) -> Job:
        """The job."""
        return self._lease.job

    @property
    def attempt(self) -> int:
        """Which delivery this is, from 1."""
        return self._lease.job.attempt

    @property
    def lease_expires_at(self) -> Optional[datetime]:
        """The lease's current expiry (aware, UTC), moved by each automatic extension."""
        return self._lease.expires_at

    @property
    def is_lease_lost(self) -> bool:
        """Whether the lease is known to be lost."""
        return self._lease.is_lost

    async def lease_lost(self) -> None:
        """Returns once the lease is known to be lost. The worker cancels the handler then
        too; this is for work running outside the handler's task."""
        await self._lease.lost()

    def __repr__(self) -> str:
        return f"JobContext({self.job!r})"


Handler = Callable[[JobContext], Awaitable[None]]
"""A job handler: an async function taking a `JobContext`. Returning acks the job."""

_H = TypeVar("_H", bound=Handler)


class Worker:
    """Processes jobs from sepp queues with async handlers registered per job type.

    Handlers run as asyncio tasks on the loop that runs `run`, at most `max_in_flight` at
    once. The Rust core reserves the jobs, extends their leases and settles them; see the
    module's documentation for how a handler's end becomes an ack or a nack.
    """

    def __init__(
        self,
        client: SeppClient,
        queues: Sequence[str],
        *,
        lease_duration: timedelta = timedelta(seconds=30),
        max_in_flight: int = 10,
        auto_extend: bool = True,
        wait_timeout: timedelta = timedelta(seconds=5),
        shutdown_timeout: timedelta = timedelta(seconds=30),
        handler_timeout: Optional[timedelta] = None,
        worker_id: Optional[str] = None,
        handle_signals: bool = True,
    ) -> None:
        """Creates a worker; it reserves nothing before `run`.

        Args:
            client: The client to reserve, extend and settle through. The worker does not
                close it.
            queues: The queues to take jobs from, in order of preference; at least one.
            lease_duration: The lease asked for per job; positive. The server clamps it to
                the queue's `max_lease_duration_ms`.
            max_in_flight: The most jobs held (and handlers running) at once; at least 1.
            auto_extend: Extend each lease when a third of it is left, for as long as its
                handler runs. Without it, a handler must finish within `lease_duration`: when
                the lease runs out, the handler is cancelled.
            wait_timeout: The long-poll wait of each reserve.
            shutdown_timeout: How long running handlers may go on once shutdown begins;
                then they are cancelled and their jobs nacked.
            handler_timeout: The longest a handler may run on one job; past it the handler
                is cancelled and the job nacked with the queue's retry policy and the reason
                ``the handler ran past handler_timeout (N ms)``. None: no limit.
            worker_id: A label sent with each reserve, shown by `SeppClient.get_job`.
            handle_signals: When `run` runs in the main thread, stop on SIGTERM and SIGINT
                (a second signal cancels the running handlers at once).

        Raises:
            TypeError: An argument has the wrong type.
            InvalidArgumentError: A negative duration or count, no queues, an empty queue
                name, a zero lease, a zero `max_in_flight` or a zero `handler_timeout`.
        """
        if not isinstance(client, SeppClient):
            raise TypeError(f"client must be a sepp.SeppClient, not {type(client).__name__}")
        if isinstance(queues, (str, bytes)):
            raise TypeError(
                f"queues must be a list of queue names, not {type(queues).__name__}: "
                f"write [{queues!r}]"
            )
        if not isinstance(handle_signals, bool):
            raise TypeError(f"handle_signals must be bool, not {type(handle_signals).__name__}")
        self._client = client
        self._settings: dict[str, Any] = dict(
            lease_duration=lease_duration,
            max_in_flight=max_in_flight,
            auto_extend=auto_extend,
            wait_timeout=wait_timeout,
            worker_id=worker_id,
            handler_timeout=handler_timeout,
            shutdown_timeout=shutdown_timeout,
        )
        # Converted (and their types and signs checked) now; the job types are added by `run`.
        self._options = EngineOptions(queues, **self._settings)
        self._handle_signals = handle_signals
        self._handlers: dict[str, Handler] = {}
        self._fallback: Optional[Handler] = None
        # Set while `run` runs; `stop` reaches the run through them, from any thread.
        self._run: Optional[_Run] = None
        self._stop_requested = False

    @property
    def queues(self) -> list[str]:
        """The queues, in order of preference."""
        return self._options.queues

    @property
    def running(self) -> bool:
        """Whether `run` is running."""
        return self._run is not None

    def handle(self, job_type: str, handler: _H) -> _H:
        """Registers `handler` for the jobs of `job_type`.

        Args:
            job_type: The job type, as enqueued.
            handler: An async function taking a `JobContext`.

        Returns:
            `handler`, unchanged.

        Raises:
            TypeError: `job_type` is not a `str`, or `handler` is not callable.
            ValueError: `job_type` already has a handler.
        """
        if not isinstance(job_type, str):
            raise TypeError(f"job_type must be str, not {type(job_type).__name__}")
        _check_callable(handler)
        if job_type in self._handlers:
            raise ValueError(f"job type {job_type!r} already has a handler")
        self._handlers[job_type] = handler
        return handler

    def handler(self, job_type: str) -> Callable[[_H], _H]:
        """Registers the decorated function for the jobs of `job_type`::

            @worker.handler("receipt")
            async def send_receipt(ctx: sepp.JobContext) -> None: ...

        Args:
            job_type: The job type, as enqueued.

        Returns:
            The decorator; it returns the function unchanged.

        Raises:
            TypeError: `job_type` is not a `str` (the decorator: the function is not callable).
            ValueError: `job_type` already has a handler (raised by the decorator).
        """
        if not isinstance(job_type, str):
            raise TypeError(f"job_type must be str, not {type(job_type).__name__}")

        def register(handler: _H) -> _H:
            return self.handle(job_type, handler)

        return register

    def fallback(self, handler: _H) -> _H:
        """Registers `handler` for every job type without a handler of its own. Usable as a
        decorator, ``@worker.fallback``. Without one, such jobs are nacked with the queue's
        retry policy (by the engine, never handed to a handler).

        Args:
            handler: An async function taking a `JobContext`.

        Returns:
            `handler`, unchanged.

        Raises:
            TypeError: `handler` is not callable.
            ValueError: A fallback is already registered.
        """
        _check_callable(handler)
        if self._fallback is not None:
            raise ValueError("a fallback handler is already registered")
        self._fallback = handler
        return handler

    async def run(self) -> WorkerReport:
        """Processes jobs until `stop` is called, or SIGTERM or SIGINT arrives (see
        `handle_signals`), then shuts down gracefully: stops reserving, lets the running
        handlers finish within `shutdown_timeout`, cancels the others and nacks their jobs
        with the queue's retry policy.

        Cancelling the task running `run` shuts down at once: the handlers are cancelled and
        their jobs nacked before the cancellation propagates.

        Returns:
            What was done.

        Raises:
            RuntimeError: The worker is already running, or the client is closed.
            InvalidArgumentError: No queues, a zero `lease_duration` or a zero
                `max_in_flight`.
            SeppError: The server refused to reserve for good (`UnauthenticatedError`,
                `PermissionDeniedError` for a key without the worker role,
                `FailedPreconditionError` for a queue strict mode does not know, ...): the
                worker stops reserving at once, lets the running handlers finish as in a
                stop, then raises it.
        """
        if self._run is not None:
            raise RuntimeError("this worker is already running")
        # The engine nacks the job types nobody handles (all are handled with a fallback).
        job_types = None if self._fallback is not None else list(self._handlers)
        options = EngineOptions(self._options.queues, job_types=job_types, **self._settings)
        if self._stop_requested:
            # No engine: it would lease jobs only to give them back, each at the cost of an
            # attempt.
            self._stop_requested = False
            return WorkerReport()
        engine = Engine.start(self._client, options)
        run = _Run(self, engine, asyncio.get_running_loop())
        self._run = run
        restore_signals = self._install_signal_handlers(run)
        try:
            try:
                await run.serve()
            except (asyncio.CancelledError, Exception):
                engine.end_grace_period()
                await run.finish()
                raise
            await run.finish()
            failure = engine.failure()
            if failure is not None:
                raise failure
            return engine.report
        finally:
            restore_signals()
            self._run = None
            self._stop_requested = False
            engine.shutdown()

    def stop(self) -> None:
        """Begins a graceful shutdown of `run` (see `run`); returns at once. Safe to call from
        any thread, and from a signal handler. Called before `run`, it makes the next `run`
        return at once, without reserving (a job leased only to be given back would spend an
        attempt)."""
        run = self._run
        if run is None:
            self._stop_requested = True
            return
        run.call(run.stopping.set)

    def _handler_for(self, job_type: str) -> Optional[Handler]:
        return self._handlers.get(job_type, self._fallback)

    def _install_signal_handlers(self, run: _Run) -> Callable[[], None]:
        """Stops on SIGTERM and SIGINT while `run` runs, when in the main thread; returns
        what puts the previous handlers back."""
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        installed: list[tuple[signal.Signals, Any]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            try:
                run.loop.add_signal_handler(sig, run.on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue  # no loop signal handlers here (Windows, a custom loop)
            installed.append((sig, previous))

        def restore() -> None:
            for sig, previous in installed:
                run.loop.remove_signal_handler(sig)
                if previous is not None:
                    signal.signal(sig, previous)

        return restore


def _check_callable(handler: object) -> None:
    if not callable(handler):
        raise TypeError(
            f"a handler must be an async function taking a JobContext, not {type(handler).__name__}"
        )


class _Run:
    """One run of a worker: its engine and the handler tasks.

    The tasks in `tasks` are owned by the run: each removes itself when done, and ends once its
    job has ended (settled, or let go by the engine, which cancels the handler). `next` is the
    pending `Engine.next_batch` call; it is never cancelled (a job it was handing over would
    stay held unprocessed until the drain): `Engine.shutdown` ends it instead.
    """

    def __init__(self, worker: Worker, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.worker = worker
        self.engine = engine
        self.loop = loop
        self.stopping = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.next: Optional[asyncio.Future[list[Lease]]] = None

    def call(self, fn: Callable[[], object]) -> None:
        """Runs `fn` on the run's loop: now if called from it, else soon."""
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            fn()
        else:
            self.loop.call_soon_threadsafe(fn)

    def on_signal(self, sig: signal.Signals) -> None:
        if not self.stopping.is_set():
            _log.info("received %s: stopping (a second signal cancels running handlers)", sig.name)
            self.stopping.set()
        else:
            _log.info("received %s again: cancelling running handlers", sig.name)
            self.engine.end_grace_period()

    async def serve(self) -> None:
        """Starts a handler task per job until stopped."""
        stop = asyncio.ensure_future(self.stopping.wait())
        batch = self.worker._options.max_in_flight
        try:
            while not self.stopping.is_set():
                if self.next is None:
                    self.next = asyncio.ensure_future(self.engine.next_batch(batch))
                waiting: set[asyncio.Future[Any]] = {self.next, stop}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if self.next.done():
                    leases = self.next.result()
                    self.next = None
                    if not leases:
                        break
                    for lease in leases:
                        self.start(lease)
        finally:
            stop.cancel()

    def start(self, lease: Lease) -> None:
        task = self.loop.create_task(self.process(lease))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def finish(self) -> None:
        """Shuts the engine down (the jobs a pending `next_batch` still hands over are
        processed like the others) and drains it: the running handlers get the engine's
        `shutdown_timeout`, the rest are cancelled as the engine nacks their jobs."""
        self.engine.shutdown()
        if self.next is not None:
            pending, self.next = self.next, None
            await asyncio.wait({pending})
            if not pending.cancelled() and pending.exception() is None:
                for lease in pending.result():
                    self.start(lease)
        notice = self.engine.stop_notice()
        if notice is not None:
            _log.warning("%s", notice)
        await self.engine.drain()
        if self.tasks:
            await asyncio.wait(set(self.tasks))

    async def process(self, lease: Lease) -> None:
        """Runs the job's handler and reports how it ended; cancels it when the engine lets
        go of the job first."""
        job = lease.job
        handler = self.worker._handler_for(job.job_type)
        if handler is None:
            return  # not handed out: the engine nacks the types without a handler
        work = self.loop.create_task(_traced_call(handler, lease))
        done = asyncio.ensure_future(lease.done())
        try:
            await asyncio.wait({work, done}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            done.cancel()
            await _cancel(work)
            raise
        if not work.done():
            # The engine let go first (lease lost, handler_timeout, shutdown) and did what the
            # job needs: stop the handler.
            _log.warning(
                "job %s (attempt %d) %s: cancelling its handler",
                job.id,
                job.attempt,
                done.result().replace("_", " "),
            )
            await _cancel(work)
            return
        done.cancel()
        try:
            await self.engine.settle(job.id, job.attempt, _outcome_of(work, job))
        except SeppError as e:  # counted by the engine; the job is left to the server
            _log.warning("job %s (attempt %d) could not be settled: %s", job.id, job.attempt, e)


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancels `task` and waits until it has unwound; an exception it raises on the way out is
    logged, not left unretrieved."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        _log.warning("a cancelled handler raised on its way out", exc_info=task.exception())


async def _traced_call(handler: Handler, lease: Lease) -> None:
    """Runs the handler inside the job's ``sepp.handle`` span (when OpenTelemetry is
    installed), which is current in the handler's task."""
    with _tracing.handler_span(lease):
        await _call(handler, JobContext(lease), lease.job.job_type)


async def _call(handler: Handler, ctx: JobContext, job_type: str) -> None:
    result = handler(ctx)
    if not inspect.isawaitable(result):
        raise TypeError(
            f"the handler of {job_type!r} returned {type(result).__name__}, not an awaitable: "
            "handlers must be async functions"
        )
    await result


def _outcome_of(work: asyncio.Task[None], job: Job) -> Outcome:
    """The outcome of a finished handler task."""
    if work.cancelled():
        return Outcome.retry("the handler was cancelled")
    error = work.exception()
    if error is None:
        return Outcome.success()
    if isinstance(error, HandlerError):
        return error.outcome
    _log.error(
        "handler of %r failed on job %s (attempt %d)",
        job.job_type,
        job.id,
        job.attempt,
        exc_info=error,
    )
    # The message, as in every language (the core cuts it to the server's max_reason_bytes).
    return Outcome.retry(str(error) or type(error).__name__)
