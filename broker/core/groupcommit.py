"""Group commit: small produce requests that arrive together share one transaction.

See docs/architecture.md#group-commit. A commit waits for the disk; with one request per
commit a broker does a few hundred single-message produces a second, however many clients
send them. Requests that arrive while a commit is under way are appended together in the next
one, each in its own savepoint, so each is still all or nothing on its own: a request that
fails rolls back alone and gets its own error, and the rest commit.

Once commits have held several requests, the next one waits a little
(FERRY_GROUP_COMMIT_WAIT_MS) for as many to be waiting, as PostgreSQL's commit_delay does for
its commit_siblings: producers that each wait for their answer come back just after a commit,
and would otherwise split into two alternating halves that pay twice the commits.
"""

import asyncio
import collections
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from broker import models
from broker import settings as ferry_settings
from broker.core import bulk, dbthreads, errors, log, memo
from broker.core.groups import positions
from broker.core.records import AppendResult, NewMessage, Principal

# Larger requests commit on their own: they already amortize the flush.
MAX_GROUPED_MESSAGES = 100
# At most this many messages per group commit.
MAX_GROUP_MESSAGES = 5000
# How long the largest recent group is what the next commit waits for.
PEAK_SECONDS = 1.0
# FERRY_GROUP_COMMIT_WAIT_MS's default on PostgreSQL.
PG_WAIT_MS = 5.0

Outcome = list[AppendResult] | errors.BrokerError | None


# On PostgreSQL, each topic's row as this process's last group commit read it, by name: the
# next commit plans with it and reads the row again in its partitions' lock's round trip,
# instead of in a round trip of its own before the transaction (docs/architecture.md#group-commit).
_last_rows: dict[str, tuple[Any, ...]] = {}
_LAST_ROWS_MAX = 1024


class _TopicChanged(Exception):
    """A topic's row is not the one the commit planned with: it rolls back and runs again."""


def append_batches(requests: list[tuple[Principal, str, list[NewMessage]]]) -> list[Outcome]:
    """Append several produce requests in one transaction.

    The requests to one topic are appended together, as one batch, when that succeeds; when it
    does not, each is appended again in its own savepoint, so each is all or nothing on its
    own. Each outcome is the request's results or its BrokerError; None means it met a
    concurrent producer's client id (PostgreSQL) and must be retried on its own with
    log.append_messages.

    On PostgreSQL it plans with the topics' rows of the last commit and checks them inside the
    transaction. Should one have changed, or anything fail, all runs again from fresh rows.
    """
    return _append_batches(requests, guess=True)


def _append_batches(
    requests: list[tuple[Principal, str, list[NewMessage]]], *, guess: bool
) -> list[Outcome]:
    outcomes: list[Outcome] = [None] * len(requests)
    by_topic: dict[int, tuple[models.Topic, list[tuple[int, list[Any]]]]] = {}
    known, guessed = {}, {}
    topic_sql = bulk.select_sql(models.Topic) + positions.WHERE_TOPIC
    guess = guess and bulk.vendor() == "postgresql"
    for name in {r[1] for r in requests}:
        row = _last_rows.get(name) if guess else None
        if row is not None:
            guessed[name] = row
        else:
            # Raw SQL: the ORM would compile the query for every group commit.
            row = next(iter(bulk.run(topic_sql, [name])), None)
            if row is None:
                continue
            memo.remember(_last_rows, name, row, _LAST_ROWS_MAX)
        known[name] = bulk.model_from_row(models.Topic, row)
    for i, (principal, topic_name, messages) in enumerate(requests):
        try:
            topic, plan = log.checked_batch(principal, topic_name, messages, known)
        except errors.BrokerError as exc:
            outcomes[i] = exc
            continue
        by_topic.setdefault(topic.id, (topic, []))[1].append((i, plan))
    if guessed and any(isinstance(o, errors.BrokerError) for o in outcomes):
        return _unguessed(requests, guessed)  # refused by a row that may be stale
    if not by_topic:
        return outcomes
    # First all together, without savepoints: a savepoint and its release are two more round
    # trips per group commit on PostgreSQL (docs/benchmarks.md). Should one request be at fault,
    # the transaction rolls back and each is appended again in a savepoint of its own (which
    # sets every outcome this attempt set).
    ids_unseen = log.unseen_ids_likely()
    try:
        with transaction.atomic(durable=True):
            for topic, planned in by_topic.values():
                row = guessed.get(topic.name)
                if row is not None:
                    bulk.read_ahead(topic_sql, [topic.name])  # with the partitions' lock
                results = log.append_planned_in_transaction(
                    topic, [p for _, plan in planned for p in plan], ids_unseen=ids_unseen
                )
                if row is not None and bulk.run(topic_sql, [topic.name]) != [row]:
                    raise _TopicChanged
                start = 0
                for i, plan in planned:
                    outcomes[i] = results[start : start + len(plan)]
                    start += len(plan)
        return outcomes
    except (errors.BrokerError, IntegrityError, _TopicChanged) as exc:
        if ids_unseen and isinstance(exc, IntegrityError):
            log.met_stored_id()  # a stored client id, most likely: look them up from now
        if guessed:
            return _unguessed(requests, guessed)  # rolled back: as if not guessed
    # One of them is at fault: find out which, one by one.
    with transaction.atomic(durable=True):
        for topic, planned in by_topic.values():
            _append_each(topic, planned, outcomes)
    return outcomes


def _unguessed(
    requests: list[tuple[Principal, str, list[NewMessage]]], guessed: dict[str, Any]
) -> list[Outcome]:
    for name in guessed:
        _last_rows.pop(name, None)
    return _append_batches(requests, guess=False)


def _append_each(
    topic: models.Topic, planned: list[tuple[int, list[Any]]], outcomes: list[Outcome]
) -> None:
    """One topic's requests, each in a savepoint of its own. Caller holds the transaction."""
    for i, plan in planned:
        try:
            with transaction.atomic():
                outcomes[i] = log.append_planned_in_transaction(topic, plan)
        except errors.BrokerError as exc:
            outcomes[i] = exc
        except IntegrityError:
            outcomes[i] = None


@dataclass
class _Waiting:
    principal: Principal
    topic: str
    messages: list[NewMessage]
    future: "asyncio.Future[list[AppendResult]]"


@dataclass
class _Queue:
    waiting: "collections.deque[_Waiting]" = field(default_factory=collections.deque)
    draining: bool = False
    # Running tasks, referenced so that they are not collected mid-way.
    tasks: set["asyncio.Task[None]"] = field(default_factory=set)
    # The most requests a commit held, with those waiting when it ended, within PEAK_SECONDS
    # of the last time it was as many (or lowered to those a wait gathered before its timer
    # ended it): how many producers are in play.
    peak: int = 1
    peak_at: float = 0.0
    # While the drain waits for more requests: its future, and how many it waits for.
    gathering: "tuple[asyncio.Future[None], int] | None" = None
    # How long the last commit took, seconds: the longest the next one waits.
    last_commit_s: float = 0.0

    def note_group(self, size: int, now: float) -> None:
        if size >= self.peak or now - self.peak_at > PEAK_SECONDS:
            self.peak, self.peak_at = size, now

    def note_arrival(self) -> None:
        if self.gathering is not None and len(self.waiting) >= self.gathering[1]:
            _resolve(self.gathering[0])

    def start(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


# One queue per event loop (a server has one; tests make many).
_queues: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue]" = (
    weakref.WeakKeyDictionary()
)


async def append_messages(
    principal: Principal, topic_name: str, messages: list[NewMessage]
) -> list[AppendResult]:
    """log.append_messages for async edges, sharing a commit with requests arriving alongside."""
    if len(messages) > MAX_GROUPED_MESSAGES:
        return await dbthreads.run(log.append_messages, principal, topic_name, messages)
    loop = asyncio.get_running_loop()
    queue = _queues.setdefault(loop, _Queue())
    waiting = _Waiting(principal, topic_name, messages, loop.create_future())
    queue.waiting.append(waiting)
    queue.note_arrival()
    if not queue.draining:
        queue.draining = True
        queue.start(_drain(queue))
    return await waiting.future


async def _drain(queue: _Queue) -> None:
    """Commit what is waiting, group by group, until nothing is."""
    loop = asyncio.get_running_loop()
    try:
        while queue.waiting:
            await _gather(queue, loop)
            group, size = [], 0
            while queue.waiting and size + len(queue.waiting[0].messages) <= MAX_GROUP_MESSAGES:
                size += len(queue.waiting[0].messages)
                group.append(queue.waiting.popleft())
            started = loop.time()
            try:
                outcomes = await dbthreads.run(
                    append_batches, [(w.principal, w.topic, w.messages) for w in group]
                )
            except Exception as exc:
                for w in group:
                    if not w.future.done():
                        w.future.set_exception(exc)
                continue
            ended = loop.time()
            queue.last_commit_s = ended - started
            # Those it held come back soon if their producers wait for the answer to send
            # again; those waiting already are on their way in.
            queue.note_group(len(group) + len(queue.waiting), ended)
            for w, outcome in zip(group, outcomes, strict=True):
                if w.future.done():
                    continue  # the caller went away (a closed connection)
                if outcome is None:
                    queue.start(_retry_alone(w))
                elif isinstance(outcome, errors.BrokerError):
                    w.future.set_exception(outcome)
                else:
                    w.future.set_result(outcome)
    finally:
        queue.draining = False


async def _gather(queue: _Queue, loop: asyncio.AbstractEventLoop) -> None:
    """Wait up to FERRY_GROUP_COMMIT_WAIT_MS for as many requests as the recent peak, and no
    longer than the last commit took (a wait longer than a commit would cost more than it saves).

    A lone producer, or requests that never came together, never wait: the peak is then 1.
    A wait that ends on its timer lowers the peak to the requests that came: producers that do
    not wait for their answers (one sending at a steady rate, whose request once met a slow
    commit) do not come back just after a commit, and waiting for them again would only delay
    each of their messages until the peak expired. The commit's end counts those waiting then,
    as after every commit: producers held back longer than the wait (a process short of CPU)
    but back by then raise it again.
    """
    wait_ms = wait_ms_setting()
    if wait_ms <= 0 or len(queue.waiting) >= queue.peak:
        return
    if loop.time() - queue.peak_at > PEAK_SECONDS:
        queue.peak = 1  # the crowd went away: no waiting for it
        return
    enough: asyncio.Future[None] = loop.create_future()
    queue.gathering = (enough, queue.peak)
    timer = loop.call_later(min(wait_ms / 1000, queue.last_commit_s), _resolve, enough)
    try:
        await enough
    finally:
        timer.cancel()
        queue.gathering = None
    if len(queue.waiting) < queue.peak:  # the timer ended it
        queue.peak, queue.peak_at = max(1, len(queue.waiting)), loop.time()


def wait_ms_setting() -> float:
    """FERRY_GROUP_COMMIT_WAIT_MS; -1 (the default) picks 5 on PostgreSQL and 0 on SQLite.

    On PostgreSQL a commit costs the broker a few milliseconds of CPU on top of its messages
    (round trips, the partition locks), so fewer, larger commits pay for a short wait; on
    SQLite a commit costs little, and the wait only delays (docs/benchmarks.md).
    """
    configured = float(ferry_settings.get("GROUP_COMMIT_WAIT_MS"))
    if configured >= 0:
        return configured
    return PG_WAIT_MS if bulk.vendor() == "postgresql" else 0.0


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


async def _retry_alone(w: _Waiting) -> None:
    try:
        results = await dbthreads.run(log.append_messages, w.principal, w.topic, w.messages)
    except Exception as exc:
        if not w.future.done():
            w.future.set_exception(exc)
    else:
        if not w.future.done():
            w.future.set_result(results)
