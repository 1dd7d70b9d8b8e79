"""langsmith's private names, in one place.

:func:`orchestrator.tracing.untraced_steps_inline` installs an ``aio_to_thread``
override through langsmith's public ``set_runtime_overrides``, wrapping the override
already in place (a user's, for a constrained runtime). langsmith sets overrides in
public but reads them only from a private module: :func:`current_aio_to_thread`.
"""

from __future__ import annotations

from typing import Any

from langsmith import _runtime_overrides

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "_runtime_overrides.get_runtime_overrides": (
        _runtime_overrides,
        "get_runtime_overrides",
        (),
    ),
    "RuntimeOverrides.aio_to_thread": (_runtime_overrides.RuntimeOverrides, "aio_to_thread", ()),
}
"""Each private name: (owner, attribute, the leading parameters it must take)."""


def current_aio_to_thread() -> Any:
    """The ``aio_to_thread`` override langsmith uses now (None: its default)."""
    return _runtime_overrides.get_runtime_overrides().aio_to_thread
