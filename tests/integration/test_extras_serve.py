"""``toolfleet serve`` as ``pip install 'toolfleet[server]'`` alone installs it.

Run by ``.ci/extras`` in a venv holding only the server extra (at the newest and the
lowest versions its bounds allow); it runs in the dev venv's suite as well.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.fleet import fleet_settings
from tests.support.serving import ServerProcess, start_server

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("extras-serve")
    server = start_server(fleet_settings(redis_url, workdir), workdir, "serve")
    yield server
    server.stop()


def test_serve_answers_a_client_with_its_token(served: ServerProcess) -> None:
    """Given ``toolfleet serve`` (no worker needed to answer), when a client with the
    token asks for the assistants, then it answers; without the token it refuses (401)."""
    headers = {"Authorization": f"Bearer {served.settings.api_tokens[0]}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=60.0) as client:
        assert client.get("/ok").status_code == 200
        assert client.post("/assistants/search", json={"limit": 10}).status_code == 200
        refused = httpx.post(f"{served.url}/assistants/search", json={}, timeout=10.0)
        assert refused.status_code == 401
