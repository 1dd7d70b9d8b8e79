"""The private names of other libraries toolfleet depends on, one module per library.

Nothing else in toolfleet touches a private name (a leading underscore, an ``_internal``
package, a method kombu or Celery does not document) of kombu, Celery, billiard or
LangGraph: it goes through these modules, and ``tests/unit/test_compat.py`` checks every
name each one lists in its ``PINNED``, failing with the library, its version and the
name when an upgrade changes one; ``tests/unit/test_private_names.py`` finds a private
name used anywhere else.

These modules are leaves: they import nothing of toolfleet, so the contract
(:mod:`tool_workers.contract`, which the orchestrator imports) may use them. The
orchestrator's own are in :mod:`orchestrator.compat`.

::

    kombu.py      the Redis transport's read, delivery and ack-index steps
    celery.py     the heartbeat send, the queue table's insertion, the prefork pool's
                  billiard pool, time-limit timers and handlers, a request's revoked flags
    billiard.py   the pool's job bookkeeping and its soft-limit signal handler
    langgraph.py  the runtime's config key, and which tool arguments LangGraph injects
"""
