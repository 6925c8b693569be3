"""Who may see and do what: the login page, staff only, the view and operate roles, CSRF."""

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from broker import models
from tests.dashboard.test_actions import ACTIONS

PAGES = ["/", "/topics/", "/groups/", "/scheduled/", "/dead-letters/", "/keys/", "/audit/"]


def test_login_page__is_ferrys_own(client):
    response = client.get("/login/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Ferry" in body
    assert "Django administration" not in body
    assert 'id="login-form"' in body


@pytest.mark.parametrize("url", PAGES)
def test_page__anonymous_is_sent_to_login(client, db, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(f"/login/?next={url}")


def test_login__signs_in_and_returns_to_next(client, db):
    User.objects.create_user("sam", password="secret-pw", is_staff=True, is_superuser=True)
    response = client.post(
        "/login/", {"username": "sam", "password": "secret-pw", "next": "/keys/"}
    )
    assert response.status_code == 302
    assert response["Location"] == "/keys/"
    assert client.get("/keys/").status_code == 200


def test_login__wrong_password_says_so(client, db):
    User.objects.create_user("sam", password="secret-pw", is_staff=True)
    response = client.post("/login/", {"username": "sam", "password": "nope"})
    assert response.status_code == 200
    assert b'data-testid="login-error"' in response.content


def test_logout__is_a_post(admin_client):
    assert admin_client.get("/logout/").status_code == 405
    response = admin_client.post("/logout/")
    assert response.status_code == 302
    assert admin_client.get("/").status_code == 302


@pytest.mark.parametrize("url", PAGES)
def test_page__non_staff_gets_403(outsider, url):
    response = outsider.get(url)
    assert response.status_code == 403
    assert b'data-testid="forbidden"' in response.content


def test_page__staff_without_view_permission_gets_403(user_client):
    assert user_client("plain-staff").get("/").status_code == 403


def test_403__logged_in_one_line_without_a_traceback(outsider, caplog):
    outsider.get("/")
    outsider.post("/topics/create/", {"name": "x"})
    forbidden = [r for r in caplog.records if r.name == "django.request"]
    assert [r.getMessage() for r in forbidden] == ["Forbidden: /", "Forbidden: /topics/create/"]
    assert all(r.exc_info is None for r in forbidden)


@pytest.mark.parametrize("url", PAGES)
def test_page__viewer_sees_pages_without_action_buttons(viewer, broker_data, url):
    response = viewer.get(url)
    assert response.status_code == 200
    assert b"data-confirm" not in response.content
    assert b"view only" in response.content


@pytest.mark.parametrize("url", ["/topics/orders/", "/groups/g/", "/topics/orders/messages/"])
def test_detail_page__viewer_sees_no_action_forms(viewer, broker_data, url):
    response = viewer.get(url)
    assert response.status_code == 200
    assert b"data-confirm" not in response.content


@pytest.mark.parametrize(("url", "data"), [(a[0], a[1]) for a in ACTIONS])
def test_action__viewer_gets_403_and_nothing_is_audited(viewer, broker_data, url, data):
    response = viewer.post(url.format(**_ids(broker_data)), data)
    assert response.status_code == 403
    assert not models.AuditEntry.objects.exists()


@pytest.mark.parametrize(("url", "data"), [(a[0], a[1]) for a in ACTIONS])
def test_action__get_is_refused(operator, broker_data, url, data):
    assert operator.get(url.format(**_ids(broker_data))).status_code == 405


@pytest.mark.parametrize(("url", "data"), [(a[0], a[1]) for a in ACTIONS])
def test_action__needs_csrf_token(db, broker_data, url, data):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("csrf", password="pw"))
    response = client.post(url.format(**_ids(broker_data)), data)
    assert response.status_code == 403
    assert b'data-testid="csrf-failure"' in response.content
    assert not models.AuditEntry.objects.exists()


def test_action__with_csrf_token_goes_through(db, broker_data):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("csrf", password="pw"))
    page = client.get("/topics/")
    token = page.context["csrf_token"]
    response = client.post("/topics/create/", {"name": "with-token", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert models.Topic.objects.filter(name="with-token").exists()


def _ids(data):
    return {"letter": data["letters"][0], "scheduled": data["scheduled"][0], "key": "any", "due": 1}


def test_bootstrap__dashboard_login_has_both_roles(db):
    call_command("ferry", "bootstrap", stdout=io.StringIO())
    user = User.objects.get(username="admin")
    assert user.is_staff
    assert user.has_perm("broker.view_console")
    assert user.has_perm("broker.operate_console")
