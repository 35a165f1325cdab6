"""The examples in python/examples, run as a user would, against the test server."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from conftest import Server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_checksum_examples_hash_every_file_once(
    worker_server: Server, queue: str, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    files = {
        tree / "a.txt": b"alpha\n",
        tree / "sub" / "b.bin": bytes(range(256)) * 300,
        tree / "sub" / "deeper" / "empty": b"",
        tree / "sub" / "name with spaces": b"x",
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (tree / "link").symlink_to(tree / "a.txt")  # not followed: no job
    server = ["--server", worker_server.url, "--queue", queue]

    first = run_example("checksum_producer.py", str(tree), *server)
    assert "4 files" in first and "4 new, 0 already enqueued, 0 rejected" in first
    second = run_example("checksum_producer.py", str(tree), *server, "--batch", "3")
    assert "0 new, 4 already enqueued, 0 rejected" in second

    out = tmp_path / "sums.txt"
    report = run_example("checksum_worker.py", "--out", str(out), *server, "--exit-when-idle")
    assert report.startswith("4 files hashed (0 failed)")
    expected = sorted(f"{hashlib.sha256(data).hexdigest()}  {path}" for path, data in files.items())
    assert sorted(out.read_text().splitlines()) == expected
