"""``toolfleet redis``: the embedded server for a machine without Redis, as a command.

Run as a user runs it (the installed console script, in a subprocess): it says the URL
to export, the server answers there, and Ctrl-C or SIGTERM stops it with the command.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.timeout(120)

TOOLFLEET = str(Path(sys.executable).parent / "toolfleet")
PREFIX = "export TOOLFLEET_BROKER_URL="


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_url_it_prints_answers_until_it_is_stopped(
    tmp_path: Path, stop: signal.Signals
) -> None:
    process = subprocess.Popen(
        [TOOLFLEET, "redis", "--port", "0"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as a terminal's foreground job has it, whatever this runner's disposition.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith(PREFIX), first
        url = first[len(PREFIX) :].strip()
        client = redis.Redis.from_url(url, socket_connect_timeout=5)
        try:
            assert client.ping()
            process.send_signal(stop)
            assert process.wait(timeout=30) == 0
            with pytest.raises(redis.ConnectionError):
                client.ping()
        finally:
            client.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_a_port_in_use_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [TOOLFLEET, "redis", "--port", str(port)],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert str(port) in line
    assert "--port 0" in line
