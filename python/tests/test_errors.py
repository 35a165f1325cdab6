"""Errors: a class for every code of the core, and each error the server or client can raise."""

from __future__ import annotations

import asyncio
import socket
import types
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

import sepp
import sepp.errors
from sepp import EnqueueRequest, Payload

from conftest import Server

LEASE = timedelta(seconds=30)

REJECTION_CODES = {
    "UNKNOWN_QUEUE",
    "PAYLOAD_TOO_LARGE",
    "ENCODING_NOT_ALLOWED",
    "JOB_TYPE_NOT_ALLOWED",
    "CUSTOM_ENTRIES_TOO_MANY",
    "CUSTOM_MAP_TOO_LARGE",
    "CUSTOM_KEY_TOO_LONG",
    "QUEUE_NAME_TOO_LONG",
    "JOB_TYPE_NAME_TOO_LONG",
    "IDEMPOTENCY_KEY_TOO_LONG",
    "SCHEDULED_TOO_FAR",
    "INVALID_REQUEST",
    "QUEUE_FULL",
    "QUEUE_CLOSING",
    "IDEMPOTENCY_KEY_CONFLICT",
    "TOO_MANY_QUEUES",
    "UNKNOWN_REJECTION",
}


# --- one class per code -----------------------------------------------------------------------


def test_every_code_of_the_core_has_an_exported_class() -> None:
    assert len(sepp.ERROR_CODES) == len(set(sepp.ERROR_CODES)) >= 25
    for code in sepp.ERROR_CODES:
        cls = sepp.errors.error_class(code)
        assert cls is not None, f"no exception class for {code}"
        assert issubclass(cls, sepp.SeppError)
        assert cls.code == code
        assert getattr(sepp, cls.__name__) is cls, f"{cls.__name__} is not exported by sepp"
        assert cls.__name__ in sepp.errors.__all__
        assert cls.__doc__


def test_every_class_is_named_for_its_code_as_the_core_s_table_says() -> None:
    assert set(sepp.ERROR_CLASS_NAMES) == set(sepp.ERROR_CODES)
    for code, name in sepp.ERROR_CLASS_NAMES.items():
        pascal = "".join(word.capitalize() for word in code.split("_"))
        assert name == f"{pascal}Error"
        cls = getattr(sepp.errors, name)
        assert cls.__name__ == name
        assert cls.code == code
        assert sepp.errors.error_class(code) is cls


def test_the_names_of_earlier_releases_are_deprecated_aliases() -> None:
    for old, new in [
        ("JobNotInFlight", sepp.JobNotInFlightError),
        ("QueueFull", sepp.QueueFullError),
        ("InvalidRequest", sepp.InvalidRequestError),
    ]:
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new.__name__}"):
            assert getattr(sepp.errors, old) is new
        with pytest.warns(DeprecationWarning):
            assert getattr(sepp, old) is new
    with pytest.raises(AttributeError):
        getattr(sepp, "NoSuchError")


def test_rejections_are_job_rejected_errors_and_the_rest_are_not() -> None:
    assert REJECTION_CODES <= set(sepp.ERROR_CODES)
    for code in sepp.ERROR_CODES:
        cls = sepp.errors.error_class(code)
        assert cls is not None
        assert issubclass(cls, sepp.JobRejectedError) == (code in REJECTION_CODES), code


def test_an_unknown_code_has_no_class() -> None:
    assert sepp.errors.error_class("NOT_A_CODE") is None


@pytest.mark.parametrize("code", sorted(set(sepp.ERROR_CODES) - REJECTION_CODES))
def test_each_call_failure_code_builds_its_class(code: str) -> None:
    # Also covers the codes this server cannot be made to send (OVERLOADED, SERVER_FAULT, ...).
    e = sepp.errors._from_native(code, "boom", code in {"TRANSPORT", "OVERLOADED"}, 14, "j", None)
    assert type(e) is sepp.errors.error_class(code)
    assert (e.code, e.message, str(e), e.grpc_code) == (code, "boom", "boom", 14)
    assert e.retryable == (code in {"TRANSPORT", "OVERLOADED"})


@pytest.mark.parametrize("code", sorted(REJECTION_CODES))
def test_each_rejection_code_builds_its_class(code: str) -> None:
    rejection: Any = types.SimpleNamespace(code=code, message="no", transient=False)
    e = sepp.errors._from_native(code, "no", False, None, None, [(3, rejection)])
    assert type(e) is sepp.errors.error_class(code)
    assert isinstance(e, sepp.JobRejectedError)
    assert (e.code, e.index, e.rejection, e.failures) == (code, 3, rejection, [(3, rejection)])


def test_an_unknown_code_from_the_core_still_raises_a_sepp_error() -> None:
    e = sepp.errors._from_native("SOMETHING_NEW", "later", False, None, None, None)
    assert type(e) is sepp.SeppError and e.code == "SOMETHING_NEW"


def test_a_missing_field_is_an_attribute_error() -> None:
    rejection: Any = types.SimpleNamespace(code="PAYLOAD_TOO_LARGE", message="m", transient=False)
    rejection.limit = None
    e = sepp.JobRejectedError.for_rejection(rejection)
    assert isinstance(e, sepp.PayloadTooLargeError)
    with pytest.raises(AttributeError):
        _ = e.limit


# --- client-side: before any network call -----------------------------------------------------


async def test_a_too_long_key_is_refused_before_anything_is_sent(
    launch: Callable[[str], Server],
) -> None:
    server = launch("[limits]\nmax_idempotency_key_bytes = 16")
    client = await sepp.SeppClient.connect(server.url)
    assert client.max_idempotency_key_bytes == 16
    server.stop()  # from here on, anything that needs the network fails with TransportError

    with pytest.raises(sepp.IdempotencyKeyTooLongError) as caught:
        await client.enqueue(EnqueueRequest("q", "t", idempotency_key="é" * 9))
    e = caught.value
    assert (e.limit, e.actual, e.code, e.grpc_code) == (16, 18, "IDEMPOTENCY_KEY_TOO_LONG", None)
    assert "16" in str(e) and "18" in str(e)
    assert isinstance(e, sepp.JobRejectedError) and not e.retryable
    assert e.rejection.code == "IDEMPOTENCY_KEY_TOO_LONG"

    with pytest.raises(sepp.TransportError):
        await client.enqueue(EnqueueRequest("q", "t", idempotency_key="k" * 16))
    await client.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"queue": ""}, "queue"),
        ({"job_type": ""}, "job_type"),
        ({"priority": 10}, "priority"),
        ({"priority": -1}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"payload": Payload(b"", "text/plain")}, "payload.data"),
        ({"payload": Payload(b"x", "")}, "payload.encoding"),
        ({"custom": {"": 1}}, "custom"),
        ({"custom": {"big": 2**64}}, "custom"),
        ({"trace_context": sepp.TraceContext("")}, "traceparent"),
        ({"scheduled_at": datetime(2030, 1, 1)}, "scheduled_at"),
    ],
)
async def test_an_invalid_value_is_rejected_when_sent_and_in_its_slot_of_a_batch(
    client: sepp.SeppClient, kwargs: dict[str, Any], field: str
) -> None:
    # As in Node: building the request checks only types; the values are checked when it is
    # sent, and a bad job in a batch is a rejection in its slot, not a raise.
    args = {"queue": "q", "job_type": "t", **kwargs}
    bad = EnqueueRequest(args.pop("queue"), args.pop("job_type"), **args)
    with pytest.raises(sepp.InvalidRequestError, match=field) as caught:
        await client.enqueue(bad)
    assert caught.value.code == "INVALID_REQUEST"
    assert isinstance(caught.value, ValueError)
    good, rejected = await client.enqueue_batch([EnqueueRequest("q", "t"), bad])
    assert isinstance(good, sepp.EnqueueAck)
    assert isinstance(rejected, sepp.Rejection)
    assert (rejected.code, rejected.message) == ("INVALID_REQUEST", str(caught.value))
    with pytest.raises(sepp.InvalidRequestError) as atomic:
        await client.enqueue_atomic([EnqueueRequest("q", "t"), bad])
    assert atomic.value.index == 1


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: EnqueueRequest(1, "t"), "queue"),
        (lambda: EnqueueRequest("q", None), "job_type"),
        (lambda: EnqueueRequest("q", "t", payload=b"x"), "payload"),
        (lambda: EnqueueRequest("q", "t", idempotency_key=5), "idempotency_key"),
        (lambda: EnqueueRequest("q", "t", priority="1"), "priority"),
        (lambda: EnqueueRequest("q", "t", priority=True), "priority"),
        (lambda: EnqueueRequest("q", "t", max_attempts=2.0), "max_attempts"),
        (lambda: EnqueueRequest("q", "t", custom=[("a", 1)]), "custom"),
        (lambda: EnqueueRequest("q", "t", custom={1: "a"}), "custom"),
        (lambda: EnqueueRequest("q", "t", custom={"a": [1]}), "custom"),
        (lambda: EnqueueRequest("q", "t", custom={"a": None}), "custom"),
        (lambda: EnqueueRequest("q", "t", trace_context="00-ab"), "trace_context"),
        (lambda: EnqueueRequest("q", "t", scheduled_at="2030-01-01"), "scheduled_at"),
        (lambda: Payload("text", "text/plain"), "data"),
        (lambda: Payload(b"x", 1), "encoding"),
        (lambda: sepp.NackRetry.delay(5), "delay"),
        (lambda: sepp.RetryPolicy(first_retry_delay=0.1), "first_retry_delay"),
        (lambda: sepp.TlsOptions(ca_pem=1), "ca_pem"),
    ],
)
def test_a_wrong_type_raises_type_error_naming_the_argument(
    make: Callable[[], object], argument: str
) -> None:
    with pytest.raises(TypeError, match=argument):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EnqueueRequest(1, "t"), "queue must be str, not int"),
        (lambda: EnqueueRequest("q", None), "job_type must be str, not NoneType"),
        (lambda: EnqueueRequest("q", "t", idempotency_key=5), "idempotency_key must be str, not int"),
    ],
)
def test_a_request_string_of_the_wrong_type_is_named_in_the_message(
    make: Callable[[], object], message: str
) -> None:
    # In the message itself, not only in a note (which str() and logs of str(e) leave out).
    with pytest.raises(TypeError) as caught:
        make()
    assert str(caught.value) == message


async def test_wrong_call_argument_types_raise_type_error_naming_them(
    client: sepp.SeppClient,
) -> None:
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: client.enqueue("q"), "request"),
        (lambda: client.enqueue_batch([EnqueueRequest("q", "t"), "x"]), "requests"),
        (lambda: client.reserve("q", lease_duration=LEASE), "queues"),
        (lambda: client.reserve(["q"], lease_duration=30), "lease_duration"),
        (lambda: client.reserve(["q"], lease_duration=LEASE, wait_timeout=1.5), "wait_timeout"),
        (lambda: client.reserve(["q"], lease_duration=LEASE, max_jobs="2"), "max_jobs"),
        (lambda: client.ack(7, 1), "job_id"),
        (lambda: client.ack("j", "1"), "attempt"),
        (lambda: client.nack("j", 1, retry="later"), "retry"),
        (lambda: client.extend("j", 1, 30), "lease_duration"),
        (lambda: client.drain_dead_letters(5), "queue"),
    ]
    for call, argument in calls:
        with pytest.raises(TypeError, match=argument):
            call()


async def test_a_single_name_where_a_list_is_expected_says_how_to_write_one(
    client: sepp.SeppClient,
) -> None:
    # A str is a sequence of one-letter names to Python; the message says what to write.
    with pytest.raises(TypeError) as caught:
        client.reserve("emails", lease_duration=LEASE)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "queues must be a list of str, not a str: for one, write ['emails']"
    )
    with pytest.raises(TypeError) as caught:
        client.reserve(["emails", 3], lease_duration=LEASE)  # type: ignore[list-item]
    assert str(caught.value) == "queues must be a list of str, not list"
    with pytest.raises(TypeError, match=r"job_ids.*write \['a'\]"):
        await client.delete_dead_letters("a")  # type: ignore[arg-type]


async def test_an_argument_of_the_wrong_class_is_named_with_the_class_to_pass(
    client: sepp.SeppClient,
) -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (
            lambda: EnqueueRequest("q", "t", payload="hello"),  # type: ignore[arg-type]
            "payload must be a sepp.Payload, not str",
        ),
        (
            lambda: EnqueueRequest("q", "t", trace_context={}),  # type: ignore[arg-type]
            "trace_context must be a sepp.TraceContext, not dict",
        ),
        (
            lambda: client.enqueue("q"),  # type: ignore[arg-type]
            "request must be a sepp.EnqueueRequest, not str",
        ),
        (
            lambda: client.enqueue_batch(EnqueueRequest("q", "t")),  # type: ignore[arg-type]
            "requests must be a list of sepp.EnqueueRequest, not EnqueueRequest",
        ),
        (
            lambda: client.enqueue_atomic([EnqueueRequest("q", "t"), {"queue": "q"}]),  # type: ignore[list-item]
            "requests[1] must be a sepp.EnqueueRequest, not dict",
        ),
        (
            lambda: client.nack("j", 1, retry=5),  # type: ignore[arg-type]
            "retry must be a sepp.NackRetry, not int",
        ),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as caught:
            call()
        assert str(caught.value) == message
    with pytest.raises(TypeError) as caught:
        await sepp.SeppClient.connect("http://127.0.0.1:1", tls="yes")  # type: ignore[arg-type]
    assert str(caught.value) == "tls must be a sepp.TlsOptions, not str"


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.reserve([], lease_duration=LEASE), "queues"),
        (lambda c: c.reserve([""], lease_duration=LEASE), "queues"),
        (lambda c: c.reserve(["q"], lease_duration=timedelta(0)), "lease_duration"),
        (lambda c: c.reserve(["q"], lease_duration=timedelta(seconds=-1)), "lease_duration"),
        (
            lambda c: c.reserve(["q"], lease_duration=LEASE, wait_timeout=timedelta(seconds=-1)),
            "wait_timeout",
        ),
        (lambda c: c.reserve(["q"], lease_duration=LEASE, max_jobs=0), "max_jobs"),
        (lambda c: c.reserve(["q"], lease_duration=LEASE, max_jobs=-2), "max_jobs"),
        (lambda c: c.enqueue_batch([]), "jobs is empty"),
        (lambda c: c.enqueue_atomic([]), "jobs is empty"),
        (lambda c: c.ack("j", -1), "attempt"),
        (lambda c: c.extend("j", 1, timedelta(0)), "lease_duration"),
        (lambda c: c.drain_dead_letters(max=0), "max"),
        (lambda c: c.drain_dead_letters(max=-1), "max"),
    ],
)
async def test_an_invalid_call_argument_raises_invalid_argument(
    client: sepp.SeppClient, call: Callable[[sepp.SeppClient], Any], field: str
) -> None:
    with pytest.raises(sepp.InvalidArgumentError, match=field) as caught:
        await call(client)
    assert caught.value.code == "INVALID_ARGUMENT"
    assert isinstance(caught.value, ValueError)


def test_a_negative_nack_delay_is_invalid() -> None:
    with pytest.raises(sepp.InvalidArgumentError, match="delay"):
        sepp.NackRetry.delay(timedelta(seconds=-1))


# --- connection errors ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_an_unreachable_server_raises_transport_error() -> None:
    with pytest.raises(sepp.TransportError) as caught:
        await sepp.SeppClient.connect(f"127.0.0.1:{free_port()}")
    assert caught.value.retryable and caught.value.code == "TRANSPORT"


async def test_calls_cut_off_by_a_killed_server_raise_transport_error(
    launch: Callable[[str], Server],
) -> None:
    s = launch("")
    client = await sepp.SeppClient.connect(s.url, retry_policy=None)
    done = 0

    async def produce(p: int) -> BaseException:
        nonlocal done
        for i in range(100_000):
            try:
                await client.enqueue(
                    EnqueueRequest(
                        "cut",
                        "t",
                        payload=Payload(b"x" * 4096, "application/octet-stream"),
                        idempotency_key=f"p{p}-{i}",
                    )
                )
            except sepp.SeppError as e:
                return e
            done += 1
        raise AssertionError("the server never went away")

    tasks = [asyncio.create_task(produce(p)) for p in range(16)]
    while done < 300:
        await asyncio.sleep(0.005)
    s.proc.kill()  # SIGKILL while 16 calls are on the wire
    for err in await asyncio.gather(*tasks):
        assert isinstance(err, sepp.TransportError), repr(err)
        assert err.retryable and err.code == "TRANSPORT"


@pytest.mark.parametrize(
    "connect",
    [
        lambda url: sepp.SeppClient.connect("ftp://127.0.0.1:1"),
        lambda url: sepp.SeppClient.connect(""),
        lambda url: sepp.SeppClient.connect(url, api_key="two\nlines"),
    ],
)
async def test_unusable_settings_raise_invalid_config(
    server: Server, connect: Callable[[str], Any]
) -> None:
    with pytest.raises(sepp.InvalidConfigError) as caught:
        await connect(server.url)
    assert caught.value.code == "INVALID_CONFIG"


def test_unusable_setting_values_raise_invalid_config() -> None:
    with pytest.raises(sepp.InvalidConfigError, match="rpc_timeout"):
        sepp.SeppClient.connect("h:1", rpc_timeout=timedelta(seconds=-1))
    with pytest.raises(sepp.InvalidConfigError, match="max_retries"):
        sepp.RetryPolicy(max_retries=-1)
    with pytest.warns(DeprecationWarning), pytest.raises(sepp.InvalidConfigError, match="not both"):
        sepp.RetryPolicy(max_retries=1, max_attempts=2)


def test_a_retry_policy_takes_the_names_of_earlier_releases_with_a_warning() -> None:
    assert sepp.RetryPolicy().max_retries == 2
    with pytest.warns(DeprecationWarning) as warned:
        policy = sepp.RetryPolicy(max_attempts=5, initial_backoff=timedelta(milliseconds=20))
    assert [str(w.message) for w in warned] == [
        "RetryPolicy.max_attempts is deprecated: use max_retries",
        "RetryPolicy.initial_backoff is deprecated: use first_retry_delay",
    ]
    assert policy == sepp.RetryPolicy(max_retries=4, first_retry_delay=timedelta(milliseconds=20))
    with pytest.warns(DeprecationWarning):
        assert policy.max_attempts == 5


async def test_a_missing_or_wrong_api_key_raises_unauthenticated(auth_server: Server) -> None:
    with pytest.raises(sepp.UnauthenticatedError) as caught:
        await sepp.SeppClient.connect(auth_server.url)
    assert caught.value.code == "UNAUTHENTICATED" and not caught.value.retryable
    with pytest.raises(sepp.UnauthenticatedError):
        await sepp.SeppClient.connect(auth_server.url, api_key="guess")
    with pytest.raises(TypeError, match="^api_key must be str, not int$"):
        await sepp.SeppClient.connect(auth_server.url, api_key=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^coalesce must be bool, not str$"):
        await sepp.SeppClient.connect(auth_server.url, coalesce="no")  # type: ignore[arg-type]

    async with await sepp.SeppClient.connect(auth_server.url, api_key="secret") as client:
        ack = await client.enqueue(EnqueueRequest("q", "t"))
        assert not ack.deduplicated


# --- server-side rejections and failures ------------------------------------------------------


async def test_the_server_checks_the_queue_name_shape(client: sepp.SeppClient) -> None:
    with pytest.raises(sepp.InvalidRequestError, match="queue") as caught:
        await client.enqueue(EnqueueRequest("a/b", "t"))
    assert caught.value.rejection.code == "INVALID_REQUEST"


async def test_names_over_the_limits_are_rejected(client: sepp.SeppClient) -> None:
    with pytest.raises(sepp.QueueNameTooLongError) as q:
        await client.enqueue(EnqueueRequest("q" * 513, "t"))
    assert (q.value.limit, q.value.actual) == (512, 513)
    with pytest.raises(sepp.JobTypeNameTooLongError) as t:
        await client.enqueue(EnqueueRequest("q", "t" * 257))
    assert (t.value.limit, t.value.actual) == (256, 257)


async def test_the_queue_restrictions_are_rejections_with_their_fields(
    client: sepp.SeppClient,
) -> None:
    json = "application/json"
    with pytest.raises(sepp.JobTypeNotAllowedError) as jt:
        await client.enqueue(EnqueueRequest("limited", "other"))
    assert (jt.value.job_type, jt.value.allowed) == ("other", ["ok"])

    with pytest.raises(sepp.PayloadTooLargeError) as big:
        await client.enqueue(EnqueueRequest("limited", "ok", payload=Payload(b"123456789", json)))
    assert (big.value.limit, big.value.actual) == (8, 9)

    with pytest.raises(sepp.EncodingNotAllowedError) as enc:
        await client.enqueue(EnqueueRequest("limited", "ok", payload=Payload(b"1", "text/plain")))
    assert (enc.value.encoding, enc.value.allowed) == ("text/plain", [json])

    with pytest.raises(sepp.CustomEntriesTooManyError) as many:
        await client.enqueue(EnqueueRequest("limited", "ok", custom={"a": 1, "b": 2, "c": 3}))
    assert (many.value.limit, many.value.actual) == (2, 3)

    with pytest.raises(sepp.CustomKeyTooLongError) as key:
        await client.enqueue(EnqueueRequest("limited", "ok", custom={"ninechars": 1}))
    assert (key.value.key, key.value.limit, key.value.actual) == ("ninechars", 8, 9)

    with pytest.raises(sepp.CustomMapTooLargeError) as total:
        await client.enqueue(EnqueueRequest("limited", "ok", custom={"a": "x" * 40}))
    assert total.value.limit == 24 and total.value.actual > 24

    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with pytest.raises(sepp.ScheduledTooFarError) as far:
        await client.enqueue(EnqueueRequest("limited", "ok", scheduled_at=later))
    assert far.value.horizon == timedelta(minutes=1)
    assert abs(far.value.scheduled_at - later) < timedelta(milliseconds=1)

    for e in (jt, big, enc, many, key, total, far):
        assert isinstance(e.value, sepp.JobRejectedError)
        assert e.value.retryable is False and e.value.grpc_code is None


async def test_a_full_queue_is_a_transient_rejection(client: sepp.SeppClient) -> None:
    # "one-deep" holds one job; only this test uses it.
    await client.enqueue(EnqueueRequest("one-deep", "t"))
    with pytest.raises(sepp.QueueFullError) as caught:
        await client.enqueue(EnqueueRequest("one-deep", "t"))
    e = caught.value
    assert (e.queue, e.limit, e.retryable, e.rejection.transient) == ("one-deep", 1, True, True)


async def test_strict_mode_rejects_undeclared_queues(strict_server: Server) -> None:
    async with await sepp.SeppClient.connect(strict_server.url) as client:
        with pytest.raises(sepp.UnknownQueueError) as caught:
            await client.enqueue(EnqueueRequest("undeclared", "t"))
        assert caught.value.queue == "undeclared"
        with pytest.raises(sepp.FailedPreconditionError) as reserve:
            await client.reserve(["declared", "undeclared"], lease_duration=LEASE)
        assert reserve.value.code == "FAILED_PRECONDITION"
        assert await client.reserve(["declared"], lease_duration=LEASE) == []


async def test_the_server_refuses_too_many_queues_in_reserve(client: sepp.SeppClient) -> None:
    queues = [f"q{i}" for i in range(33)]
    with pytest.raises(sepp.InvalidArgumentError) as caught:
        await client.reserve(queues, lease_duration=LEASE)
    assert caught.value.grpc_code == 3  # INVALID_ARGUMENT, from the server


# --- closing --------------------------------------------------------------------------------


async def test_a_closed_client_raises_runtime_error(server: Server) -> None:
    async with await sepp.SeppClient.connect(server.url) as client:
        assert not client.closed
    assert client.closed
    with pytest.raises(RuntimeError, match="closed"):
        client.enqueue(EnqueueRequest("q", "t"))
    with pytest.raises(RuntimeError, match="closed"):
        async with client:
            pass
    await client.close()  # closing twice is harmless
    assert repr(client) == "<SeppClient closed>"
