"""System failures: exceptions under one base. Tool failures are not here: they are values.

::

    ToolfleetError
     +-- ConfigError          settings or tool policy that cannot work
     +-- ToolLoadError        a tool module that cannot be imported or holds no tools
     +-- DispatchError        a call could not be handed to the broker
     +-- ResultError          a result could not be collected
     |    +-- ResultTimeout   no result within the wait the caller allowed
     +-- RunDeadlineExceeded  a whole agent run outlived its deadline
"""

from __future__ import annotations


class ToolfleetError(Exception):
    """Base of every exception toolfleet raises."""


class ConfigError(ToolfleetError):
    """Raised when settings or the tool policy file cannot work as given."""


class StartupError(ToolfleetError):
    """A service could not start: something it needs at startup failed."""


class ToolLoadError(ToolfleetError):
    """Raised when a tool module cannot be imported or provides no tools."""


class DispatchError(ToolfleetError):
    """Raised when a call cannot be handed to the broker."""


class ResultError(ToolfleetError):
    """Raised when a result cannot be collected from the result backend."""


class ResultTimeout(ResultError):
    """Raised when no result arrives within the wait the caller allowed."""


class RunDeadlineExceeded(ToolfleetError):
    """Raised when a whole agent run outlives its deadline."""
