"""Fixtures for the console's edge tests: signed-in users of each role and a broker with data.

pytest-django's admin_client is the superuser (both permissions).
"""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

JSON = "application/json"


def _user(name: str, *, staff: bool = True, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.fixture
def user_client(db: None) -> Callable[..., Client]:
    def make(name: str, **kwargs: Any) -> Client:
        client = Client(**kwargs.pop("client_options", {}))
        client.force_login(_user(name, **kwargs))
        return client

    return make


@pytest.fixture
def operator(user_client: Callable[..., Client]) -> Client:
    """A staff user with the operate permission (which implies view)."""
    return user_client("olga", perms=("operate_console",))


@pytest.fixture
def viewer(user_client: Callable[..., Client]) -> Client:
    """A staff user who may look but not act."""
    return user_client("vera", perms=("view_console",))


@pytest.fixture
def outsider(user_client: Callable[..., Client]) -> Client:
    """Signed in, but not staff."""
    return user_client("nora", staff=False, perms=("view_console", "operate_console"))


@pytest.fixture
def broker_data(api_client: Client, topic_factory: Callable[..., Any]) -> dict[str, Any]:
    """Topic "orders" (3 partitions, 6 messages), group "g" with 2 dead letters and committed
    offsets, and one scheduled message, all made through REST as a client would."""
    topic_factory("orders", partitions=3)
    messages = [{"value": {"n": n}, "key": f"k{n}", "tag": "t", "id": f"id-{n}"} for n in range(4)]
    messages += [{"value_b64": "AAEC/w==", "key": "bin"}, {"value": "text", "headers": {"h": "v"}}]
    api_client.post("/api/v1/topics/orders/messages", {"messages": messages}, content_type=JSON)
    api_client.post(
        "/api/v1/topics/orders/messages",
        {"messages": [{"value": {"later": True}, "delay_ms": 3_600_000}]},
        content_type=JSON,
    )
    api_client.post(
        "/api/v1/groups/g/members", {"topic": "orders", "member_id": "m"}, content_type=JSON
    )
    body = {"topic": "orders", "member_id": "m", "max_messages": 2}
    polled = api_client.post("/api/v1/groups/g/poll", body, content_type=JSON).json()
    receipts = [m["receipt"] for m in polled["messages"]]
    api_client.post(
        "/api/v1/groups/g/reject", {"receipts": receipts, "error": "bad"}, content_type=JSON
    )
    letters = api_client.get("/api/v1/groups/g/dlq").json()["items"]
    scheduled = api_client.get("/api/v1/topics/orders/scheduled").json()
    return {
        "letters": [d["id"] for d in letters],
        "scheduled": [s["id"] for s in scheduled["scheduled"]],
    }
