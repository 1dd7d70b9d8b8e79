"""A2A (Agent2Agent): each assistant as an A2A agent, as LangGraph's server offers it.

Routes (a token needed, as on every other route; the assistant is the caller's tenant's):

- ``GET /.well-known/agent-card.json?assistant_id=<id>``, ``GET /a2a/<id>`` and
  ``GET /a2a/<id>/.well-known/agent-card.json`` (or ``agent.json``): the agent card.
- ``POST /a2a/<id>``: JSON-RPC 2.0. ``message/send`` and ``message/stream`` (SSE) start an
  ordinary run of the assistant on a thread (the A2A ``contextId``; a new thread when
  the message has none), seen in the thread's runs like any other; ``tasks/get`` reads
  the task, ``tasks/cancel`` cancels its running run or ends its wait for input;
  ``agent/getAuthenticatedExtendedCard`` answers the card. The A2A 1.0 names
  (``SendMessage``, ``SendStreamingMessage``, ``GetTask``, ``CancelTask``,
  ``GetExtendedAgentCard``) are accepted too and answered in 1.0's form
  (``TASK_STATE_*``, ``ROLE_*``, ``{"task": ...}``), the slash names in the 0.3 form the
  ``a2a-sdk`` client reads. ``ListTasks`` (1.0 only) lists the assistant's tasks, in
  one context or in the tenant's latest
  :data:`~orchestrator.server.a2a.protocol.MAX_CONTEXTS` threads.

A task id is ``<contextId>:<run id>``; a message naming a task continues it (a run on
the same thread). Text parts become one human message each; a data part's object is
merged into the run's input; a file part becomes a content block (a URI is never
fetched). A message to an interrupted task resumes it: ``command`` in the message, a
data part ``{"resume": ...}``, or its text.

The package, by concept::

    routes.py    the card's routes and the JSON-RPC endpoint: checks a call, answers errors
    card.py      an assistant's agent card
    call.py      what one call knows, and the reads its kinds share (a task, a run's values)
    messages.py  message/send and message/stream: a message as a run, answered or streamed
    tasks.py     tasks read, cancelled and listed; Call, one call of either kind
    parts.py     messages both ways: parts as a run's input; values as history and answers
    protocol.py  codes, limits, states, 0.3's spellings, the checks of a call's parameters

a2a-sdk's server components are not used: its JSON-RPC handler (0.3) checks each request
against 0.3's method names alone and answers the 1.0 names (``SendMessage``, ``GetTask``,
``ListTasks``...) "method not found", where LangGraph's server, and so this one, answers
both; and its request handler keeps tasks of its own in a task store, where a task here
is a run of the thread (``<contextId>:<run id>``), listed with the thread's runs.
"""

from orchestrator.server.a2a.routes import router

__all__ = ["router"]
