"""Every console page renders, with data and on an empty broker (empty states)."""

import pytest

from broker import models
from broker.core import log

PAGES_EMPTY = [
    "/",
    "/live/overview/",
    "/topics/",
    "/groups/",
    "/scheduled/",
    "/scheduled/live/",
    "/dead-letters/",
    "/dead-letters/live/",
    "/keys/",
    "/audit/",
]
PAGES_WITH_DATA = [
    *PAGES_EMPTY,
    "/topics/orders/",
    "/topics/orders/live/",
    "/topics/orders/series.json",
    "/topics/orders/messages/",
    "/topics/orders/messages/?order=oldest",
    "/topics/orders/messages/?partition=0&offset=0",
    "/topics/orders/messages/?at=2020-01-01T00:00",
    "/topics/orders/messages/?field=key&q=k1",
    "/topics/orders/messages/?field=id&q=id-2",
    "/topics/orders/messages/?field=tag&q=t",
    "/topics/orders/messages/?field=header&q=h=v",
    "/groups/g/",
    "/groups/g/live/",
    "/groups/g/series.json",
    "/groups/g/reset/preview/?topic=orders&to=earliest",
    "/dead-letters/?group=g",
    "/dead-letters/?group=g&topic=orders&reason=rejected",
    "/dead-letters/count/?group=g",
    "/scheduled/?topic=orders",
]


@pytest.mark.parametrize("url", PAGES_EMPTY)
def test_page__empty_broker(admin_client, url):
    response = admin_client.get(url)
    assert response.status_code == 200, response.content[:500]


@pytest.mark.parametrize("url", PAGES_WITH_DATA)
def test_page__with_data(admin_client, broker_data, url):
    response = admin_client.get(url)
    assert response.status_code == 200, response.content[:2000]


@pytest.mark.parametrize("page", ["0", "-3", "abc", "99999"])
def test_list__page_numbers_are_clamped(admin_client, broker_data, page):
    response = admin_client.get("/topics/", {"page": page})
    assert response.status_code == 200
    assert response.context["page"].number == 1


def test_topics__search_and_sort(admin_client, broker_data, topic_factory):
    topic_factory("alpha")
    topic_factory("beta-orders")
    names = [t.name for t in admin_client.get("/topics/", {"q": "ORD"}).context["page"].items]
    assert names == ["beta-orders", "orders"]
    names = [t.name for t in admin_client.get("/topics/", {"sort": "-name"}).context["page"].items]
    assert names == ["orders", "beta-orders", "alpha"]


def test_topics__pages_of_25(admin_client, topic_factory):
    for i in range(30):
        topic_factory(f"t{i:02d}")
    first = admin_client.get("/topics/").context["page"]
    second = admin_client.get("/topics/", {"page": 2}).context["page"]
    assert (len(first.items), len(second.items), first.pages) == (25, 5, 2)
    assert b'data-testid="pager-next"' in admin_client.get("/topics/").content


def test_messages__cursor_pages_continue(admin_client, api_client, topic_factory):
    topic_factory("many")
    api_client.post(
        "/api/v1/topics/many/messages",
        {"messages": [{"value": n} for n in range(120)]},
        content_type="application/json",
    )
    first = admin_client.get("/topics/many/messages/")
    assert len(first.context["items"]) == 50
    second = admin_client.get(first.context["next_url"].replace("?", "/topics/many/messages/?", 1))
    offsets = [m.offset for m in first.context["items"]] + [
        m.offset for m in second.context["items"]
    ]
    assert offsets == list(range(119, 19, -1))


def test_audit__filters_and_pages(admin_client, operator, db):
    for i in range(55):
        operator.post("/topics/create/", {"name": f"a{i}"})
    page = admin_client.get("/audit/", {"action": "topic.create"})
    assert len(page.context["items"]) == 50
    assert page.context["next_url"]
    older = admin_client.get("/audit/" + page.context["next_url"])
    assert len(older.context["items"]) == 5
    assert not admin_client.get("/audit/", {"actor": "user:nobody"}).context["items"]


def test_dead_letters__filter_by_topic_and_reason(admin_client, broker_data):
    page = admin_client.get("/dead-letters/", {"group": "g", "reason": "expired"})
    assert page.context["total"] == 0
    page = admin_client.get("/dead-letters/", {"group": "g", "reason": "rejected"})
    assert page.context["total"] == 2


def test_live_partials__are_htmx_swappable(admin_client, broker_data):
    for url in ["/live/overview/", "/topics/orders/live/", "/groups/g/live/", "/scheduled/live/"]:
        body = admin_client.get(url).content.decode()
        assert 'hx-trigger="ferry:update' in body
        assert "<html" not in body


def test_base__has_the_live_contract(admin_client, db):
    body = admin_client.get("/").content.decode()
    assert 'id="live-status"' in body
    assert "console/live.js" in body
    assert "favicon.svg" in body
    assert "vendor/htmx/htmx.min.js" in body


def test_overview__shows_the_groups_furthest_behind(admin_client, broker_data, topic_factory):
    for i in range(16):
        topic_factory(f"more-{i}")
    page = admin_client.get("/")
    assert len(page.context["topics"]) == 15
    assert page.context["topics"][0]["info"].name == "orders"
    assert page.context["more_topics"] == 2
    assert b'data-testid="more-topics"' in page.content


def test_topic_page__shows_the_stats_jobs_figures(admin_client, broker_data, topic_factory):
    """The Spark stats job's per-minute figures, keyed by topic, newest figure per minute."""
    import orjson

    from broker.core import keys, log
    from broker.core.records import NewMessage

    topic_factory("ferry-stats")

    def figure(minute: str, messages: int) -> NewMessage:
        value = {
            "topic": "orders",
            "minute": minute,
            "messages": messages,
            "bytes": messages * 10,
            "distinct_keys": 2,
            "top_keys": [{"key": "k1", "count": messages - 1}],
            "groups": [{"group": "g", "consume_delay_ms": 1500, "lag": messages}],
        }
        return NewMessage(orjson.dumps(value), key="orders")

    log.append_messages(
        keys.CONSOLE,
        "ferry-stats",
        [
            figure("2026-11-23T14:01Z", 5),
            figure("2026-11-23T14:02Z", 3),
            # A rerun over grown data: the minute's newer figure wins.
            figure("2026-11-23T14:02Z", 7),
            NewMessage(b"not a figure", is_json=False, key="orders"),
        ],
    )
    response = admin_client.get("/topics/orders/")
    stats = response.context["stats"]
    assert [(s.minute, s.messages) for s in stats] == [
        ("2026-11-23T14:02Z", 7),
        ("2026-11-23T14:01Z", 5),
    ]
    assert b'data-minute="2026-11-23T14:02Z"' in response.content
    assert stats[0].groups == (("g", 1500, 7),)


def test_topic_page__explains_the_stats_job_when_there_are_no_figures(admin_client, broker_data):
    response = admin_client.get("/topics/orders/")
    assert response.context["stats"] == ()
    assert b"pipeline stats --topic orders" in response.content


def test_topics__deletion_in_progress_shown(admin_client, topic_factory, console):
    from broker.core import topics

    topic_factory("scratch")
    topics.delete_topic(console, "scratch")

    page = admin_client.get("/topics/")

    assert b'data-testid="topic-deletions"' in page.content
    assert b"<strong>scratch</strong>" in page.content
    topics.run_topic_deletions()
    assert b"topic-deletions" not in admin_client.get("/topics/").content


@pytest.mark.django_db
def test_group_page__shows_what_retention_removed_before_the_group_read_it(
    viewer, api_client, topic_factory
):
    """DESIGN.md, Retention: a consumer behind the start offset is moved to it, visibly."""
    topic_factory("short", capacity=2, overflow_policy="drop_oldest")
    commit = {"topic": "short", "offsets": [{"partition": 0, "offset": 0}]}
    api_client.post("/api/v1/groups/late/commit", commit, content_type="application/json")
    produce = {"messages": [{"value": n} for n in range(5)]}
    api_client.post("/api/v1/topics/short/messages", produce, content_type="application/json")

    page = viewer.get("/groups/late/live/").content.decode()

    assert 'data-testid="skipped-by-retention"' in page
    assert "3 skipped by retention" in page
    assert "Retention removed 3 messages of short before this group settled them" in page
    caught_up = {"topic": "short", "offsets": [{"partition": 0, "offset": 4}]}
    api_client.post("/api/v1/groups/late/commit", caught_up, content_type="application/json")
    assert "skipped by retention" not in viewer.get("/groups/late/live/").content.decode()


@pytest.mark.django_db
def test_overview__shows_each_background_jobs_last_run(viewer):
    models.BrokerProcess.objects.all().delete()
    models.JobRun.objects.all().delete()
    now = log.now_ms()
    models.BrokerProcess.objects.create(
        name="host:7", kind="worker", version="0.1.0", started_ms=now - 3_600_000, heartbeat_ms=now
    )
    models.JobRun.objects.create(name="release_due", ok_ms=now, ok_by="host:7")
    models.JobRun.objects.create(name="apply_retention", failed_ms=now, error="E: bad")

    page = viewer.get("/live/overview/").content.decode()

    assert 'data-testid="overview-jobs"' in page

    def row(job: str) -> str:
        rest = page[page.index(f'data-job="{job}"') :]
        return rest[: rest.index("</tr>")]

    assert "host:7" in row("release_due")
    assert ">ok<" in row("release_due")
    assert ">failing<" in row("apply_retention")
    assert "E: bad" in row("apply_retention")
    assert ">late<" in row("compact_samples")
