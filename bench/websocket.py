"""WebSocket push on a real Daphne: consume-and-ack, fan-out, publish, end-to-end latency.

Run by `make bench` (scripts/bench), once on SQLite and once on PostgreSQL; not part of the test
suite (STYLE.md §6). One process, one machine, one run, against the database the environment
names (the embedded SQLite under a temporary FERRY_DATA_DIR, or DATABASE_URL as is):

1. starts Daphne on 127.0.0.1 (a free port, the in-memory channel layer, background jobs off)
   and produces 100,000 256-byte messages over REST to a 4-partition topic;
2. consume and ack: one subscriber (prefetch 8000) takes them all over /ws/v1/, acking in
   frames of 4000 receipts;
3. fan-out: 100 subscribers of a broadcast group each get every one of 1,000 new messages;
4. publish: one connection publishes 20,000 messages over the socket, in frames of 1 (10
   frames in flight) and of 100;
5. latency: a producer publishes 1,000 msgs/s for 5 s (one message per frame, not waiting for
   answers); the subscriber notes when each arrives and acks every 20 ms; p50/p99 of publish
   call -> receipt at the subscriber;
6. prints the figures beside the targets (>= 40,000 msgs/s consume-and-ack; p99 <= 15 ms at
   1,000 msgs/s on the embedded default) and stops Daphne by its PID (always).

    .venv/bin/python bench/websocket.py [--scale 0.2]
"""

import argparse
import asyncio
import os
import platform
import signal
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from produce_fetch import (
    VALUE,
    cleanup_fixtures,
    command_line,
    concurrent_produce_phase,
    database_description,
    free_port,
    progress,
    setup_django,
    start_daphne,
    stop_daphne,
    wait_healthy,
)
from websockets.asyncio.client import ClientConnection, connect

MESSAGES = 100_000
PARTITIONS = 4
PREFETCH = 8000
ACK_BATCH = 4000
ACK_EVERY_S = 0.02
FANOUT_SUBSCRIBERS = 100
FANOUT_MESSAGES = 1000
PUBLISH_MESSAGES = 20_000
PUBLISH_WINDOW = 10
LATENCY_RATE = 1000
LATENCY_SECONDS = 5
TARGET_CONSUME_MSGS_S = 40_000
TARGET_P99_MS = 15.0
WAIT_S = 120


@dataclass
class Result:
    name: str
    messages: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds


def frame(**fields: Any) -> str:
    return orjson.dumps(fields).decode()


async def receive(ws: ClientConnection) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
    if data["type"] == "error":
        raise RuntimeError(f"server error: {data['error']}")
    return data


async def expect(ws: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        data = await receive(ws)
        if data["type"] == kind:
            return data


async def open_ws(url: str, secret: str, tls: ssl.SSLContext | None = None) -> ClientConnection:
    """A subscriber's socket; `tls` for a wss:// url whose certificate the default store lacks."""
    headers = {"Authorization": f"Bearer {secret}"}
    if tls is None:  # websockets refuses ssl=None for wss://: leave its default
        return await connect(url, additional_headers=headers, max_size=None)
    return await connect(url, additional_headers=headers, max_size=None, ssl=tls)


async def subscribe(ws: ClientConnection, topic: str, group: str, **fields: Any) -> None:
    await ws.send(frame(type="subscribe", sub="s", topic=topic, group=group, **fields))
    await expect(ws, "subscribed")


async def consume_and_ack(url: str, secret: str, topic: str, total: int) -> Result:
    async with await open_ws(url, secret) as ws:
        await subscribe(ws, topic, "bench-consume", prefetch=PREFETCH)
        got = 0
        started = time.perf_counter()
        while got < total:
            data = await receive(ws)
            if data["type"] != "messages":
                continue
            got += len(data["items"])
            # One ack frame per messages frame: the core settles them in one transaction.
            await ws.send(
                frame(type="ack", sub="s", receipts=[m["receipt"] for m in data["items"]])
            )
        seconds = time.perf_counter() - started
    return Result("consume and ack, 1 subscriber", got, seconds)


async def fanout(
    url: str, http_url: str, secret: str, headers: dict[str, str], topic: str, count: int
) -> Result:
    sockets = [await open_ws(url, secret) for _ in range(FANOUT_SUBSCRIBERS)]
    try:
        for i, ws in enumerate(sockets):
            await subscribe(ws, topic, "bench-fanout", member_id=f"m{i}", prefetch=PREFETCH)

        async def drain(ws: ClientConnection) -> int:
            got = 0
            while got < count:
                data = await receive(ws)
                if data["type"] == "messages":
                    got += len(data["items"])
                    receipts = [m["receipt"] for m in data["items"]]
                    await ws.send(frame(type="ack", sub="s", receipts=receipts))
            return got

        started = time.perf_counter()
        async with httpx.AsyncClient(base_url=http_url, headers=headers, timeout=60) as client:
            body = orjson.dumps({"messages": [{"value": VALUE}] * count})
            response = await client.post(f"/api/v1/topics/{topic}/messages", content=body)
            response.raise_for_status()
        totals = await asyncio.gather(*(drain(ws) for ws in sockets))
        seconds = time.perf_counter() - started
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))
    return Result(f"fan-out to {FANOUT_SUBSCRIBERS} subscribers", sum(totals), seconds)


async def publish(url: str, secret: str, topic: str, total: int, per_frame: int) -> Result:
    async with await open_ws(url, secret) as ws:
        messages = [{"value": VALUE}] * per_frame
        frames = total // per_frame
        window = PUBLISH_WINDOW if per_frame == 1 else 2
        started = time.perf_counter()
        sent = answered = 0
        while answered < frames:
            while sent < frames and sent - answered < window:
                await ws.send(frame(type="publish", ref=sent, topic=topic, messages=messages))
                sent += 1
            await expect(ws, "published")
            answered += 1
        seconds = time.perf_counter() - started
    return Result(f"publish, {per_frame} per frame", frames * per_frame, seconds)


async def latency(url: str, secret: str, topic: str) -> list[float]:
    """Publish at LATENCY_RATE msgs/s; milliseconds from each publish call to its receipt."""
    total = LATENCY_RATE * LATENCY_SECONDS
    async with await open_ws(url, secret) as sub_ws, await open_ws(url, secret) as pub_ws:
        await subscribe(sub_ws, topic, "bench-latency", prefetch=PREFETCH, **{"from": "latest"})
        arrived: dict[int, float] = {}

        async def listen() -> None:
            pending: list[str] = []
            last_ack = time.perf_counter()
            while len(arrived) < total:
                data = await receive(sub_ws)
                if data["type"] == "messages":
                    now = time.perf_counter()
                    for m in data["items"]:
                        arrived[m["value"]] = now
                    pending.extend(m["receipt"] for m in data["items"])
                    # Acks batched in time as a client library does: one frame per 20 ms.
                    if now - last_ack >= ACK_EVERY_S or len(arrived) >= total:
                        await sub_ws.send(frame(type="ack", sub="s", receipts=pending))
                        pending, last_ack = [], now

        async def drain_published() -> None:
            for _ in range(total):
                await expect(pub_ws, "published")

        sent_at: dict[int, float] = {}
        listener = asyncio.create_task(listen())
        answers = asyncio.create_task(drain_published())
        start = time.perf_counter()
        for i in range(total):
            # Paced against the clock, so a slow moment is caught up instead of drifting.
            delay = start + i / LATENCY_RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent_at[i] = time.perf_counter()
            await pub_ws.send(frame(type="publish", topic=topic, messages=[{"value": i}]))
        await asyncio.wait_for(asyncio.gather(listener, answers), WAIT_S)
    return sorted((arrived[i] - sent_at[i]) * 1000 for i in range(total))


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(len(values) * fraction))]


async def run_phases(
    url: str,
    http_url: str,
    secret: str,
    headers: dict[str, str],
    topics_: dict[str, str],
    total: int,
) -> tuple[list[Result], list[float]]:
    results = []
    progress(f"consume and ack: {total} messages, one subscriber, prefetch {PREFETCH}")
    results.append(await consume_and_ack(url, secret, topics_["consume"], total))
    progress(f"  {results[-1].msgs_per_s:,.0f} msgs/s")
    count = max(10, int(FANOUT_MESSAGES * total / MESSAGES))
    progress(f"fan-out: {count} messages to {FANOUT_SUBSCRIBERS} broadcast subscribers")
    results.append(await fanout(url, http_url, secret, headers, topics_["fanout"], count))
    progress(f"  {results[-1].msgs_per_s:,.0f} deliveries/s")
    publish_total = max(100, int(PUBLISH_MESSAGES * total / MESSAGES)) // 100 * 100
    for per_frame in (1, 100):
        progress(f"publish: {publish_total} messages, {per_frame} per frame")
        results.append(await publish(url, secret, topics_["publish"], publish_total, per_frame))
        progress(f"  {results[-1].msgs_per_s:,.0f} msgs/s")
    progress(f"latency: {LATENCY_RATE} msgs/s for {LATENCY_SECONDS} s")
    latencies = await latency(url, secret, topics_["latency"])
    progress(
        f"  p50 {statistics.median(latencies):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms"
    )
    return results, latencies


def report(database: str, results: list[Result], latencies: list[float], vendor: str) -> None:
    print(f"\n== WebSocket push ({database}) ==")
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cpus")
    print(f"command: {command_line()}")
    for r in results:
        print(f"{r.name:<34} {r.messages:>9,} in {r.seconds:6.2f} s = {r.msgs_per_s:>9,.0f} /s")
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    print(
        f"{'latency at 1,000 msgs/s':<34} p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {latencies[-1]:.1f} ms"
    )
    consume = results[0].msgs_per_s
    verdict = "met" if consume >= TARGET_CONSUME_MSGS_S else "MISSED"
    print(f"target consume-and-ack >= {TARGET_CONSUME_MSGS_S:,} msgs/s: {verdict}")
    if vendor == "sqlite":
        verdict = "met" if p99 <= TARGET_P99_MS else "MISSED"
        print(f"target p99 <= {TARGET_P99_MS:.0f} ms at 1,000 msgs/s (embedded default): {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    total = max(1000, int(MESSAGES * args.scale)) // 1000 * 1000
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-ws-"))
    progress(f"data dir {tmp}; migrating")
    setup_django(tmp)
    from django.db import connection, connections

    from broker.core import groups, keys, topics

    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    _, secret = keys.create_api_key(
        keys.CONSOLE, f"bench-{stamp}", [keys.parse_permission("admin:*")]
    )
    names = {k: f"bench-ws-{k}-{stamp}" for k in ("consume", "fanout", "publish", "latency")}
    for kind, name in names.items():
        topics.create_topic(keys.CONSOLE, name, PARTITIONS if kind == "consume" else 1)
    groups.configure_group(keys.CONSOLE, "bench-fanout", mode="broadcast")
    vendor, database = connection.vendor, database_description()
    connections.close_all()
    port = free_port()
    log_path = tmp / "daphne.log"
    progress(f"starting daphne on 127.0.0.1:{port} (log {log_path})")
    proc = start_daphne(port, log_path)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log_path)
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        progress(f"producing {total} messages to {names['consume']}")
        concurrent_produce_phase(url, headers, names["consume"], 1000, total // 1000, 4)
        ws_url = url.replace("http://", "ws://") + "/ws/v1/"
        results, latencies = asyncio.run(run_phases(ws_url, url, secret, headers, names, total))
    finally:
        stop_daphne(proc)
    report(database, results, latencies, vendor)
    cleanup_fixtures(stamp, list(names.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
