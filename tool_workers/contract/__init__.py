"""The contract between the orchestrator and the tool workers: all the orchestrator imports.

::

    models.py        ToolRequest, ToolResult, ToolSpec, WorkerEntry: the wire's JSON models
    names.py         task and queue names, task ids, Redis keys and channels
    broker.py        the Celery app both sides build from settings (routing, serializers)
    amqp.py          its RabbitMQ part: queue names and arguments on the broker
    settings.py      the one settings object, and the per-tool policy
    errors.py        the exception tree
    signing.py       the HMAC of signed requests and results (TOOLFLEET_SIGNING_KEY)
    wire_json.py     graph values (messages, state, context) as JSON
    connections.py   Redis clients with the deployment's timeouts and TLS
    masking.py       the one masking of every printed or logged setting, argument or line
    logs.py          the log line format both sides write
    store.py         the LangGraph store both sides open (TOOLFLEET_STORE_URL)
    placeholders.py  the placeholder secrets every process refuses at start
"""
