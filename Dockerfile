# One image for every toolfleet service: orchestrator, tool workers and Flower.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 toolfleet
WORKDIR /app

COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY tool_workers ./tool_workers
COPY config ./config
RUN pip install '.[ops]'

USER toolfleet
RUN mkdir -p /home/toolfleet/workspace
ENV TOOLFLEET_WORKSPACE_ROOT=/home/toolfleet/workspace \
    TOOLFLEET_CONFIG=/app/config/toolfleet.toml

CMD ["celery", "-A", "tool_workers", "worker", "-P", "prefork", "-Q", "tools", "-E"]
