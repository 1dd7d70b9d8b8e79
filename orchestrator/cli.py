"""The ``toolfleet`` command. Workers are started with Celery's own CLI:

TOOLFLEET_TOOL_MODULES=myproj.tools celery -A tool_workers worker
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

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
    workers: Annotated[int, typer.Option(min=1, help="Worker processes to start.")] = 2,
    concurrency: Annotated[int, typer.Option(min=1, help="Pool processes per worker.")] = 2,
) -> None:
    """Start an embedded server and two workers, run an agent across them, stop them all."""
    from orchestrator.demo import DEFAULT_PROMPT, run_demo

    logging.basicConfig(level=logging.WARNING)
    run_demo(model=model, prompt=prompt or DEFAULT_PROMPT, workers=workers, concurrency=concurrency)


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
) -> None:
    """Run one agent turn against the fleet the TOOLFLEET_* settings point at."""
    from rich.console import Console

    from orchestrator.demo import run_agent
    from orchestrator.fleet import close_all
    from tool_workers.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    try:
        run_agent(
            Settings(), model, prompt, console=Console(), wait_for_workers=wait, thread_id=thread
        )
    finally:
        close_all()


@app.command()
def version() -> None:
    """Print toolfleet's version."""
    from importlib.metadata import version as dist_version

    typer.echo(dist_version("toolfleet"))


def main() -> None:
    """Entry point of the ``toolfleet`` console script."""
    app()


if __name__ == "__main__":
    main()
