"""What the Python drivers in bench/ share: where the repository and the cargo build are,
progress lines on stderr, a free loopback port, and waiting for a server to listen.

The drivers run as scripts (`python3 bench/compare.py`), so this directory is first on
`sys.path` and `import benchutil` finds this file.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
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
