"""What a worker tells operators: Prometheus metrics and traces.

::

    metrics.py       toolfleet_worker_* series (prometheus_client, multiprocess)
    tracing.py       an OpenTelemetry span per call
    trace_parent.py  the tool's body as the caller's LangSmith tool run
"""
