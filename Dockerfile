# One image for every toolfleet service (docker-compose.yml): tool workers, the sandbox
# pool, Flower and the orchestrator. Deployments with their own tools build FROM it and
# `pip install` their package, then name its modules in TOOLFLEET_TOOL_MODULES.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/toolfleet \
    PATH=/opt/toolfleet/bin:$PATH

RUN python -m venv /opt/toolfleet

WORKDIR /app
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY tool_workers ./tool_workers
COPY config ./config
# The runtime extras: ops (Flower), postgres (checkpointer), server (toolfleet serve),
# metrics (Prometheus), otel (OpenTelemetry API), mcp (MCP servers' tools on workers,
# toolfleet mcp, serve's /mcp); not dev or bench, which are for working on toolfleet.
RUN pip install '.[ops,postgres,server,metrics,otel,mcp]'

# Not root: tools run as this user. (The compose sandbox-worker alone runs as root with
# four capabilities, so that model-written code runs as nobody, apart from every process
# holding the broker password.) /workspace (the built-in file tools) and /data (Flower's
# state, the checkpointer) are volumes owned by it.
RUN useradd --create-home --uid 10001 --user-group toolfleet \
    && mkdir -p /workspace /data \
    && chown toolfleet:toolfleet /workspace /data
USER toolfleet

ENV TOOLFLEET_WORKSPACE_ROOT=/workspace \
    TOOLFLEET_CONFIG=/app/config/toolfleet.toml

# The default pool, as the compose service tool-worker runs it.
CMD ["celery", "-A", "tool_workers", "worker", "-P", "prefork", "-c", "4", "-Q", "tools", "-n", "tool-worker@%h", "-E", "-l", "INFO", "--without-gossip"]
