"""The list pages read a bounded number of queries, however many topics, groups or rows exist.

A later benchmark runs every page over 1,000,000 messages, 100 groups and 10,000 dead letters;
these budgets keep each page from growing a query per row.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

JSON = "application/json"
LIST_PAGES = [
    "/",
    "/live/overview/",
    "/topics/",
    "/topics/orders/",
    "/topics/orders/live/",
    "/topics/orders/messages/",
    "/groups/",
    "/groups/g/",
    "/groups/g/live/",
    "/scheduled/",
    "/scheduled/live/",
    "/dead-letters/",
    "/dead-letters/live/",
    "/keys/",
    "/audit/",
]


def _more(api_client, topic_factory, n):
    """n more topics, groups reading them with committed offsets, dead letters and keys."""
    for i in range(n):
        topic_factory(f"extra-{i}", partitions=2)
        api_client.post(
            f"/api/v1/topics/extra-{i}/messages",
            {"messages": [{"value": i}] * 3 + [{"value": i, "delay_ms": 60_000}]},
            content_type=JSON,
        )
        member = {"topic": f"extra-{i}", "member_id": f"m{i}"}
        api_client.post(f"/api/v1/groups/x{i}/members", member, content_type=JSON)
        polled = api_client.post(
            f"/api/v1/groups/x{i}/poll", {**member, "max_messages": 3}, content_type=JSON
        ).json()["messages"]
        api_client.post(
            f"/api/v1/groups/x{i}/reject",
            {"receipts": [m["receipt"] for m in polled]},
            content_type=JSON,
        )


def _queries(client, url):
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("url", LIST_PAGES)
def test_page__queries_do_not_grow_with_the_data(
    admin_client, api_client, broker_data, topic_factory, url
):
    small = _queries(admin_client, url)
    _more(api_client, topic_factory, 8)
    large = _queries(admin_client, url)
    # The groups list reads each shown group's lag estimate (seconds behind): two queries per
    # row, so bounded by the page size (25), not by the number of groups.
    per_row = 2 * 8 if url == "/groups/" else 0
    assert large <= small + 2 + per_row, (small, large)
    assert large <= 60


def test_groups_list__page_bounds_the_estimates(
    admin_client, api_client, broker_data, topic_factory
):
    _more(api_client, topic_factory, 30)
    page = admin_client.get("/groups/")
    assert len(page.context["page"].items) == 25
    assert _queries(admin_client, "/groups/") <= 25 * 2 + 15
    second = admin_client.get("/groups/", {"page": 2})
    assert [r["info"].name for r in second.context["page"].items][-1] == "x9"
