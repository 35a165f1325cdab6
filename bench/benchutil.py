"""What the Python drivers in bench/ share: where the repository and the cargo build are,
progress lines on stderr, a free loopback port, and waiting for a server to listen.

The drivers run as scripts (`python3 bench/compare.py`), so this directory is first on
`sys.path` and `import benchutil` finds this file.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent


def logger(name: str) -> Callable[[str], None]:
    """A function printing `[name HH:MM:SS] msg` to stderr, flushed (progress, not results)."""

    def log(msg: str) -> None:
        print(f"[{name} {dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)

    return log


def target_dir() -> Path:
    """cargo's target directory: `$CARGO_TARGET_DIR`, else `target/` in the repository."""
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 60) -> None:
    """Returns once something accepts on 127.0.0.1:`port`; raises if `proc` exits first or
    nothing listens within `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


READY_PREFIX = "sepp listening on "


class SeppProcess:
    """A `sepp` server on a fresh temporary directory (`self.dir`, removed by `stop`), started
    with the config `config_for(dir)` returns, its log in `dir/server.log`; `self.addr` is the
    address of its readiness line. `SEPP_*` variables other than `SEPP_LOG` are not passed on:
    they would override the generated config."""

    def __init__(self, binary: Path, prefix: str, config_for: Callable[[Path], str]) -> None:
        if not binary.is_file():
            raise SystemExit(f"no server at {binary}: run `cargo build --release --bin sepp`")
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        config = self.dir / "sepp.toml"
        config.write_text(config_for(self.dir))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_") or k == "SEPP_LOG"}
        with open(self.dir / "server.log", "w") as stderr:
            self.proc = subprocess.Popen(
                [str(binary), "--config", str(config)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(READY_PREFIX):
            self.stop()
            raise SystemExit(f"the server did not start: {line!r}")
        self.addr = line[len(READY_PREFIX) :].strip()

    def stop(self) -> None:
        """SIGTERM, up to 30 s for the exit (then SIGKILL), and the directory removed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
