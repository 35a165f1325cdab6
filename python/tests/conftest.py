"""Fixtures: real `sepp` server processes and connected clients.

The server binary is `$SEPP_TEST_SERVER_BIN`, else `<target dir>/debug/sepp`, where the target dir
is `$CARGO_TARGET_DIR` or `<repo>/target`. Each server gets a temporary config with
`listen_addr` port 0 and a temporary `db_path`; its address is read from the one line it prints
on standard output, `sepp listening on ADDR`. A missing binary fails the suite.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sepp

REPO = Path(__file__).resolve().parents[2]
READY_PREFIX = "sepp listening on "
START_TIMEOUT_S = 30.0
# Every async test fails after this long instead of hanging the suite.
TEST_TIMEOUT_S = 60.0

# The main test server: one queue per restriction, so each rejection can be triggered.
MAIN_CONFIG = """
[storage]
dead_letter_retention_ms = 3600000

[[queues]]
name = "limited"
allowed_job_types = ["ok"]
max_payload_bytes = 8
allowed_encodings = ["application/json"]
max_custom_entries = 2
max_custom_key_bytes = 8
max_custom_total_bytes = 24
max_schedule_horizon_ms = 60000

[[queues]]
name = "one-deep"
max_queue_depth = 1

[[queues]]
name = "single-shot"
default_max_attempts = 1

[[queues]]
name = "debounced"
on_duplicate = "replace_pending"
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fn = getattr(item, "obj", None)
        if inspect.iscoroutinefunction(fn):
            item.obj = _with_timeout(fn)  # type: ignore[attr-defined]


def _with_timeout(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.wait_for(fn(*args, **kwargs), TEST_TIMEOUT_S)

    return run


def server_binary() -> Path:
    """The server executable to test against."""
    explicit = os.environ.get("SEPP_TEST_SERVER_BIN")
    if explicit:
        return Path(explicit)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    return target / "debug" / "sepp"


@dataclass
class Server:
    """A running server process."""

    proc: subprocess.Popen[str]
    addr: str
    data_dir: Path

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_server(work_dir: Path, extra_config: str = "") -> Server:
    """Starts a server with the base test config plus `extra_config` (TOML; sections other
    than [server] and [storage] may be given whole, and keys of those two are merged)."""
    binary = server_binary()
    work_dir.mkdir(parents=True, exist_ok=True)
    if not binary.is_file():
        raise FileNotFoundError(
            f"sepp server binary not found at {binary}: run `cargo build --bin sepp` "
            "or set SEPP_TEST_SERVER_BIN"
        )
    server_keys, storage_keys, rest = _split_sections(extra_config)
    config = "\n".join(
        [
            "[server]",
            'listen_addr = "127.0.0.1:0"',
            f"db_path = {json.dumps(str(work_dir / 'data'))}",
            *server_keys,
            "[storage]",
            'persist_mode = "buffer"',
            *storage_keys,
            *rest,
            "",
        ]
    )
    config_path = work_dir / "sepp.toml"
    config_path.write_text(config)
    stderr = open(work_dir / "server.log", "w")  # noqa: SIM115 - the process owns it
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_") or k == "SEPP_LOG"}
    proc = subprocess.Popen(
        [str(binary), "--config", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    stderr.close()
    line = _first_line(proc)
    if not line.startswith(READY_PREFIX):
        proc.kill()
        proc.wait()
        log = (work_dir / "server.log").read_text()
        raise RuntimeError(f"sepp did not start (first line {line!r}); log:\n{log}")
    return Server(proc=proc, addr=line[len(READY_PREFIX) :].strip(), data_dir=work_dir)


def _first_line(proc: subprocess.Popen[str]) -> str:
    """Reads the readiness line, failing after START_TIMEOUT_S."""
    result: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        result.append(proc.stdout.readline())
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(START_TIMEOUT_S):
        proc.kill()
        raise TimeoutError(f"sepp printed no readiness line within {START_TIMEOUT_S} s")
    return result[0]


def _split_sections(extra: str) -> tuple[list[str], list[str], list[str]]:
    """Separates the keys of [server] and [storage] from the other sections of `extra`."""
    server: list[str] = []
    storage: list[str] = []
    rest: list[str] = []
    current = rest
    for line in extra.strip().splitlines():
        stripped = line.strip()
        if stripped == "[server]":
            current = server
            continue
        if stripped == "[storage]":
            current = storage
            continue
        if stripped.startswith("["):
            current = rest
        current.append(line)
    return server, storage, rest


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The main server, shared by the session (tests use their own queue names)."""
    s = start_server(tmp_path_factory.mktemp("main"), MAIN_CONFIG)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that requires an API key: "secret" may do everything, "producer-only" only
    enqueue."""
    s = start_server(
        tmp_path_factory.mktemp("auth"),
        '[auth]\napi_keys = [{ name = "t", key = "secret" },'
        ' { name = "p", key = "producer-only", roles = ["producer"] }]',
    )
    yield s
    s.stop()


@pytest.fixture(scope="session")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server in strict mode where only the queue "declared" exists."""
    s = start_server(
        tmp_path_factory.mktemp("strict"),
        '[server]\nstrict_queues = true\n[[queues]]\nname = "declared"',
    )
    yield s
    s.stop()


# The worker tests' server: dead letters kept (so that tests can list them), a sweeper that
# wakes often (lease expiry within ~50 ms), and a queue whose retry policy waits a minute.
WORKER_CONFIG = """
[storage]
dead_letter_retention_ms = 3600000
sweep_interval_ms = 50

[[queues]]
name = "retry-in-a-minute"
retry_delay_ms = 60000
"""


@pytest.fixture(scope="session")
def worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server for the worker tests (see WORKER_CONFIG)."""
    s = start_server(tmp_path_factory.mktemp("worker"), WORKER_CONFIG)
    yield s
    s.stop()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[[str], Server]]:
    """Starts servers private to one test; all are stopped when it ends."""
    started: list[Server] = []

    def start(extra_config: str = "") -> Server:
        s = start_server(tmp_path / f"s{len(started)}", extra_config)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[sepp.SeppClient]:
    """A client of the main server."""
    async with await sepp.SeppClient.connect(server.url) as c:
        yield c


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses."""
    return f"q-{uuid.uuid4().hex[:12]}"
