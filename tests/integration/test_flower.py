"""What an operator sees in Flower: failed calls as failed tasks, each call's arguments
(masked), and the columns that matter on a 1,600 px screen.

One fleet for the module: a prefork worker sending task events, Flower with the compose
file's Tasks page columns, and an agent turn whose calls raise, time out, are refused and
succeed. The browser test drives Debian's chromium through its chromedriver (both from
apt: ``.ci/run`` installs them); it needs root for that and fails without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage

from orchestrator import CeleryToolMiddleware, discover_tools, dispatcher_for
from orchestrator.local import WorkerProcess, settings_env
from tests.support.compose import services
from tests.support.fleet import fleet_settings, one_turn, wait_until, worker_env
from tests.support.serving import free_port
from tests.support.wire import call_headers, publish_raw, wait_stored
from tool_workers.contract.models import PROTOCOL_VERSION, timeout_text
from tool_workers.contract.names import task_id_for

pytestmark = pytest.mark.timeout(180)

SECRETS = {
    "REDIS_PASSWORD": "pw",
    "FLOWER_BASIC_AUTH": "ops:pw",
    "TOOLFLEET_API_TOKENS": "t",
    "TOOLFLEET_SIGNING_KEY": "5f0c9e7a2b4d6e8f1a3c5e7b9d0f2a4c",
}
"""What compose requires to be set; the columns read here do not depend on them."""

SCREEN = (1600, 900)
"""The screen the Tasks page must fit, worker column included."""

BOOM = "Error: ValueError('boom: disk')\n Please fix your mistakes."


def compose_columns() -> str:
    """The Tasks page columns docker-compose.yml gives Flower by default."""
    return str(services(SECRETS)["flower"]["environment"]["FLOWER_TASKS_COLUMNS"])


@pytest.fixture(scope="module")
def flower(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A fleet with Flower watching it, after one agent turn: a call that raises, one past
    its soft time limit, one the worker refuses (an unknown protocol version) and one that
    succeeds."""
    workdir = tmp_path_factory.mktemp("flower")
    settings = fleet_settings(redis_url, workdir)
    worker = WorkerProcess(
        settings,
        name="tf-flower",
        pool="prefork",
        concurrency=4,
        queues=("tools", "prefork"),
        events=True,
        log_file=workdir / "worker.log",
        extra_env=worker_env(settings),
    )
    port = free_port()
    env = {
        **os.environ,
        **settings_env(settings),
        "FLOWER_PORT": str(port),
        "FLOWER_ADDRESS": "127.0.0.1",
        "FLOWER_TASKS_COLUMNS": compose_columns(),
        # Loopback only, for this test: its API without a login.
        "FLOWER_UNAUTHENTICATED_API": "true",
    }
    log = open(workdir / "flower.log", "wb")  # noqa: SIM115 - closed below
    shown = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tool_workers", "flower"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        worker.start()
        worker.wait_ready()

        def sees_worker() -> bool:
            assert shown.poll() is None, (workdir / "flower.log").read_text()
            try:
                metrics = httpx.get(f"{url}/metrics", timeout=2).text
            except httpx.HTTPError:
                return False
            return f'flower_worker_online{{worker="{worker.hostname}"}} 1.0' in metrics

        wait_until(sees_worker, 30, "Flower to see the worker")

        calls = [("boom", {"reason": "disk"}), ("hang", {"seconds": 30}), ("add", {"a": 2, "b": 3})]
        dispatcher = dispatcher_for(settings=settings)
        tools = discover_tools(dispatcher=dispatcher, require=["boom", "hang", "add"], wait=10)
        agent = create_agent(
            one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
        )
        state = agent.invoke({"messages": [("user", "go")]})
        dispatcher.close()

        refused_id = task_id_for(f"refused-{time.monotonic_ns()}")
        body = {"protocol_version": PROTOCOL_VERSION + 98, "tool": "add", "args": {"a": 1}}
        publish_raw(settings, [[body], {}, {}], call_headers(refused_id, "add"))
        refused = wait_stored(settings, refused_id)

        def recorded() -> dict[str, Any] | None:
            tasks = httpx.get(f"{url}/api/tasks", timeout=5).json()
            done = [t for t in tasks.values() if t["state"] in ("SUCCESS", "FAILURE")]
            return tasks if len(done) >= 4 else None

        tasks = wait_until(recorded, 20, "Flower to record the four calls")
        yield {
            "url": url,
            "state": state,
            "tasks": tasks,
            "refused": refused,
            "refused_id": refused_id,
            "worker": worker,
            "worker_log": workdir / "worker.log",
        }
    finally:
        worker.stop(grace=5)
        if shown.poll() is None:
            shown.terminate()
            try:
                shown.wait(timeout=10)
            except subprocess.TimeoutExpired:
                shown.kill()
                shown.wait(timeout=10)
        log.close()


def by_name(flower: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flower's tasks by tool name, the refused call as ``refused``."""
    tasks = flower["tasks"]
    named = {
        t["name"].removeprefix("tools."): t for i, t in tasks.items() if i != flower["refused_id"]
    }
    return {**named, "refused": tasks[flower["refused_id"]]}


def test_error_timeout_and_refusal_are_failed_tasks_and_the_model_reads_them_as_before(
    flower: dict[str, Any],
) -> None:
    """Given a call that raises, one that times out, one refused and one that succeeds,
    then Flower records the first three as FAILURE with their exception's type and a short
    message, the fourth as SUCCESS; the agent's ToolMessages are the error messages it
    always got; Celery's log says each failure in one line, no traceback."""
    tasks = by_name(flower)
    boom, hang, add, refused = tasks["boom"], tasks["hang"], tasks["add"], tasks["refused"]

    assert (boom["state"], boom["exception"]) == (
        "FAILURE",
        "ToolError(\"ValueError('boom: disk')\")",
    )
    assert hang["state"] == "FAILURE"
    assert hang["exception"] == (
        "ToolTimeout(\"the tool 'hang' did not finish within its time limit of 2 s and was "
        'stopped.")'
    )
    assert refused["state"] == "FAILURE"
    assert refused["exception"].startswith("ToolRefused(\"protocol: the call to 'add' uses")
    assert (add["state"], add["result"], add["exception"]) == ("SUCCESS", "<success>", None)

    messages = {m.name: m for m in flower["state"]["messages"] if isinstance(m, ToolMessage)}
    assert (messages["boom"].status, messages["boom"].content) == ("error", BOOM)
    assert messages["hang"].status == "error"
    assert messages["hang"].content == timeout_text("hang", 2.0)
    assert (messages["add"].status, messages["add"].content) == ("success", "5")
    assert flower["state"]["messages"][-1].content == "done: 3 results"
    assert flower["refused"]["status"] == "FAILURE"

    log = Path(flower["worker_log"]).read_text(errors="replace")
    assert "raised expected: ToolError" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_flower_shows_each_calls_arguments_and_keeps_its_identity_as_kwargs(
    flower: dict[str, Any],
) -> None:
    """Given the calls, then Flower's args are the call's arguments as the tool gets them
    (masked, cut) and its kwargs name the call, its thread and its queue."""
    tasks = by_name(flower)

    assert tasks["add"]["args"] == "(a=2, b=3)"
    assert tasks["boom"]["args"] == "(reason='disk')"
    assert tasks["hang"]["args"] == "(seconds=30)"
    for tool in ("add", "boom", "hang"):
        assert tasks[tool]["kwargs"].startswith(f"({tool} call=call_"), tasks[tool]
        assert " thread=" in tasks[tool]["kwargs"] and " queue=" in tasks[tool]["kwargs"]


def chromium() -> tuple[str, str]:
    """The system chromium and its chromedriver (Debian's chromium, chromium-driver)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert browser and driver, (
        "the browser test needs Debian's chromium and chromium-driver "
        "(apt-get install -y chromium chromium-driver; .ci/run installs them as root)"
    )
    return browser, driver


@pytest.mark.root
def test_the_tasks_page_in_a_browser_lists_failures_args_and_the_worker_at_1600_px(
    flower: dict[str, Any],
) -> None:
    """Given the Tasks page in headless chromium at 1600x900 with the compose file's
    columns, then every column header, the worker's included, lies within the screen; the
    Failed filter lists the three failed calls with their exception; the args column
    shows the successful call's arguments."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    browser, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={SCREEN[0]},{SCREEN[1]}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.set_window_size(*SCREEN)
        driver.get(f"{flower['url']}/tasks")
        width = driver.execute_script("return window.innerWidth")
        assert width <= SCREEN[0]

        def rows() -> list[dict[str, str]]:
            # The table's rows as {column: text}, once DataTables has drawn them.
            found = driver.execute_script(
                """
                const heads = [...document.querySelectorAll('.dataTables_scrollHead th')]
                    .map(th => th.dataset.column);
                return [...document.querySelectorAll('#tasks-table tbody tr')]
                    .filter(tr => tr.id)
                    .map(tr => Object.fromEntries(
                        [...tr.children].map((td, i) => [heads[i], td.innerText])));
                """
            )
            return list(found)

        everything = wait_until(lambda: len(rows()) >= 4 and rows(), 20, "the tasks' rows")
        headers = driver.execute_script(
            """
            return [...document.querySelectorAll('.dataTables_scrollHead th')].map(th => {
                const r = th.getBoundingClientRect();
                return [th.dataset.column, r.left, r.right];
            });
            """
        )
        columns = [name for name, _, _ in headers]
        assert columns == compose_columns().split(","), columns
        outside = [(name, right) for name, _, right in headers if right > width]
        assert not outside, f"columns beyond the {width} px screen: {outside} of {headers}"
        worker = flower["worker"].hostname
        assert {row["worker"] for row in everything} == {worker}, everything
        succeeded = [row for row in everything if row["state"] == "SUCCESS"]
        assert [row["args"] for row in succeeded] == ["(a=2, b=3)"], succeeded

        driver.find_element(
            By.CSS_SELECTOR, '.task-state-filter[data-task-state="FAILURE"]'
        ).click()

        def failed_rows() -> list[dict[str, str]] | None:
            shown = rows()
            return shown if shown and all(r["state"] == "FAILURE" for r in shown) else None

        failed = wait_until(failed_rows, 20, "the Failed filter to apply")
        exceptions = sorted(row["exception"].split("(")[0] for row in failed)
        assert exceptions == ["ToolError", "ToolRefused", "ToolTimeout"], failed
        by_args = {row["args"]: row for row in failed}
        assert "boom: disk" in by_args["(reason='disk')"]["exception"]
        assert "time limit" in by_args["(seconds=30)"]["exception"]
        print("column edges at 1600 px:", headers)
    finally:
        driver.quit()
