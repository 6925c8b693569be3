"""The console against a remote broker: `--url` / FERRY_URL with FERRY_KEY (docs/console.md).

The same nouns and verbs, answered over REST through the Python client (ferry_client) instead
of the database: nothing here imports the core. Verbs without a remote form say so.
"""

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError

from broker.cli import groups as groups_noun
from broker.cli import produce as produce_noun
from broker.cli import scheduled as scheduled_noun
from broker.cli import table
from broker.cli import topics as topics_noun
from ferry_client import Admin, Producer, errors, transport
from ferry_client.records import Message

Handler = Callable[[BaseCommand, dict[str, Any], "Remote"], None]


class Remote:
    """The clients one command uses, made on first use."""

    def __init__(self, url: str, api_key: str) -> None:
        self.url = url
        self.api_key = api_key
        self.admin = Admin(url, api_key)
        self.rest = transport.Transport(url, api_key)

    def close(self) -> None:
        self.admin.close()
        self.rest.close()


def run(command: BaseCommand, options: dict[str, Any], url: str) -> None:
    """Answer the command over REST; CommandError for a verb without a remote form."""
    noun, verb = options["noun"], options.get("verb")
    handler = HANDLERS.get((noun, verb))
    if handler is None:
        name = f"{noun} {verb}" if verb else noun
        raise CommandError(
            f"`ferry {name}` has no remote form; run it where the broker's database is."
        )
    # One line per HTTP request would bury the command's own output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    api_key = os.environ.get("FERRY_KEY", "")
    if not api_key:
        raise CommandError("Remote mode needs an API key: set FERRY_KEY.")
    try:
        remote = Remote(url, api_key)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    try:
        handler(command, options, remote)
    except errors.BrokerUnavailable as exc:
        raise CommandError(f"cannot reach the broker at {url}: {exc}") from None
    except errors.FerryError as exc:
        raise CommandError(f"{exc.code}: {exc.message}") from None
    finally:
        remote.close()


def partitions_table(rows: list[dict[str, Any]]) -> str:
    return table.render(
        ("partition", "start", "end", "messages", "bytes"),
        [
            (
                p["partition"],
                p["start_offset"],
                p["end_offset"],
                p.get("message_count"),
                p.get("bytes_stored"),
            )
            for p in rows
        ],
    )


def topics_list(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    rows = [
        (
            t["name"],
            t["partitions"],
            t.get("message_count"),
            t.get("bytes_stored"),
            t["capacity"],
            t["message_ttl_ms"],
            t["trace"],
        )
        for t in remote.admin.list_topics()
    ]
    command.stdout.write(
        table.render(
            ("name", "partitions", "messages", "bytes", "capacity", "message_ttl_ms", "trace"),
            rows,
        )
    )


def topic_settings(t: dict[str, Any]) -> str:
    return table.fields(
        [
            ("topic", t["name"]),
            ("partitions", t["partitions"]),
            ("retention_ms", t["retention_ms"]),
            ("retention_bytes", t["retention_bytes"]),
            ("max_message_bytes", t["max_message_bytes"]),
            ("capacity", t["capacity"]),
            ("overflow", t["overflow_policy"]),
            ("message_ttl_ms", t["message_ttl_ms"]),
            ("trace", t["trace"]),
            ("created", table.at(t["created_at_ms"])),
        ]
    )


def topics_describe(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    t = remote.admin.describe_topic(options["name"])
    command.stdout.write(f"{topic_settings(t)}\n\n{partitions_table(t['partition_offsets'])}")


def topics_create(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    t = remote.admin.create_topic(options["name"], **topics_noun.given_limits(options))
    command.stdout.write(f"created topic {t['name']} with {t['partitions']} partition(s)")


def topics_delete(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    remote.admin.delete_topic(options["name"])
    command.stdout.write(f"deleted topic {options['name']}")


def topics_purge(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    up_to = dict(options["up_to"]) if options["up_to"] else None
    result = remote.admin.purge_topic(options["name"], up_to)
    command.stdout.write(f"purged {result['removed']} message(s) from {options['name']}")
    command.stdout.write(partitions_table(result["partition_offsets"]))


def groups_list(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    rows = [
        (
            t["group"],
            t["topic"],
            t.get("committed_total", t["committed_offset"]),
            t.get("end_total", t["end_offset"]),
            t["lag"],
            t.get("in_flight"),
            t.get("retry_waiting"),
        )
        for g in remote.admin.list_groups()
        for t in g["topics"]
    ]
    command.stdout.write(
        table.render(
            ("group", "topic", "committed", "end", "lag", "in flight", "retry waiting"), rows
        )
    )


def groups_describe(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    g = remote.admin.describe_group(options["group"])
    s = g["settings"]
    settings = table.fields(
        [
            ("group", g["name"]),
            ("generation", g["generation"]),
            ("strategy", g["strategy"]),
            ("mode", s["mode"]),
            ("ordered", s["ordered"]),
            ("ack_deadline_ms", s["ack_deadline_ms"]),
            ("max_attempts", s["max_attempts"]),
            ("retry_delays_ms", ",".join(map(str, s["retry_delays_ms"])) or "default"),
            ("dead_letters", g["dead_letters"]),
        ]
    )
    offsets = table.render(
        (
            "topic",
            "member",
            "partition",
            "committed",
            "start",
            "end",
            "lag",
            "in flight",
            "retry waiting",
            "filtered",
        ),
        [
            (
                t["topic"],
                t["member"],
                p["partition"],
                p["committed_offset"],
                p["start_offset"],
                p["end_offset"],
                p["lag"],
                p["in_flight"],
                p.get("retry_waiting"),
                p["filtered"],
            )
            for t in g["topics"]
            for p in t["partitions"]
        ],
    )
    members = table.render(
        ("member", "topic", "partitions", "last heartbeat"),
        [
            (
                m["member_id"],
                m["topic"],
                ",".join(map(str, m["partitions"])) or None,
                table.at(m["heartbeat_ms"]),
            )
            for m in g["members"]
        ],
    )
    command.stdout.write(f"{settings}\n\n{offsets}\n\n{members}")


def groups_delete(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    remote.admin.delete_group(options["group"], force=options["force"])
    command.stdout.write(f"deleted group {options['group']}")


def produce(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    produced = 0
    with (
        Producer(remote.url, remote.api_key) as producer,
        produce_noun.open_lines(options["file"]) as lines,
    ):
        for batch in produce_noun.batches(lines, options):
            messages = [
                Message(
                    value=orjson.loads(m.value),
                    key=m.key,
                    tag=m.tag,
                    headers=m.headers,
                    partition=m.partition,
                    delay_ms=m.delay_ms,
                    deliver_at_ms=m.deliver_at_ms,
                    level=m.delay_level,
                )
                for m in batch
            ]
            produced += len(producer.send_batch(options["topic"], messages))
    command.stdout.write(
        f"produced {produced} message{'' if produced == 1 else 's'} to {options['topic']}"
    )


def consume(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    if options["follow"]:
        raise CommandError("`ferry consume --follow` has no remote form; poll without --follow.")
    group, topic = options["group"], options["topic"]
    size = options["max_messages"]
    if options["max_total"] is not None:
        size = min(size, options["max_total"])
    result = remote.rest.request(
        "POST",
        f"/groups/{group}/poll",
        json={"topic": topic, "max_messages": size, "auto_commit": False},
    )
    for message in result["messages"]:
        command.stdout.write(orjson.dumps(message).decode())
    if result["next_offsets"] and not options["no_commit"]:
        remote.rest.request(
            "POST",
            f"/groups/{group}/commit",
            json={"topic": topic, "offsets": result["next_offsets"]},
        )
    if not result["messages"]:
        command.stderr.write(f"no new messages for group {group} on {topic}")


def _selection(options: dict[str, Any]) -> dict[str, Any]:
    return {"topic": options["topic"], "reason": options["reason"]}


def dlq_list(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    page = remote.admin.list_dead_letters(
        options["group"],
        topic=options["topic"],
        reason=options["reason"],
        after_id=options["after_id"],
        limit=options["limit"],
    )
    rows = [
        (
            d["id"],
            d["topic"],
            d["partition"],
            d["offset"],
            d["reason"],
            d["attempts"],
            (d["last_error"] or None),
        )
        for d in page.items
    ]
    command.stdout.write(
        table.render(("id", "topic", "partition", "offset", "reason", "attempts", "error"), rows)
    )
    if page.next_after_id is not None:
        command.stdout.write(
            f"\n{len(page.items)} of {page.total}; next page: --after-id {page.next_after_id}"
        )


def dlq_redrive(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    result = remote.admin.redrive_dead_letters(
        options["group"], options["ids"], **_selection(options)
    )
    missing = ", ".join(map(str, result["missing"])) or "none"
    command.stdout.write(f"redriven {result['redriven']}; missing: {missing}")


def dlq_purge(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    purged = remote.admin.purge_dead_letters(
        options["group"], options["ids"], **_selection(options)
    )
    command.stdout.write(f"purged {purged}")


def apikey_list(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    rows = [
        (
            k["name"],
            k["prefix"],
            " ".join(k["permissions"]),
            k["revoked"],
            k.get("created_by") or None,
            None if k.get("last_used_ms") is None else table.at(k["last_used_ms"]),
        )
        for k in remote.admin.list_api_keys()
    ]
    command.stdout.write(
        table.render(("name", "prefix", "permissions", "revoked", "created by", "last used"), rows)
    )


def apikey_create(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    created = remote.admin.create_api_key(options["name"], options["allow"])
    command.stdout.write(f"created API key {created['name']}")
    for permission in created["permissions"]:
        command.stdout.write(f"  allow {permission}")
    command.stdout.write("secret (shown once; send as 'Authorization: Bearer <secret>'):")
    command.stdout.write(created["secret"])


def apikey_revoke(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    revoked = remote.admin.revoke_api_key(options["name"])
    command.stdout.write(f"revoked API key {revoked['name']}")


def groups_reset(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    to = groups_noun.reset_target(options)
    result = remote.admin.reset_offsets(
        options["group"],
        options["topic"],
        to,  # type: ignore[arg-type]  # one of the literals, chosen above
        timestamp_ms=options["to_timestamp"],
        offsets=dict(options["to_offset"]) if options["to_offset"] else None,
        shift_by=options["shift_by"],
        force=options["force"],
        dry_run=options["dry_run"],
    )
    if options["dry_run"]:
        rows = [
            (options["topic"], r["partition"], r["current"], r["target"], f"{r['delta']:+d}")
            for r in result["partitions"]
        ]
        command.stdout.write(
            table.render(("topic", "partition", "committed", "target", "delta"), rows)
        )
        command.stdout.write("dry run: nothing moved")
        return
    moved = [
        (
            result["topic"],
            p["partition"],
            p["committed_offset"],
            p["start_offset"],
            p["end_offset"],
            p["lag"],
        )
        for p in result["partitions"]
    ]
    command.stdout.write(
        table.render(("topic", "partition", "committed", "start", "end", "lag"), moved)
    )


def messages_lookup(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    if options["tag"] is not None:
        raise CommandError("`messages lookup --tag` has no remote form; use --key or --id.")
    result = remote.admin.lookup_messages(
        options["topic"],
        key=options["key"],
        id=options["client_id"],
        partition=options["partition"],
        limit=options["limit"],
    )
    rows = [
        (
            m["partition"],
            m["offset"],
            table.at(m["timestamp_ms"]),
            m["key"],
            m["id"],
            m["tag"],
            orjson.dumps(m["value"]).decode() if "value" in m else "b64:" + m["value_b64"],
        )
        for m in result["messages"]
    ]
    command.stdout.write(
        table.render(("partition", "offset", "time", "key", "id", "tag", "value"), rows)
    )


def _due(info: dict[str, Any]) -> str:
    return scheduled_noun.due(info["deliver_at_ms"])


def scheduled_list(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    page = remote.admin.list_scheduled(
        options["topic"], after=options["after"], limit=options["limit"]
    )
    rows = [
        (
            s["id"],
            _due(s),
            s["partition"],
            s["key"],
            s["tag"],
            orjson.dumps(s["value"]).decode() if "value" in s else "b64:" + s["value_b64"],
        )
        for s in page["scheduled"]
    ]
    command.stdout.write(table.render(("id", "due", "partition", "key", "tag", "value"), rows))


def scheduled_cancel(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    info = remote.admin.cancel_scheduled(options["id"])
    command.stdout.write(
        f"cancelled scheduled message {info['id']} on {info['topic']} (was due {_due(info)})"
    )


def scheduled_deliver_now(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    info = remote.admin.deliver_now(options["id"])
    command.stdout.write(f"scheduled message {info['id']} on {info['topic']} is due now")


def scheduled_reschedule(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    due_ms = options["at_ms"]
    if due_ms is None:
        # The remote broker's clock decides the limit; this machine's only sets the time.
        due_ms = int(time.time() * 1000) + options["delay_ms"]
    info = remote.admin.reschedule(options["id"], due_ms)
    command.stdout.write(f"scheduled message {info['id']} on {info['topic']} is due {_due(info)}")


def audit_list(command: BaseCommand, options: dict[str, Any], remote: Remote) -> None:
    page = remote.admin.audit(
        action=options["action"],
        actor=options["actor"],
        source=options["source"],
        target=options["target"],
        before_id=options["before_id"],
        limit=options["limit"],
    )
    rows = [
        (
            e["id"],
            table.at(e["at_ms"]),
            e["actor"],
            e["source"],
            e["action"],
            e["target"],
            e["outcome"],
            orjson.dumps(e["params"]).decode() if e["params"] else None,
        )
        for e in page["items"]
    ]
    command.stdout.write(
        table.render(("id", "at", "actor", "source", "action", "target", "outcome", "params"), rows)
    )
    if page["next_before_id"] is not None:
        command.stdout.write(f"more: --before-id {page['next_before_id']}")


HANDLERS: dict[tuple[str, str | None], Handler] = {
    ("topics", "list"): topics_list,
    ("topics", "describe"): topics_describe,
    ("topics", "create"): topics_create,
    ("topics", "delete"): topics_delete,
    ("topics", "purge"): topics_purge,
    ("groups", "list"): groups_list,
    ("groups", "describe"): groups_describe,
    ("groups", "delete"): groups_delete,
    ("groups", "reset"): groups_reset,
    ("messages", "lookup"): messages_lookup,
    ("scheduled", "list"): scheduled_list,
    ("scheduled", "cancel"): scheduled_cancel,
    ("scheduled", "deliver-now"): scheduled_deliver_now,
    ("scheduled", "reschedule"): scheduled_reschedule,
    ("audit", "list"): audit_list,
    ("produce", None): produce,
    ("consume", None): consume,
    ("dlq", "list"): dlq_list,
    ("dlq", "redrive"): dlq_redrive,
    ("dlq", "purge"): dlq_purge,
    ("apikey", "list"): apikey_list,
    ("apikey", "create"): apikey_create,
    ("apikey", "revoke"): apikey_revoke,
}
