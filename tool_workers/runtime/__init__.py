"""The worker's runtime: tool loading, the task per tool, running a call, progress.

::

    worker.py     the worker process: settings, app, tools, the signals that wire them
    loader.py     tool modules named by TOOLFLEET_TOOL_MODULES, imported once
    tasks.py      one Celery task per tool: decode, decide, run, answer
    execute.py    one call run with ToolNode's semantics, as a ToolResult
    injection.py  the graph context a tool asks for, rebuilt here
    progress.py   the stream writer's events and heartbeats, back to the caller
    context.py    current_call(): what a running tool knows about its call
    registry.py   the registry entry this worker keeps fresh
"""
