"""A loopback HTTP receiver that misbehaves on purpose: it answers with an endless body,
trickles its answer a byte a second, or never answers at all."""

from __future__ import annotations

import socket
import threading
import time
from typing import Literal

Mode = Literal["endless", "trickle", "silent"]

CHUNK = b"x" * 65536


class HostileReceiver:
    """``http://127.0.0.1:<port>/hook``, until :meth:`close`.

    Args:
        mode: ``endless``: a 200 whose body never ends (``limit`` bytes, then silence);
            ``trickle``: a 200 sending one byte a second; ``silent``: reads the request
            and never answers.
        limit: Most body bytes the endless mode writes on one connection (keeps a
            client that buffers everything from taking the machine's memory).
    """

    def __init__(self, mode: Mode, limit: int = 256 * 1024 * 1024) -> None:
        self.mode = mode
        self.limit = limit
        self.connections = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(512)
        self._sock.settimeout(0.2)
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def url(self, path: str = "/hook") -> str:
        """A URL of the receiver."""
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}{path}"

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)  # the request (small: a webhook's JSON)
                if self.mode == "silent":
                    self._stop.wait()
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                sent = 0
                while not self._stop.is_set():
                    if self.mode == "trickle":
                        conn.sendall(b"x")
                        self._stop.wait(1.0)
                    elif sent < self.limit:
                        conn.sendall(CHUNK)
                        sent += len(CHUNK)
                    else:
                        self._stop.wait(0.5)
            except OSError:
                return  # the client went away: what a bounded client does

    def close(self) -> None:
        """Stop serving; every connection is closed."""
        self._stop.set()
        self._sock.close()
        deadline = time.monotonic() + 5
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
