"""The console's live socket: who may open it, and the nudge after a change (docs/console-ui.md)."""

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission, User

from broker.core import activity, keys, log, topics
from broker.core.records import NewMessage
from dashboard import consumers

pytestmark = pytest.mark.django_db(transaction=True)


def make_user(name: str, *, staff: bool = True, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(name, password="pw-" + name, is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return User.objects.get(pk=user.pk)  # fresh: permissions are cached per instance


async def open_socket(user: object) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(consumers.ConsoleConsumer.as_asgi(), "/ws/console/")
    communicator.scope["user"] = user  # type: ignore[typeddict-unknown-key]
    connected, _ = await communicator.connect()
    return communicator, connected


@pytest.fixture
def fast_live(settings):
    settings.FERRY_CONSOLE_LIVE_INTERVAL_SECONDS = 0.05


async def test_console_socket__refused_without_view_permission(fast_live):
    from django.contrib.auth.models import AnonymousUser

    nobody = await database_sync_to_async(make_user)("plain", staff=False)
    staff_without_role = await database_sync_to_async(make_user)("staff")
    for user in (AnonymousUser(), nobody, staff_without_role):
        communicator, connected = await open_socket(user)
        assert not connected
        await communicator.disconnect()


async def test_console_socket__nudges_after_a_produce(fast_live):
    viewer = await database_sync_to_async(make_user)("viewer", perms=("view_console",))
    communicator, connected = await open_socket(viewer)
    assert connected
    try:
        hello = await communicator.receive_json_from(timeout=2)
        assert hello == {"type": "hello", "interval_ms": 50}
        # The first check sets the baseline; let it run before changing anything.
        await asyncio.sleep(0.2)
        await database_sync_to_async(topics.create_topic)(keys.CONSOLE, "live-orders", 2)
        update = await communicator.receive_json_from(timeout=3)
        assert update["type"] == "update"
        assert "topic_list" in update["changed"]
        await database_sync_to_async(log.append_messages)(
            keys.CONSOLE, "live-orders", [NewMessage(b'{"n": 1}')]
        )
        update = await communicator.receive_json_from(timeout=3)
        assert update["changed"] == ["topics"]
        # Nothing changes: nothing is sent.
        assert await communicator.receive_nothing(timeout=0.3)
    finally:
        await communicator.disconnect()


async def test_console_socket__answers_ping(fast_live):
    operator = await database_sync_to_async(make_user)("operator", perms=("operate_console",))
    communicator, connected = await open_socket(operator)
    assert connected
    try:
        await communicator.receive_json_from(timeout=2)
        await communicator.send_json_to({"type": "ping"})
        assert await communicator.receive_json_from(timeout=2) == {"type": "pong"}
    finally:
        await communicator.disconnect()


def test_fingerprint__changed_areas(db, topic_factory):
    before = activity.fingerprint()
    assert before.changed_since(None) == ()
    topic = topic_factory(partitions=1)
    log.append_messages(keys.CONSOLE, topic.name, [NewMessage(b"1")])
    after = activity.fingerprint()
    assert set(after.changed_since(before)) == {"topics", "topic_list"}
    assert activity.fingerprint().changed_since(after) == ()


def test_console_consumer__uses_no_channel_layer():
    """It reads the database itself; with a layer, a Redis outage would end the page's socket
    (issue 17: channels closes the application with 1011 when the layer's receive fails)."""
    assert get_channel_layer(consumers.ConsoleConsumer.channel_layer_alias) is None
