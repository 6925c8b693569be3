"""Every console page renders, with data and on an empty broker (empty states)."""

import pytest

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
