"""The console in a real headless Chromium (Playwright, Debian's chromium) against a real Daphne.

Walks it as an operator would: log in, create a topic, watch counters move live, browse and
search messages, watch a group's lag fall, reset offsets with a preview, redrive a dead letter,
cancel a scheduled message, create and revoke a key, and find every action in the audit log.
With FERRY_SCREENSHOT_DIR set (scripts/screenshots), every page is saved there as a PNG.
"""

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Browser, Page, expect, sync_playwright

from broker.core import keys
from broker.core.records import Permission as KeyPermission
from tests.integration.conftest import (
    ROOT,
    sign_in,
    start_daphne,
    stop,
    wait_for_sessions_to_end,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PASSWORD = "console-password-1"
WAIT_MS = 15_000
# Live regions refresh within a second or two; a busy CI machine gets room.
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module: Debian's, installed by scripts/chromium if missing."""
    found = subprocess.run(
        [str(ROOT / "scripts" / "chromium"), "ensure"], check=True, capture_output=True, text=True
    )
    # Playwright's sync API runs an event loop on this thread for the whole module, so Django
    # would take every ORM call here (test data, the database flush after each test) for async
    # code; they are plain sync calls between page steps.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(
            executable_path=found.stdout.strip().splitlines()[-1],
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def console_url(transactional_db: None) -> Iterator[str]:
    """A Daphne running the background jobs quickly (samples, redrives, live checks)."""
    proc, url = start_daphne(
        FERRY_BACKGROUND_IN_PROCESS="1",
        FERRY_SAMPLE_INTERVAL_SECONDS="1",
        FERRY_REDRIVE_INTERVAL_SECONDS="0.2",
        FERRY_CONSOLE_LIVE_INTERVAL_SECONDS="0.3",
    )
    try:
        yield url
    finally:
        stop(proc)
        wait_for_sessions_to_end()


def make_user(
    name: str, *, staff: bool = True, superuser: bool = False, perms: tuple[str, ...] = ()
) -> User:
    user = User.objects.create_user(name, password=PASSWORD, is_staff=staff, is_superuser=superuser)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def log_in(browser: Browser, url: str, username: str) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    # Counts the live refreshes the page asks for (ferry:update events).
    page.add_init_script(
        "window.ferryUpdates = 0; document.addEventListener('DOMContentLoaded', () =>"
        " document.body.addEventListener('ferry:update', () => window.ferryUpdates++));"
    )
    page.goto(f"{url}/")
    expect(page).to_have_url(f"{url}/login/?next=/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("#login-submit")
    return page


def screenshot(page: Page, name: str) -> None:
    directory = os.environ.get("FERRY_SCREENSHOT_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(directory) / f"{name}.png"), full_page=True)


def api(url: str, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


def status_with_key(url: str, secret: str, path: str) -> int:
    with api(url, secret) as client:
        return client.get(path).status_code


def admin_key(name: str = "e2e") -> str:
    _, secret = keys.create_api_key(keys.CONSOLE, name, [KeyPermission("admin", "*")])
    return secret


def test_console__who_may_see_and_act(browser: Browser, console_url: str) -> None:
    make_user("plain", staff=False)
    make_user("viewer", perms=("view_console",))
    make_user("operator", superuser=True)

    anonymous = browser.new_page()
    anonymous.goto(f"{console_url}/topics/")
    expect(anonymous).to_have_url(f"{console_url}/login/?next=/topics/")
    screenshot(anonymous, "login")
    anonymous.close()

    plain = log_in(browser, console_url, "plain")
    response = plain.goto(f"{console_url}/")
    assert response is not None
    assert response.status == 403
    plain.close()

    viewer = log_in(browser, console_url, "viewer")
    expect(viewer.locator("#live-status")).to_have_text("live")
    # Once its socket is open the page refreshes: what changed since it was rendered and before
    # the socket listened is never nudged.
    viewer.wait_for_function("window.ferryUpdates >= 1")
    expect(viewer.get_by_test_id("user")).to_contain_text("view only")
    viewer.goto(f"{console_url}/topics/")
    expect(viewer.locator("#topic-create-form")).to_have_count(0)
    # The same POST an operator's form sends is refused.
    token = viewer.context.cookies()
    csrf = next(c["value"] for c in token if c["name"] == "csrftoken")
    refused = viewer.request.post(
        f"{console_url}/topics/create/",
        form={"name": "sneaky", "partitions": "1"},
        headers={"X-CSRFToken": csrf, "Referer": f"{console_url}/topics/"},
    )
    assert refused.status == 403
    viewer.close()


# The server's answer to any console URL while its database is away (tests/dashboard/
# test_outages.py, and tests/integration/test_faults.py with PostgreSQL stopped).
OUTAGE = {
    "error": {
        "code": "unavailable",
        "message": "The broker cannot reach its database. Retry after 1 s; "
        "a retry with the same message ids is safe.",
        "detail": {"retry_after": 1, "dependency": "database"},
    }
}


def test_console__a_refresh_answered_503_shows_the_outage_until_one_succeeds(
    browser: Browser, console_url: str
) -> None:
    """The page keeps what it showed and says why it stands still (docs/console-ui.md#outages).

    Here the browser's answer to one live refresh is the outage's 503, as the server sends it.
    """
    make_user("watcher", perms=("view_console",))
    page = log_in(browser, console_url, "watcher")
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.get_by_test_id("overview-live")).to_be_visible()

    def refresh_until(condition: str) -> None:
        # A refresh asked while the region's first one is on the way is dropped by htmx when
        # that one swaps the region out: ask again until the page shows the answer.
        deadline = time.monotonic() + WAIT_MS / 1000
        while not page.evaluate(condition):
            assert time.monotonic() < deadline, f"timed out waiting for {condition}"
            page.evaluate("document.body.dispatchEvent(new CustomEvent('ferry:update'))")
            page.wait_for_timeout(300)

    page.route(
        "**/live/overview/",
        lambda route: route.fulfill(
            status=503,
            content_type="application/json",
            headers={"Retry-After": "1"},
            body=json.dumps(OUTAGE),
        ),
    )
    refresh_until("document.getElementById('outage') !== null")
    expect(page.get_by_test_id("outage")).to_contain_text("cannot reach its database")
    expect(page.get_by_test_id("overview-live")).to_be_visible()
    screenshot(page, "outage")

    page.unroute("**/live/overview/")
    refresh_until("document.getElementById('outage') === null")
    page.close()


def test_console__a_group_behind_retention_shows_what_it_skipped(
    browser: Browser, console_url: str
) -> None:
    """DESIGN.md, Retention: a consumer behind the start offset is moved to it, visibly."""
    make_user("watcher", perms=("view_console",))
    with api(console_url, admin_key()) as rest:
        topic = {"name": "short", "capacity": 2, "overflow_policy": "drop_oldest"}
        assert rest.post("/topics", json=topic).status_code == 201
        commit = {"topic": "short", "offsets": [{"partition": 0, "offset": 0}]}
        assert rest.post("/groups/late/commit", json=commit).status_code == 200
        produced = {"messages": [{"value": n} for n in range(5)]}
        assert rest.post("/topics/short/messages", json=produced).status_code == 200
    page = log_in(browser, console_url, "watcher")
    page.goto(f"{console_url}/groups/late/")

    expect(page.get_by_test_id("skipped-by-retention")).to_have_text("3 skipped by retention")
    expect(page.get_by_test_id("group-topic-skipped")).to_contain_text(
        "Retention removed 3 messages of short before this group settled them"
    )
    page.close()


def wait_for(condition: Any, what: str) -> None:
    expect(condition).to_be_visible(timeout=WAIT_MS)


def _handshake(url: str, headers: dict[str, str]) -> Any:
    """Open /ws/console/ and read its first frame, on a thread of its own (Playwright's loop
    may be running on this one)."""
    import websockets

    async def open_and_read() -> Any:
        async with websockets.connect(
            url.replace("http://", "ws://") + "/ws/console/", additional_headers=headers
        ) as socket:
            return await socket.recv()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, open_and_read()).result()


@contextlib.contextmanager
def logged_in(url: str, username: str) -> Iterator[httpx.Client]:
    """An HTTP client with a console session of the user (password PASSWORD)."""
    with httpx.Client(base_url=url) as client:
        assert sign_in(client, username, PASSWORD, url).status_code == 302
        yield client


def test_console_socket__session_and_origin_checked_by_daphne(console_url: str) -> None:
    """A real Daphne refuses the live socket without a console session or from another origin."""
    import orjson
    from websockets.exceptions import InvalidStatus

    make_user("watcher", perms=("view_console",))
    with logged_in(console_url, "watcher") as client:
        cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    with pytest.raises(InvalidStatus) as anonymous:
        _handshake(console_url, {"Origin": console_url})
    assert anonymous.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as elsewhere:
        _handshake(console_url, {"Cookie": cookie, "Origin": "http://evil.example"})
    assert elsewhere.value.response.status_code == 403
    hello = _handshake(console_url, {"Cookie": cookie, "Origin": console_url})
    assert orjson.loads(hello) == {"type": "hello", "interval_ms": 300}


def test_console_pages__borrow_pooled_connections(transactional_db: None) -> None:
    """On PostgreSQL a console page borrows a connection from the process's pool (on by
    default): the server's sessions stay the same few, however many pages are served. With
    FERRY_DB_POOL_SIZE=0, one session is opened and ended per page, or more."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the pool is PostgreSQL's")
    make_user("pooled", perms=("view_console",))

    def sessions_for_20_pages(pool_size: str | None = None) -> int:
        env = {} if pool_size is None else {"FERRY_DB_POOL_SIZE": pool_size}
        proc, url = start_daphne(None, **env)
        try:
            with logged_in(url, "pooled") as client:
                before = sessions_opened()
                for _ in range(20):
                    assert client.get("/topics/").status_code == 200
                return sessions_opened() - before
        finally:
            stop(proc)
            wait_for_sessions_to_end()

    # None, or the pool's first few.
    assert sessions_for_20_pages() <= 5
    # Without the pool: 50 for these 20 pages.
    assert sessions_for_20_pages("0") >= 20


def sessions_opened() -> int:
    """Sessions the server has opened on the test database so far (its statistics are written
    by the backends a moment late: wait for them)."""
    from django.db import connection

    time.sleep(1.5)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def confirm_and_expect_success(page: Page) -> None:
    """Accept the console's confirm step; the action answers with a new page and its message."""
    with page.expect_navigation():
        page.click("#confirm-ok")
    expect(page.get_by_test_id("flash-success").last).to_be_visible()


def open_panel(page: Page, panel_id: str) -> None:
    """Open a <details> action panel unless the page opened it already (e.g. an empty list)."""
    panel = page.locator(f"#{panel_id}")
    if panel.get_attribute("open") is None:
        panel.locator("> summary").click()


def test_console__an_operator_walks_through(browser: Browser, console_url: str) -> None:
    make_user("operator", superuser=True)
    with api(console_url, admin_key()) as rest:
        walk(browser, console_url, rest)


def walk(browser: Browser, console_url: str, rest: httpx.Client) -> None:
    page = log_in(browser, console_url, "operator")
    expect(page.locator("#live-status")).to_have_text("live")

    # Create a topic from its form, through the confirm step.
    page.goto(f"{console_url}/topics/")
    open_panel(page, "create-topic")
    page.fill("#topic-create-name", "orders")
    page.fill("#topic-create-partitions", "2")
    page.click("#topic-create-submit")
    confirm_and_expect_success(page)

    # Produce over REST: the topic page's counters move without a reload.
    page.goto(f"{console_url}/topics/orders/")
    expect(page.locator("#topic-message-count")).to_have_text("0")
    produced = rest.post(
        "/topics/orders/messages",
        json={
            "messages": [
                {
                    "value": {"order": i},
                    "key": f"customer-{i % 3}",
                    "id": f"order-{i}",
                    "tag": "paid",
                }
                for i in range(30)
            ]
        },
    )
    assert produced.status_code == 200
    expect(page.locator("#topic-message-count")).to_have_text("30")

    # Browse, search by key and by id, and view a binary message with its lifecycle.
    binary = rest.post(
        "/topics/orders/messages",
        json={"messages": [{"value_b64": "AAEC/w==", "partition": 1, "key": "raw"}]},
    )
    assert binary.status_code == 200, binary.text
    raw_offset = binary.json()["results"][0]["offset"]
    page.goto(f"{console_url}/topics/orders/messages/")
    expect(page.locator("#messages-table tr[data-offset]")).to_have_count(31)
    screenshot(page, "messages")
    page.select_option("#search-field", "key")
    page.fill("#search-q", "customer-1")
    page.click("#search-submit")
    expect(page.locator("#messages-table tr[data-offset]")).to_have_count(10)
    page.select_option("#search-field", "id")
    page.fill("#search-q", "order-7")
    page.click("#search-submit")
    expect(page.locator("#messages-table tr[data-offset]")).to_have_count(1)
    page.goto(f"{console_url}/topics/orders/messages/1/{raw_offset}/")
    expect(page.locator("#message-value-hex")).to_contain_text("0001 02ff")
    expect(page.locator("#message-value-base64")).to_contain_text("AAEC/w==")
    screenshot(page, "message")

    # A consumer group's lag appears, then falls live as a member acks.
    joined = rest.post("/groups/billing/members", json={"topic": "orders", "member_id": "w1"})
    assert joined.status_code == 201
    polled = rest.post(
        "/groups/billing/poll", json={"topic": "orders", "member_id": "w1", "max_messages": 10}
    )
    receipts = [m["receipt"] for m in polled.json()["messages"]]
    page.goto(f"{console_url}/groups/billing/")
    total = page.locator(
        '[data-testid=group-partitions][data-topic="orders"] [data-testid=topic-lag-total]'
    )
    expect(total).to_have_text("31")
    assert rest.post("/groups/billing/ack", json={"receipts": receipts}).status_code == 200
    expect(total).to_have_text("21")

    # Reset the group's offsets to the end, with a preview of what moves first.
    rest.delete("/groups/billing/members/w1")
    open_panel(page, "group-reset")
    page.select_option("#reset-topic", "orders")
    page.select_option("#reset-to", "latest")
    page.click("#reset-preview-submit")
    expect(page.locator("#reset-preview-table")).to_be_visible()
    expect(page.locator("#reset-preview-table")).to_contain_text("+")
    page.click("#reset-submit")
    confirm_and_expect_success(page)
    expect(total).to_have_text("0")

    # A dead letter is redriven from the page, then consumed.
    rest.post("/groups/audit/members", json={"topic": "orders", "member_id": "a1"})
    rejected = rest.post(
        "/groups/audit/poll", json={"topic": "orders", "member_id": "a1", "max_messages": 1}
    ).json()["messages"][0]
    rest.post("/groups/audit/reject", json={"receipts": [rejected["receipt"]]})
    page.goto(f"{console_url}/dead-letters/?group=audit")
    letter = page.locator("#dead-letters-table tr[data-dead-letter-id]")
    expect(letter).to_have_count(1)
    screenshot(page, "dead-letters")
    page.get_by_test_id("dead-letter-redrive-one").click()
    # A live update while the confirm step is open must not swap the form out from under it.
    page.evaluate(
        "document.body.dispatchEvent(new CustomEvent('ferry:update', {detail: {changed: []}}))"
    )
    page.wait_for_timeout(1000)
    confirm_and_expect_success(page)
    expect(letter).to_have_count(0)
    again = rest.post(
        "/groups/audit/poll", json={"topic": "orders", "member_id": "a1", "max_messages": 1}
    ).json()["messages"]
    assert [(m["partition"], m["offset"]) for m in again] == [
        (rejected["partition"], rejected["offset"])
    ]

    # A scheduled message is cancelled.
    rest.post(
        "/topics/orders/messages",
        json={"messages": [{"value": {"later": 1}, "delay_ms": 3_600_000}]},
    )
    page.goto(f"{console_url}/scheduled/")
    scheduled = page.locator("#scheduled-table tr[data-scheduled-id]")
    expect(scheduled).to_have_count(1)
    screenshot(page, "scheduled")
    page.get_by_test_id("scheduled-cancel").click()
    confirm_and_expect_success(page)
    expect(scheduled).to_have_count(0)

    # An open transaction is listed with its age, and committed from the page: its half
    # message becomes visible at once.
    begun = rest.post(
        "/transactions",
        json={
            "producer_id": "billing-1",
            "timeout_ms": 3_600_000,
            "topic": "orders",
            "messages": [{"value": {"invoice": 7}, "partition": 1}],
        },
    )
    assert begun.status_code == 201, begun.text
    end_before = rest.get("/topics/orders/offsets").json()["partitions"][1]["end_offset"]
    page.goto(f"{console_url}/transactions/")
    row = page.locator(f'#transactions-table tr[data-transaction-id="{begun.json()["id"]}"]')
    expect(row).to_contain_text("billing-1")
    expect(row.get_by_test_id("transaction-age")).to_be_visible()
    screenshot(page, "transactions")
    row.get_by_test_id("transaction-commit").click()
    confirm_and_expect_success(page)
    expect(row).to_have_count(0)
    end_after = rest.get("/topics/orders/offsets").json()["partitions"][1]["end_offset"]
    assert end_after == end_before + 1

    # A key is created (its secret shown once, and it works), then revoked.
    page.goto(f"{console_url}/keys/")
    open_panel(page, "create-key")
    page.fill("#key-create-name", "shipping-service")
    page.fill("#key-create-permissions", "consume:orders")
    page.click("#key-create-submit")
    confirm_and_expect_success(page)
    secret = page.locator("#new-key-secret").inner_text()
    assert status_with_key(console_url, secret, "/topics/orders") == 200
    screenshot(page, "keys")
    page.locator('#keys-table tr[data-key="shipping-service"] [data-testid=key-revoke]').click()
    confirm_and_expect_success(page)
    assert status_with_key(console_url, secret, "/topics/orders") == 401

    # Every action is in the audit log, by the operator, from the dashboard.
    page.goto(f"{console_url}/audit/")
    actions = page.locator("#audit-table tr[data-action]")
    for action in (
        "topic.create",
        "group.reset",
        "dlq.redrive",
        "scheduled.cancel",
        "transaction.commit",
        "key.create",
        "key.revoke",
    ):
        expect(page.locator(f'#audit-table tr[data-action="{action}"]')).to_contain_text("operator")
    assert actions.count() >= 7
    screenshot(page, "audit")

    # The overview, the lists and the charts, once the samples have come in.
    page.goto(f"{console_url}/")
    expect(page.locator("#count-topics")).to_have_text("1")
    # This server runs the background jobs (FERRY_BACKGROUND_IN_PROCESS): on time, and by it.
    released = page.locator('#overview-jobs tr[data-job="release_due"]')
    expect(released.get_by_test_id("job-state")).to_have_text("ok")
    expect(released.locator("td").nth(3)).to_have_text(re.compile(r"^\S+:\d+$"))  # host:pid
    screenshot(page, "overview")
    page.goto(f"{console_url}/topics/")
    screenshot(page, "topics")
    page.goto(f"{console_url}/groups/")
    screenshot(page, "groups")
    # The history charts draw once the server's sampling job (every second here) has run.
    page.goto(f"{console_url}/groups/billing/")
    expect(page.locator("#group-chart .uplot")).to_be_visible()
    screenshot(page, "group")
    page.goto(f"{console_url}/topics/orders/")
    expect(page.locator("#topic-chart .uplot")).to_be_visible()
    screenshot(page, "topic")
    page.close()
