"""The epoch of toolfleet's records: a worker's start tells a call whose records Redis
lost (published under an earlier epoch, its marker gone) from one that never started."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.local import delete_keys
from tool_workers.celery_ext.fence import START_SCRIPT, Start, parse_start, start_args
from tool_workers.contract.epoch import (
    EPOCH_HEADER,
    EpochWatch,
    epoch_key,
    note_loss,
    read_epoch,
    read_losses,
    renew_epoch,
)
from tool_workers.contract.marker import marker_key
from tool_workers.contract.settings import Settings
from tool_workers.observability.metrics import WorkerMetrics


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def client(redis_url: str, settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    delete_keys(redis_url, f"{settings.namespace}:*")
    client.close()


def start(client: redis.Redis, settings: Settings, task: str, stamped: str | None) -> Start:
    request = types.SimpleNamespace(**({EPOCH_HEADER: stamped} if stamped is not None else {}))
    keys, args = start_args(settings.key_prefix, task, 60, request, "", "")
    return parse_start(client.eval(START_SCRIPT, len(keys), *keys, *args))


def test_a_call_published_before_the_epoch_changed_and_without_its_marker_is_unknown(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a call stamped with an epoch Redis no longer has and no marker, its start
    says its fate is unknown; with its marker, or stamped with the current epoch, or with
    no stamp at all, it does not."""
    old, _ = read_epoch(client, settings.key_prefix)
    current = renew_epoch(client, settings.key_prefix, old)
    assert current != old

    lost = start(client, settings, "t-lost", old)
    assert lost.unknown and lost.unmarked and not lost.epoch_missing
    assert lost.epoch == current

    client.set(marker_key(settings.key_prefix, "t-marked"), '{"t":"x"}')
    assert not start(client, settings, "t-marked", old).unknown
    assert not start(client, settings, "t-current", current).unknown
    assert not start(client, settings, "t-unstamped", None).unknown
    # Counted as a start: a second delivery of the lost call is a redelivery.
    assert start(client, settings, "t-lost", old).starts == 2


def test_a_missing_epoch_key_is_written_and_makes_stamped_calls_unknown(
    client: redis.Redis, settings: Settings
) -> None:
    """Given the epoch key gone (FLUSHALL, a restart without persistence), the first start
    writes a new epoch; a call stamped with the old one is unknown on every worker."""
    old, created = read_epoch(client, settings.key_prefix)
    assert created
    client.delete(epoch_key(settings.key_prefix))

    first = start(client, settings, "t-a", old)
    assert first.epoch_missing and first.unknown and first.epoch != old
    other = start(client, settings, "t-b", old)  # another worker, another call
    assert other.unknown and not other.epoch_missing and other.epoch == first.epoch


def test_an_epoch_watch_counts_each_loss_once() -> None:
    """A process that saw one epoch and then another notices one loss; a first read of
    a missing key is a first boot, unless a call names an epoch."""
    counted: list[int] = []
    watch = EpochWatch("worker", lambda: counted.append(1))
    assert not watch.seen("a", missing=True)  # a fresh Redis: nothing was lost
    assert not watch.seen("a")
    assert watch.seen("b")
    assert not watch.seen("b")
    assert watch.lost_marker("c")
    assert not watch.lost_marker("c")
    assert EpochWatch("worker").seen("z", missing=True, stamped="y")
    assert len(counted) == 2 and watch.losses == 2


def test_a_read_begun_before_the_epoch_was_replaced_is_not_a_loss() -> None:
    """Given one thread of a process reading the epoch while another replaces it (a
    marker it wrote was gone), when the replacement's answer is taken first, then the
    older read's answer (the replaced epoch) is neither a second loss nor the epoch known
    now (which would have a third thread replace it again); a read begun after the
    replacement that finds the old epoch is a loss (a failover back to a replica that
    missed the replacement)."""
    watch = EpochWatch("orchestrator")
    assert not watch.seen("a")
    read_began = watch.generation
    assert watch.lost_marker("b")
    assert not watch.seen("a", since=read_began)
    assert not watch.lost_marker("a", since=read_began)
    assert (watch.known, watch.losses) == ("b", 1)
    assert watch.seen("a", since=watch.generation)
    assert (watch.known, watch.losses) == ("a", 2)


def test_noted_losses_are_read_back_and_malformed_ones_left_out(
    client: redis.Redis, settings: Settings
) -> None:
    """toolfleet status reads the notes: each field bounded, junk skipped."""
    note_loss(client, settings.key_prefix, "worker", "the epoch changed", "e1")
    client.lpush(f"{settings.key_prefix}epoch:lost", b"not json", b"[1]")
    losses = read_losses(client, settings.key_prefix)
    assert [(x["side"], x["how"]) for x in losses] == [("worker", "the epoch changed")]


def test_a_worker_counts_each_loss_it_notices(tmp_path: Path) -> None:
    """The worker's metric of losses of Redis data goes up by one per loss noticed."""
    metrics = WorkerMetrics(tmp_path)
    metrics.data_lost()
    samples = {
        s.name: s.value for family in metrics.redis_data_lost.collect() for s in family.samples
    }
    assert samples["toolfleet_worker_redis_data_lost_total"] == 1.0
