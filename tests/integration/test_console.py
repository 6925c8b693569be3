"""The console in a real headless Chromium (Playwright, Debian's chromium) against a real Daphne.

Walks it as an operator would: log in, create a topic, watch counters move live, browse and
search messages, watch a group's lag fall, reset offsets with a preview, redrive a dead letter,
cancel a scheduled message, create and revoke a key, and find every action in the audit log.
With FERRY_SCREENSHOT_DIR set (scripts/screenshots), every page is saved there as a PNG.
"""

import asyncio
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Browser, Page, expect, sync_playwright

from broker.core import keys
from broker.core.records import Permission as KeyPermission
from tests.integration.conftest import ROOT, start_daphne, stop, wait_for_sessions_to_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PASSWORD = "console-password-1"
WAIT_MS = 15_000


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


def test_console_socket__session_and_origin_checked_by_daphne(console_url: str) -> None:
    """A real Daphne refuses the live socket without a console session or from another origin."""
    import orjson
    from websockets.exceptions import InvalidStatus

    make_user("watcher", perms=("view_console",))
    with httpx.Client(base_url=console_url) as client:
        client.get("/login/")
        answer = client.post(
            "/login/",
            data={
                "username": "watcher",
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
            headers={"Referer": f"{console_url}/login/"},
        )
        assert answer.status_code == 302
        cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    with pytest.raises(InvalidStatus) as anonymous:
        _handshake(console_url, {"Origin": console_url})
    assert anonymous.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as elsewhere:
        _handshake(console_url, {"Cookie": cookie, "Origin": "http://evil.example"})
    assert elsewhere.value.response.status_code == 403
    hello = _handshake(console_url, {"Cookie": cookie, "Origin": console_url})
    assert orjson.loads(hello) == {"type": "hello", "interval_ms": 300}
