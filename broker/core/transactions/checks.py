"""Timeouts and check-back: the check_transactions job (docs/transactions.md#check-back).

Open transactions past their timeout are claimed with SKIP LOCKED and a short lease, renewed
just before each callback, so one runner checks each at a time; the callback is called with no
lock held, and its answer applied under the transaction's row lock (a producer's own commit in
between wins).
"""

import json
import urllib.error
import urllib.request

from django.db import transaction

from broker import models
from broker import settings as ferry_settings
from broker.core import errors, keys, log
from broker.core.records import TransactionCheck
from broker.core.transactions import commit, outbox, staging

State = models.Transaction.State
Kind = models.Transaction.Kind
# Check-back waits at most this long between two checks of one transaction.
MAX_CHECK_BACKOFF_MS = 60_000
# Open transactions claimed per check round, and ended ones purged per round.
CHECK_BATCH = 20
PURGE_BATCH = 1000
ANSWERS = ("commit", "rollback", "unknown")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A check-back is answered where it was sent: following a redirect (urllib turns the POST
    into a GET) would let a producer's check_url make the broker read another service."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


# The answer's status and size go to last_check, never its body: a check_url pointed at
# another service must not read it back through GET /transactions/{id}.
_OPENER = urllib.request.build_opener(_NoRedirects)


def _ask(row: models.Transaction) -> tuple[str, str]:
    """POST the check to the producer's check_url: (answer, what happened). No lock held."""
    body = json.dumps(
        {
            "transaction_id": row.id,
            "producer_id": row.producer_id,
            "epoch": row.epoch,
            "created_ms": row.created_ms,
            "checks": row.checks + 1,
            "messages": row.message_count,
        }
    ).encode()
    request = urllib.request.Request(  # noqa: S310 (http and https only: _validate_begin)
        row.check_url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "ferry-check-back"},
    )
    timeout = float(ferry_settings.get("TRANSACTION_CHECK_TIMEOUT_SECONDS"))
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            text = response.read(4096).decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return "failed", f"check failed: HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return "failed", f"check failed: {exc}"[:500]
    answer = text.lower()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("status"), str):
        answer = parsed["status"].lower()
    if answer not in ANSWERS:
        return "failed", f"check answered {len(text)} characters, not commit, rollback or unknown"
    return answer, f"check answered {answer}"


def _lease_ms() -> int:
    # Outlasts one ask (bounded by its timeout) and its resolve.
    return int(float(ferry_settings.get("TRANSACTION_CHECK_TIMEOUT_SECONDS")) * 2000) + 1000


def _claim_checks(now: int) -> list[models.Transaction]:
    """Open transactions past their deadline whose check is due, held by this runner a while.

    Each returned row's checking_until_ms is the lease this runner holds it by (see _renew).
    """
    lease_ms = _lease_ms()
    with transaction.atomic(durable=True):
        # SKIP LOCKED: each transaction is checked by one runner at a time (the lease).
        claimed = list(
            models.Transaction.objects.select_for_update(skip_locked=True)
            .filter(kind=Kind.PRODUCER, state=State.OPEN, deadline_ms__lte=now)
            .exclude(check_url="")
            .exclude(next_check_ms__gt=now)
            .exclude(checking_until_ms__gt=now)
            .order_by("deadline_ms", "id")[:CHECK_BATCH]
        )
        until = now + lease_ms
        models.Transaction.objects.filter(id__in=[r.id for r in claimed]).update(
            checking_until_ms=until
        )
    for row in claimed:
        row.checking_until_ms = until
    return claimed


def _renew(row: models.Transaction) -> bool:
    """Extend this runner's lease on row for one ask; False if it lost the lease (or row ended).

    A round of slow callbacks may outlast the claim's lease, and another runner claim the rest:
    the conditional update makes sure only the lease's holder asks (each call counts once).
    """
    until = log.now_ms() + _lease_ms()
    with transaction.atomic(durable=True):
        renewed = models.Transaction.objects.filter(
            id=row.id, state=State.OPEN, checking_until_ms=row.checking_until_ms
        ).update(checking_until_ms=until)
    if renewed:
        row.checking_until_ms = until
    return bool(renewed)


def _resolve(claimed: models.Transaction, answer: str, what: str, tally: dict[str, int]) -> None:
    now = log.now_ms()
    try:
        with transaction.atomic(durable=True):
            row = models.Transaction.objects.select_for_update().filter(id=claimed.id).first()
            if row is None or row.state != State.OPEN:
                return  # its producer (or an operator) ended it meanwhile
            if row.checking_until_ms != claimed.checking_until_ms:
                return  # our lease ran out and another runner asks now: its answer counts
            row.checks += 1
            row.last_check = what
            if answer == "commit":
                commit.commit_locked(keys.CONSOLE, row, "check_back", now)
                row.save(update_fields=["checks", "last_check"])
                tally["committed"] += 1
                return
            if answer == "rollback":
                row.save(update_fields=["checks", "last_check"])
                staging.end(row, State.ROLLED_BACK, "check_back", now)
                tally["rolled_back"] += 1
                return
            _after_unknown(row, now, tally)
    except commit.Abort as abort:
        commit.rollback_aborted(claimed.id, abort)
        tally["rolled_back"] += 1
    except errors.BrokerError as exc:
        # The callback said commit and the commit failed (a full topic): count it as a check.
        with transaction.atomic(durable=True):
            row = models.Transaction.objects.select_for_update().filter(id=claimed.id).first()
            if (
                row is not None
                and row.state == State.OPEN
                and row.checking_until_ms == claimed.checking_until_ms
            ):
                row.checks += 1
                row.last_check = f"commit failed: {exc.code}: {exc.message}"[:500]
                _after_unknown(row, now, tally)


def _after_unknown(row: models.Transaction, now: int, tally: dict[str, int]) -> None:
    """An unknown or failed check: try later, or roll back after the last. Caller holds the lock."""
    if row.checks >= int(ferry_settings.get("TRANSACTION_MAX_CHECKS")):
        row.save(update_fields=["checks", "last_check"])
        staging.end(row, State.ROLLED_BACK, "check_back_unresolved", now)
        tally["rolled_back"] += 1
        return
    backoff = int(ferry_settings.get("TRANSACTION_CHECK_BACKOFF_MS")) * 2 ** (row.checks - 1)
    row.next_check_ms = now + min(MAX_CHECK_BACKOFF_MS, backoff)
    row.checking_until_ms = None
    row.save(update_fields=["checks", "last_check", "next_check_ms", "checking_until_ms"])


def _roll_back_timed_out(now: int) -> int:
    """Open transactions past their deadline with nobody to ask: rolled back (reason timeout)."""
    with transaction.atomic(durable=True):
        rows = list(
            models.Transaction.objects.select_for_update(skip_locked=True)
            .filter(kind=Kind.PRODUCER, state=State.OPEN, deadline_ms__lte=now, check_url="")
            .order_by("id")[:PURGE_BATCH]
        )
        for row in rows:
            staging.end(row, State.ROLLED_BACK, "timeout", now)
    return len(rows)


def _purge_ended(now: int) -> int:
    cutoff = now - int(ferry_settings.get("TRANSACTION_RETENTION_SECONDS")) * 1000
    with transaction.atomic(durable=True):
        ids = list(
            models.Transaction.objects.filter(
                state__in=[State.COMMITTED, State.ROLLED_BACK], ended_ms__lt=cutoff
            ).values_list("id", flat=True)[:PURGE_BATCH]
        )
        models.Transaction.objects.filter(id__in=ids).delete()
    return len(ids)


def check_transactions() -> int:
    """The periodic job (run_checks); returns how many transactions it promoted or ended."""
    done = run_checks()
    return done.committed + done.rolled_back + done.promoted + done.purged


def run_checks() -> TransactionCheck:
    """Promote committed outbox writes, time out, check back, purge old ended transactions."""
    now = log.now_ms()
    promoted = outbox.promote_prepared()
    rolled_back = _roll_back_timed_out(now)
    tally = {"committed": 0, "rolled_back": 0}
    checked = 0
    for row in _claim_checks(now):
        if not _renew(row):
            continue  # another runner holds it now, or it ended
        answer, what = _ask(row)
        _resolve(row, answer, what, tally)
        checked += 1
    return TransactionCheck(
        committed=tally["committed"],
        rolled_back=rolled_back + tally["rolled_back"],
        checked=checked,
        promoted=promoted,
        purged=_purge_ended(now),
    )
