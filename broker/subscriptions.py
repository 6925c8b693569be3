"""One WebSocket subscription's state: its credit, its held acks and its read-ahead.

The frame handlers and the push task of broker/consumers.py change it; see docs/websocket.md
(#flow-control-credit) for the rules they keep.
"""

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker import frames
from broker import settings as ferry_settings
from broker.core import log
from broker.core.records import Delivery, SettleResult


@dataclass
class HeldAcks:
    """Ack frames settled together in one database call, each answered on its own.

    Each frame comes with the credit already given for it: messages pushed from the
    subscription's read-ahead when it came (Subscription.ahead). Its settlement gives the rest.
    """

    acks: list[tuple[frames.AckFrame, int]]

    @property
    def receipts(self) -> list[str]:
        return [r for f, _ in self.acks for r in f.receipts]

    @property
    def presumed(self) -> int:
        return sum(n for _, n in self.acks)

    def fits(self, frame: frames.AckFrame) -> bool:
        """Whether frame may join these in one call (at most FERRY_MAX_FETCH_MESSAGES)."""
        limit = ferry_settings.get("MAX_FETCH_MESSAGES")
        return len(self.receipts) + len(frame.receipts) <= limit

    def alone(self) -> "list[HeldAcks]":
        return [HeldAcks([one]) for one in self.acks]

    def answers(self, result: SettleResult) -> list[tuple[frames.AckFrame, SettleResult]]:
        """Each frame with its share of result, as if they had been settled one by one."""
        if len(self.acks) == 1:
            return [(self.acks[0][0], result)]
        stale = set(result.stale)
        earlier: set[str] = set()
        out = []
        for f, _ in self.acks:
            own = {r for r in f.receipts if r not in stale and r not in earlier}
            missed = dict.fromkeys(r for r in f.receipts if r not in own)
            earlier |= own
            out.append((f, SettleResult(settled=len(own), stale=tuple(missed))))
        return out


@dataclass
class Subscription:
    sub: str
    group: str
    topic: str
    topic_id: int
    member_id: str
    generation: int
    partitions: tuple[int, ...]
    # Messages the server may still push: prefetch, minus pushed, plus settled and granted.
    # A delivery takes what it may push from here before its database call and gives back
    # what it did not push, so two deliveries at once (the push task's and an ack's) never
    # push more than the credit together. An ack of messages lent from the read-ahead gives
    # its credit before it is stored (Subscription.lent); if the store finds one settled
    # meanwhile (by a REST ack of the same receipt), the credit goes below 0 until more acks.
    credit: int
    # prefetch plus what credit frames granted: pushed and unsettled messages plus credit.
    window: int
    # Credit the push task took for the delivery it is making (0 when it makes none).
    pushing: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    last_beat: float = 0.0
    # What the subscriber calls itself; a rejoin after an expiry keeps it.
    client: str = ""
    # Ack frames waiting to be settled with the next push or read (FERRY_WS_ACK_HOLD_MS), and
    # the timer that settles them if none comes first. Whoever takes them settles them.
    held_ack: HeldAcks | None = None
    held_timer: asyncio.TimerHandle | None = None
    # Messages delivered to this member beyond its credit (FERRY_WS_READ_AHEAD), in order: a
    # subscriber that acks each message as it comes gets the next from here, without a
    # database call; its acks are settled together with the next read. If some that were here
    # when ahead_timer was set still are when it fires (READ_AHEAD_LINGER_S at most), all go
    # back to the group: ahead_old were here then, ahead_taken have gone since.
    ahead: "deque[Delivery]" = field(default_factory=deque)
    ahead_timer: asyncio.TimerHandle | None = None
    ahead_old: int = 0
    ahead_taken: int = 0
    # A read that tops the read-ahead up is under way: acks wait for what it brings (held),
    # and so does the push task, rather than read beside it and push out of order.
    reading: bool = False
    # Receipts pushed while reading ahead, with their deadlines: an ack of one of them before
    # its deadline settles a message this subscriber holds, so its credit is given at once,
    # before the ack is stored. A receipt acked already, or not from here, gives none then.
    lent: dict[str, int] = field(default_factory=dict)
    # Set while the push task settles a held ack it took: what comes after waits for it.
    acking: asyncio.Event | None = None
    # A later generation an ack's delivery saw: the push task heartbeats to learn its
    # partitions and send `assigned` (an ack that delivers refreshes last_beat, so a member
    # busy acking would otherwise learn a rebalance only once idle).
    seen_generation: int = 0
    # The push task's last round had credit to spare and found nothing more to push, and no
    # wake-up came since: the credit an ack frees would find nothing either, so it does not
    # wake the task for a round (an empty delivery costs a database call of its own; a
    # subscriber that acks each message as it comes paid one per message). A layer event, a
    # new assignment or the heartbeat's timeout starts the next round as before.
    drained: bool = False

    def take_held_ack(self) -> HeldAcks | None:
        held, self.held_ack = self.held_ack, None
        if self.held_timer is not None:
            self.held_timer.cancel()
            self.held_timer = None
        return held

    def lend(self, deliveries: Sequence[Delivery]) -> None:
        if len(self.lent) > 2 * self.window + 64:
            self.lent.clear()  # receipts settled elsewhere (REST): forget them, give no credit
        for d in deliveries:
            self.lent[d.receipt] = d.deadline_ms

    def presume(self, receipts: list[str]) -> int:
        """How many of receipts settle messages lent here and still in their time (forgotten
        now: a second ack of one gives nothing)."""
        if not self.lent:
            return 0
        now = log.now_ms()
        return sum(1 for r in receipts if self.lent.pop(r, 0) > now)

    def drop_ahead(self) -> None:
        """Forget the read-ahead and the lent receipts: a leave or an expiry handed them back."""
        self.take_ahead()
        self.lent.clear()

    def take_ahead(self, n: int | None = None) -> list[Delivery]:
        """The first n messages read ahead (all by default); the timer stops once none is left."""
        count = len(self.ahead) if n is None else min(n, len(self.ahead))
        taken = [self.ahead.popleft() for _ in range(count)]
        self.ahead_taken += count
        if not self.ahead and self.ahead_timer is not None:
            self.ahead_timer.cancel()
            self.ahead_timer = None
        return taken
