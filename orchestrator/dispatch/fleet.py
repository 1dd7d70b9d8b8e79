"""One dispatcher (and so one result listener) per process and Redis deployment."""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery

from orchestrator.dispatch.dispatcher import CeleryDispatcher
from tool_workers.contract.broker import backend_url_of
from tool_workers.contract.settings import Settings

_lock = threading.Lock()
_dispatchers: dict[tuple[Any, ...], CeleryDispatcher] = {}


def dispatcher_for(app: Celery | None = None, settings: Settings | None = None) -> CeleryDispatcher:
    """The process-wide dispatcher for ``app``, or for the app ``settings`` describe.

    Args:
        app: A Celery app built with :func:`tool_workers.contract.broker.create_app`. Its broker and
            result backend URLs win over those in ``settings``.
        settings: Settings to use; read from the environment when omitted.
    """
    settings = settings or Settings()
    if app is not None:
        settings = _settings_for_app(app, settings)
        key: tuple[Any, ...] = ("app", id(app))
    else:
        key = _key(settings)
    with _lock:
        dispatcher = _dispatchers.get(key)
        if dispatcher is None or (app is not None and dispatcher.app is not app):
            dispatcher = CeleryDispatcher(app, settings)
            _dispatchers[key] = dispatcher
        return dispatcher


def _key(settings: Settings) -> tuple[Any, ...]:
    # The signing key too: a dispatcher signs and checks with its settings' key.
    return (settings.broker_url, settings.backend_url, settings.namespace, settings.signing_key)


def close_for(settings: Settings) -> None:
    """Close the process-wide dispatcher of ``settings``, if one was made (before the
    connection it uses goes away: its listener would report the loss)."""
    with _lock:
        dispatcher = _dispatchers.pop(_key(settings), None)
    if dispatcher is not None:
        dispatcher.close()


def close_all() -> None:
    """Close every dispatcher this process made (their listeners and connections)."""
    with _lock:
        dispatchers = list(_dispatchers.values())
        _dispatchers.clear()
    for dispatcher in dispatchers:
        dispatcher.close()


def _settings_for_app(app: Celery, settings: Settings) -> Settings:
    overrides: dict[str, Any] = {}
    if app.conf.broker_url:
        overrides["broker_url"] = app.conf.broker_url
    backend_url = backend_url_of(app)
    if backend_url:
        overrides["result_backend"] = backend_url
    return settings.model_copy(update=overrides) if overrides else settings
