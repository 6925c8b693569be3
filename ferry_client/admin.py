"""Admin: topics, consumer groups, dead letters, delayed messages and traces, over REST.

See docs/client.md#admin. Thin wrappers over docs/api.md: each method is one request and
returns the answer's JSON (dicts and lists, the fields documented there).
"""

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ferry_client import transport

Json = dict[str, Any]
Reason = Literal["max_attempts", "rejected", "expired", "removed"]


class Unset(enum.Enum):
    """A field left out of a change: it keeps its value (None clears a limit)."""

    UNSET = "unset"


UNSET = Unset.UNSET


def given(fields: Mapping[str, Any], *, unset: object = None) -> Json:
    """The fields whose value is not `unset`: what the request body sends."""
    return {name: value for name, value in fields.items() if value is not unset}


@dataclass(frozen=True)
class DeadLetterPage:
    """One page of a group's dead letters; pass next_after_id as after_id for the next one."""

    items: list[Json]
    total: int
    next_after_id: int | None


class Admin(transport.Client):
    """Manage a Ferry broker over REST; most calls need an `admin` key on what they touch.

    Failed reads and settings changes are retried on the next URL; creates, deletes, redrives
    and purges only when the request never reached a broker (so none happens twice).
    """

    def health(self) -> Json:
        """{"status": "ok", "database": ...} from the first broker URL that answers."""
        result: Json = self._rest.request("GET", "/health")
        return result

    # Topics.

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        max_message_bytes: int | None = None,
        capacity: int | None = None,
        overflow_policy: Literal["reject", "drop_oldest"] | None = None,
        message_ttl_ms: int | None = None,
        trace: bool | None = None,
    ) -> Json:
        """Create a topic; options left as None take the broker's defaults."""
        body = given(
            {
                "name": name,
                "partitions": partitions,
                "retention_ms": retention_ms,
                "retention_bytes": retention_bytes,
                "max_message_bytes": max_message_bytes,
                "capacity": capacity,
                "overflow_policy": overflow_policy,
                "message_ttl_ms": message_ttl_ms,
                "trace": trace,
            }
        )
        result: Json = self._rest.request("POST", "/topics", json=body, idempotent=False)
        return result

    def list_topics(self, page_size: int = 100) -> list[Json]:
        """Every topic the key sees, by name, read page_size at a time (docs/api.md#pages)."""
        return self._pages("/topics", page_size)

    def _pages(self, path: str, page_size: int) -> list[Json]:
        found: list[Json] = []
        after = None
        while True:
            page: list[Json] = self._rest.request(
                "GET", path, params={"limit": page_size, "after": after}
            )
            found.extend(page)
            if len(page) < page_size:
                return found
            after = page[-1]["name"]

    def describe_topic(self, name: str) -> Json:
        result: Json = self._rest.request("GET", f"/topics/{name}")
        return result

    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | Unset = UNSET,
        retention_ms: int | Unset | None = UNSET,
        retention_bytes: int | Unset | None = UNSET,
        max_message_bytes: int | Unset = UNSET,
        capacity: int | Unset | None = UNSET,
        overflow_policy: Literal["reject", "drop_oldest"] | Unset = UNSET,
        message_ttl_ms: int | Unset | None = UNSET,
        trace: bool | Unset = UNSET,
    ) -> Json:
        """Change what is given; None clears a limit (retention, capacity, TTL)."""
        body = given(
            {
                "partitions": partitions,
                "retention_ms": retention_ms,
                "retention_bytes": retention_bytes,
                "max_message_bytes": max_message_bytes,
                "capacity": capacity,
                "overflow_policy": overflow_policy,
                "message_ttl_ms": message_ttl_ms,
                "trace": trace,
            },
            unset=UNSET,
        )
        result: Json = self._rest.request("PATCH", f"/topics/{name}", json=body)
        return result

    def delete_topic(self, name: str) -> None:
        """Delete a topic with its messages and every group's offsets on it.

        Gone at once; the broker deletes its rows in the background, and the name can be used
        again right away.
        """
        self._rest.request("DELETE", f"/topics/{name}", idempotent=False)

    # Consumer groups.

    def list_groups(self, page_size: int = 100) -> list[Json]:
        """Every group the key sees (as GET /groups), by name, read page_size at a time."""
        return self._pages("/groups", page_size)

    def describe_group(self, group: str) -> Json:
        """Offsets, lag and in-flight counts per topic, members, settings, dead letters."""
        result: Json = self._rest.request("GET", f"/groups/{group}")
        return result

    def configure_group(
        self,
        group: str,
        *,
        strategy: Literal["range", "round_robin", "sticky"] | None = None,
        session_timeout_ms: int | None = None,
        mode: Literal["clustering", "broadcast"] | None = None,
        ordered: bool | None = None,
        ack_deadline_ms: int | None = None,
        max_attempts: int | None = None,
        retry_delays_ms: Sequence[int] | None = None,
    ) -> Json:
        """Change a group's settings (needs an admin:* key); None keeps a setting."""
        body = given(
            {
                "strategy": strategy,
                "session_timeout_ms": session_timeout_ms,
                "mode": mode,
                "ordered": ordered,
                "ack_deadline_ms": ack_deadline_ms,
                "max_attempts": max_attempts,
                "retry_delays_ms": list(retry_delays_ms) if retry_delays_ms is not None else None,
            }
        )
        result: Json = self._rest.request("PATCH", f"/groups/{group}", json=body)
        return result

    def reset_offsets(
        self,
        group: str,
        topic: str,
        to: Literal["earliest", "latest", "timestamp", "offsets", "shift"],
        *,
        timestamp_ms: int | None = None,
        offsets: Mapping[int, int] | None = None,
        shift_by: int | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> Json:
        """Move the group's committed offsets on a topic (offsets: partition → offset).

        With dry_run, answer per partition what would move ({"partitions": [{partition,
        current, target, delta}]}) and move nothing.
        """
        body = given(
            {
                "topic": topic,
                "to": to,
                "timestamp_ms": timestamp_ms,
                "offsets": [{"partition": p, "offset": o} for p, o in sorted(offsets.items())]
                if offsets is not None
                else None,
                "shift_by": shift_by,
                "force": force,
                "dry_run": dry_run or None,
            }
        )
        result: Json = self._rest.request("POST", f"/groups/{group}/reset", json=body)
        return result

    # Dead letters.

    def list_dead_letters(
        self,
        group: str,
        *,
        topic: str | None = None,
        reason: Reason | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> DeadLetterPage:
        """One page of the group's dead letters, oldest first."""
        body = self._rest.request(
            "GET",
            f"/groups/{group}/dlq",
            params={"topic": topic, "reason": reason, "after_id": after_id, "limit": limit},
        )
        return DeadLetterPage(body["items"], body["total"], body["next_after_id"])

    def dead_letters(
        self,
        group: str,
        *,
        topic: str | None = None,
        reason: Reason | None = None,
        page_size: int = 100,
    ) -> Iterator[Json]:
        """Every dead letter of the group (matching topic and reason), page by page."""
        after_id = None
        while True:
            page = self.list_dead_letters(
                group, topic=topic, reason=reason, after_id=after_id, limit=page_size
            )
            yield from page.items
            if page.next_after_id is None or not page.items:
                return
            after_id = page.next_after_id

    def redrive_dead_letters(
        self,
        group: str,
        ids: Sequence[int] | None = None,
        *,
        topic: str | None = None,
        reason: Reason | None = None,
    ) -> Json:
        """Send dead letters back for delivery: these ids, or (None) all that match.

        Returns {"redriven": n, "missing": [ids whose message retention already removed]}.
        """
        result: Json = self._rest.request(
            "POST",
            f"/groups/{group}/dlq/redrive",
            json=self._selection(ids, topic, reason),
            idempotent=False,
        )
        return result

    def purge_dead_letters(
        self,
        group: str,
        ids: Sequence[int] | None = None,
        *,
        topic: str | None = None,
        reason: Reason | None = None,
    ) -> int:
        """Delete dead letters: these ids, or (None) all that match; returns how many."""
        result = self._rest.request(
            "POST",
            f"/groups/{group}/dlq/purge",
            json=self._selection(ids, topic, reason),
            idempotent=False,
        )
        purged: int = result["purged"]
        return purged

    @staticmethod
    def _selection(ids: Sequence[int] | None, topic: str | None, reason: str | None) -> Json:
        # "all" must be said out loud: a selection that lost its ids never widens to everything.
        which: Json = {"all": True} if ids is None else {"ids": list(ids)}
        return {**which, **given({"topic": topic, "reason": reason})}

    # Delayed messages and traces.

    def list_scheduled(self, topic: str, *, after: int | None = None, limit: int = 100) -> Json:
        """Delayed messages not released yet: {"scheduled": [...], "next_after": id | None}."""
        result: Json = self._rest.request(
            "GET", f"/topics/{topic}/scheduled", params={"after": after, "limit": limit}
        )
        return result

    def cancel_scheduled(self, scheduled_id: int) -> Json:
        """Cancel a delayed message before it is released; returns it."""
        result: Json = self._rest.request("DELETE", f"/scheduled/{scheduled_id}", idempotent=False)
        return result

    def trace(self, topic: str, partition: int, offset: int) -> list[Json]:
        """The recorded events of one message (on a topic with trace on), oldest first."""
        body = self._rest.request(
            "GET", f"/topics/{topic}/partitions/{partition}/messages/{offset}/trace"
        )
        events: list[Json] = body["events"]
        return events

    # Management (docs/api.md#management).

    def purge_topic(self, name: str, up_to: Mapping[int, int] | None = None) -> Json:
        """Remove a topic's messages, all or those below per-partition offsets."""
        body = {} if up_to is None else {"up_to": {str(p): o for p, o in up_to.items()}}
        result: Json = self._rest.request(
            "POST", f"/topics/{name}/purge", json=body, idempotent=False
        )
        return result

    def delete_group(self, group: str, *, force: bool = False) -> None:
        """Delete a group (needs admin:*); refused while it has live members unless forced."""
        self._rest.request(
            "DELETE",
            f"/groups/{group}",
            params={"force": "true" if force else None},
            idempotent=False,
        )

    def lookup_messages(
        self,
        topic: str,
        *,
        key: str | None = None,
        id: str | None = None,
        partition: int | None = None,
        limit: int = 50,
    ) -> Json:
        """Stored messages with a key or a client message id, newest first (indexed)."""
        result: Json = self._rest.request(
            "GET",
            f"/topics/{topic}/messages",
            params={"key": key, "id": id, "partition": partition, "limit": limit},
        )
        return result

    def deliver_now(self, scheduled_id: int) -> Json:
        """Make a delayed message due now."""
        result: Json = self._rest.request(
            "POST", f"/scheduled/{scheduled_id}/deliver_now", idempotent=False
        )
        return result

    def reschedule(self, scheduled_id: int, deliver_at_ms: int) -> Json:
        """Move a delayed message's due time."""
        result: Json = self._rest.request(
            "POST",
            f"/scheduled/{scheduled_id}/reschedule",
            json={"deliver_at_ms": deliver_at_ms},
            idempotent=False,
        )
        return result

    def topic_history(
        self, topic: str, *, since_ms: int | None = None, until_ms: int | None = None
    ) -> Json:
        """A topic's sampled size and in rate (GET /topics/{t}/history; default: the last hour)."""
        result: Json = self._rest.request(
            "GET", f"/topics/{topic}/history", params={"since_ms": since_ms, "until_ms": until_ms}
        )
        return result

    def group_history(
        self,
        group: str,
        *,
        topic: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> Json:
        """A group's sampled lag, out rate and consume delay (GET /groups/{g}/history)."""
        result: Json = self._rest.request(
            "GET",
            f"/groups/{group}/history",
            params={"topic": topic, "since_ms": since_ms, "until_ms": until_ms},
        )
        return result

    def list_api_keys(self) -> list[Json]:
        result: list[Json] = self._rest.request("GET", "/keys")
        return result

    def create_api_key(self, name: str, permissions: Sequence[str]) -> Json:
        """Create a key (needs admin:*); the answer's "secret" is shown this once."""
        result: Json = self._rest.request(
            "POST",
            "/keys",
            json={"name": name, "permissions": list(permissions)},
            idempotent=False,
        )
        return result

    def revoke_api_key(self, name: str) -> Json:
        result: Json = self._rest.request("DELETE", f"/keys/{name}", idempotent=False)
        return result

    def audit(
        self,
        *,
        action: str | None = None,
        actor: str | None = None,
        source: str | None = None,
        target: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> Json:
        """Audit log entries, newest first: {"items": [...], "next_before_id": ...}."""
        result: Json = self._rest.request(
            "GET",
            "/audit",
            params={
                "action": action,
                "actor": actor,
                "source": source,
                "target": target,
                "before_id": before_id,
                "limit": limit,
            },
        )
        return result
