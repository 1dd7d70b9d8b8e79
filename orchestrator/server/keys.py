"""Names of the Redis keys and channels the HTTP service keeps its shared state under.

Every replica of the service talks to the same Redis (it is the broker already), so run
and thread metadata, the per-run event logs and the cancel channel live there, under
``<namespace>:toolfleet:server:``::

    server:thread:<key>           hash   thread record (status, metadata, times)
    server:threads:<tenant>       zset   the tenant's thread ids by creation time (search)
    server:threads-updated:<tenant> zset the tenant's thread ids by last update (search)
    server:assistant:<key>        hash   a tenant's assistant (its document, its last version)
    server:assistant-versions:<key> hash its versions, by number
    server:assistants:<tenant>    zset   the tenant's assistant ids by creation time
    server:usage:<tenant>         hash   the bytes the tenant keeps, per item and in all
    server:cron:<key>             string a tenant's cron (``<tenant>/<cron id>``)
    server:crons:<tenant>         zset   the tenant's cron ids by creation time
    server:cron-fired:<key>       string the time of the cron's last tick that fired
    server:thread-runs:<key>      zset   the thread's run ids by creation time
    server:thread-lock:<key>      string id of the run that holds the thread (TTL, renewed)
    server:thread-queue:<key>     list   runs waiting for the thread (multitask "enqueue")
    server:run:<id>               hash   run record (status, owner replica, kwargs, error)
    server:run-alive:<id>         string set while a queued run's replica waits for it (TTL)
    server:run-leases             zset   unfinished run ids by when their lease lapses
    server:run-owners             hash   unfinished run id -> the replica holding its lease
    server:run-events:<id>        stream the run's stream parts, then an end marker
    server:replica:<id>           string set while a replica lives (TTL, renewed)
    server:replica-wake:<id>      stream wakes the replica's event reader
    server:control                pub/sub cancel requests between replicas
    server:tenant-key             string the key tenant ids of bare tokens are hashed with

``<key>`` is a thread key, ``<tenant>/<thread id>`` (:mod:`orchestrator.server.tenancy`).
The id always comes last, after a prefix no other key has: thread ids are the client's
(``user:42`` is fine), and no id can name another key.
"""

from __future__ import annotations

from dataclasses import dataclass

from tool_workers.contract.names import server_key_prefix


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one deployment's prefix (``Settings.key_prefix``)."""

    prefix: str

    @property
    def base(self) -> str:
        """Prefix of every key of the HTTP service."""
        return server_key_prefix(self.prefix)

    def thread(self, thread_id: str) -> str:
        """Hash holding a thread's record."""
        return f"{self.base}thread:{thread_id}"

    def threads(self, tenant: str) -> str:
        """Sorted set of the tenant's thread ids by creation time."""
        return f"{self.base}threads:{tenant}"

    def threads_updated(self, tenant: str) -> str:
        """Sorted set of the tenant's thread ids by the time of their last update."""
        return f"{self.base}threads-updated:{tenant}"

    def assistant(self, key: str) -> str:
        """Hash of a tenant's assistant (``<tenant>/<id>``): its current document and the
        number of its last version."""
        return f"{self.base}assistant:{key}"

    def assistant_versions(self, key: str) -> str:
        """Hash of a tenant's assistant's versions, by number."""
        return f"{self.base}assistant-versions:{key}"

    def assistants(self, tenant: str) -> str:
        """Sorted set of the tenant's assistant ids by creation time."""
        return f"{self.base}assistants:{tenant}"

    def usage(self, tenant: str) -> str:
        """Hash of the bytes the tenant keeps through the API (its storage quota)."""
        return f"{self.base}usage:{tenant}"

    def cron(self, key: str) -> str:
        """String of a tenant's cron (``<tenant>/<cron id>``): its document."""
        return f"{self.base}cron:{key}"

    def crons(self, tenant: str) -> str:
        """Sorted set of the tenant's cron ids by creation time."""
        return f"{self.base}crons:{tenant}"

    def cron_fired(self, key: str) -> str:
        """String of a tenant's cron: the time of its last tick that fired."""
        return f"{self.base}cron-fired:{key}"

    def thread_runs(self, thread_id: str) -> str:
        """Sorted set of a thread's run ids by creation time."""
        return f"{self.base}thread-runs:{thread_id}"

    def thread_lock(self, thread_id: str) -> str:
        """Id of the run holding the thread."""
        return f"{self.base}thread-lock:{thread_id}"

    def thread_queue(self, thread_id: str) -> str:
        """Runs waiting for the thread, first in line first."""
        return f"{self.base}thread-queue:{thread_id}"

    def run(self, run_id: str) -> str:
        """Hash holding a run's record."""
        return f"{self.base}run:{run_id}"

    @property
    def run_alive_prefix(self) -> str:
        """``run_alive(id)`` is this plus the id."""
        return f"{self.base}run-alive:"

    def run_alive(self, run_id: str) -> str:
        """Present while the replica that queued a run still waits to start it."""
        return f"{self.run_alive_prefix}{run_id}"

    @property
    def run_leases(self) -> str:
        """Unfinished runs by when their lease lapses (:mod:`orchestrator.server.runlease`)."""
        return f"{self.base}run-leases"

    @property
    def run_owners(self) -> str:
        """The replica holding each unfinished run's lease."""
        return f"{self.base}run-owners"

    def events(self, run_id: str) -> str:
        """Stream of the run's stream parts."""
        return f"{self.base}run-events:{run_id}"

    def replica(self, replica_id: str) -> str:
        """Present while the replica lives."""
        return f"{self.base}replica:{replica_id}"

    def wake(self, replica_id: str) -> str:
        """Stream the replica's event reader also blocks on, to be woken."""
        return f"{self.base}replica-wake:{replica_id}"

    @property
    def control(self) -> str:
        """Pub/sub channel of cancel requests."""
        return f"{self.base}control"

    @property
    def tenant_key(self) -> str:
        """The deployment's key for hashing tokens into tenant ids."""
        return f"{self.base}tenant-key"
