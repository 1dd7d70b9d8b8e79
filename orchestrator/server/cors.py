"""Which browser pages may call the service (CORS), configured as LangGraph's server is.

Closed by default: without a setting, no page of another origin gets an answer it can
read. Two ways to open it, LangGraph's own:

* ``http.cors`` in the project file (``toolfleet serve --config langgraph.json``), with
  the fields LangGraph documents: ``allow_origins``, ``allow_methods``, ``allow_headers``,
  ``allow_credentials``, ``allow_origin_regex``, ``expose_headers``, ``max_age``. Fields
  left out take Starlette's defaults, as on LangGraph's server (only ``GET``, no extra
  request headers); ``allow_origins`` left out is ``TOOLFLEET_CORS_ORIGINS``.
* ``TOOLFLEET_CORS_ORIGINS`` alone (the built-in agent has no project file): those
  origins, every method and request header, the paging headers exposed, credentials
  allowed unless an origin is ``*``, as LangGraph's ``CORS_ALLOW_ORIGINS`` opens it.

Starlette's ``CORSMiddleware`` applies the policy. It sits in front of the token check
(:mod:`orchestrator.server.guard`): a preflight carries no token, and its answer holds the
CORS headers and nothing of the service; the guard's refusals (401, 413, ...) get the
CORS headers on their way out, so a page can read why it was refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tool_workers.contract.settings import Settings

PAGING_HEADERS = ("x-pagination-total", "x-pagination-next", "content-location")
"""Response headers a page may read when only origins are configured (LangGraph's list)."""


class CorsPolicy(BaseModel):
    """``http.cors`` of a LangGraph project file (its ``CorsConfig``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_origins: tuple[str, ...] | None = None
    """Origins allowed to call the service (``*``: any); unset: ``TOOLFLEET_CORS_ORIGINS``."""
    allow_methods: tuple[str, ...] = ("GET",)
    """Methods a page may use (``*``: any)."""
    allow_headers: tuple[str, ...] = ()
    """Request headers a page may send beyond the always-allowed ones (``*``: any)."""
    allow_credentials: bool = False
    """Whether a page's request may carry credentials (cookies, ``Authorization``)."""
    allow_origin_regex: str | None = None
    """Origins allowed besides ``allow_origins``, as a regular expression."""
    expose_headers: tuple[str, ...] = ()
    """Response headers a page may read."""
    max_age: int = Field(default=600, ge=0)
    """Seconds a browser may keep a preflight's answer."""


def cors_policy(settings: Settings, project: CorsPolicy | None = None) -> CorsPolicy | None:
    """The policy ``toolfleet serve`` applies; ``None``: no page of another origin may
    call it.

    Args:
        settings: ``TOOLFLEET_CORS_ORIGINS``.
        project: ``http.cors`` of the project file, if it has one.
    """
    origins = settings.cors_origins
    if project is not None:
        if project.allow_origins is None:
            return project.model_copy(update={"allow_origins": origins})
        return project
    if not origins:
        return None
    return CorsPolicy(
        allow_origins=origins,
        allow_methods=("*",),
        allow_headers=("*",),
        allow_credentials="*" not in origins,
        expose_headers=PAGING_HEADERS,
    )


def middleware_options(policy: CorsPolicy) -> dict[str, Any]:
    """``policy`` as ``CORSMiddleware``'s keyword arguments."""
    return {
        "allow_origins": policy.allow_origins or (),
        "allow_methods": policy.allow_methods,
        "allow_headers": policy.allow_headers,
        "allow_credentials": policy.allow_credentials,
        "allow_origin_regex": policy.allow_origin_regex,
        "expose_headers": policy.expose_headers,
        "max_age": policy.max_age,
    }


__all__ = ["CorsPolicy", "cors_policy", "middleware_options"]
