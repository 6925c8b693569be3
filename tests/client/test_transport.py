"""Retries and failover against a fake transport (httpx.MockTransport): no broker needed."""

import ssl
from pathlib import Path

import certifi
import httpx
import pytest

from ferry_client import BrokerUnavailable, FerryError
from ferry_client.transport import (
    AsyncTransport,
    Endpoints,
    RetryPolicy,
    Transport,
    normalize_url,
    tls_context,
    ws_url,
)

A = "http://a:8000"
B = "http://b:8000"
NO_JITTER = RetryPolicy(retries=3, backoff_s=0.1, max_backoff_s=0.3, jitter=lambda: 1.0)


def error(status, code, **detail):
    return httpx.Response(status, json={"error": {"code": code, "message": code, "detail": detail}})


class Broker:
    """A fake broker per host: answers from a script of responses or exceptions, records calls."""

    def __init__(self, **scripts):
        self.scripts = {host: list(answers) for host, answers in scripts.items()}
        self.calls = []

    def __call__(self, request):
        self.calls.append(request.url.host)
        answers = self.scripts.get(request.url.host) or [httpx.ConnectError("refused")]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def transport(broker, urls=(A, B), policy=NO_JITTER):
    sleeps: list[float] = []
    rest = Transport(
        list(urls),
        "key",
        policy=policy,
        http_transport=httpx.MockTransport(broker),
        sleep=sleeps.append,
    )
    return rest, sleeps


def test_normalize_url__accepts_the_api_prefix_and_slashes():
    assert normalize_url(" http://h:1/api/v1/ ") == "http://h:1"
    assert ws_url("https://h") == "wss://h/ws/v1/"
    with pytest.raises(ValueError, match="http"):
        normalize_url("h:1")


def test_endpoints__comma_separated_and_preferred_first():
    endpoints = Endpoints(f"{A}, {B}")
    assert endpoints.order() == (A, B)
    endpoints.succeeded(B)
    assert endpoints.order() == (B, A)
    with pytest.raises(ValueError, match="at least one"):
        Endpoints([])


def test_delay__fails_over_at_once_then_backs_off():
    # Two URLs: the second is tried at once, each new round waits longer, up to the cap.
    assert [NO_JITTER.delay(n, 2) for n in range(1, 8)] == [0, 0.1, 0, 0.2, 0, 0.3, 0]
    assert [NO_JITTER.delay(n, 1) for n in range(1, 4)] == [0.1, 0.2, 0.3]


def test_request__fails_over_and_remembers_the_live_url():
    broker = Broker(a=[httpx.ConnectError("refused")], b=[httpx.Response(200, json={"ok": 1})])
    rest, sleeps = transport(broker)
    assert rest.request("GET", "/topics") == {"ok": 1}
    assert rest.request("GET", "/topics") == {"ok": 1}
    assert broker.calls == ["a", "b", "b"]
    assert sleeps == []


def test_request__retries_5xx_and_timeouts_with_backoff():
    broker = Broker(a=[error(503, "broker_error"), httpx.ReadTimeout("slow"), httpx.Response(204)])
    rest, sleeps = transport(broker, urls=[A])
    assert rest.request("POST", "/topics/t/messages", json={}) is None
    assert broker.calls == ["a", "a", "a"]
    assert sleeps == [0.1, 0.2]


def test_request__4xx_raises_at_once():
    broker = Broker(a=[error(404, "topic_not_found", name="t")])
    rest, _ = transport(broker)
    with pytest.raises(FerryError) as refused:
        rest.request("GET", "/topics/t")
    assert (refused.value.code, refused.value.status) == ("topic_not_found", 404)
    assert refused.value.detail == {"name": "t"}
    assert not isinstance(refused.value, BrokerUnavailable)
    assert broker.calls == ["a"]


def test_request__gives_up_with_the_last_error():
    broker = Broker(a=[error(503, "broker_error")], b=[error(503, "broker_error")])
    rest, _ = transport(broker)
    with pytest.raises(BrokerUnavailable) as failed:
        rest.request("GET", "/topics")
    assert (failed.value.code, failed.value.status) == ("broker_error", 503)
    assert broker.calls == ["a", "b", "a", "b"]


def test_request__waits_out_an_outage_after_retry_after_beyond_the_retries():
    """503 unavailable with retry_after (the broker's database is away) does not count as a
    failure until max_outage_s; the same request is sent again after retry_after."""
    outage = error(503, "unavailable", retry_after=1, dependency="database")
    ok = httpx.Response(200, json={"results": []})
    broker = Broker(a=[outage] * 6 + [ok], b=[httpx.ConnectError("refused")])
    rest, sleeps = transport(broker, urls=(A,))
    assert rest.request("POST", "/topics/t/messages", json={"messages": []}) == {"results": []}
    assert broker.calls == ["a"] * 7
    assert sleeps == [1.0] * 6


def test_request__an_outage_longer_than_max_outage_s_gives_up():
    policy = RetryPolicy(retries=1, backoff_s=0.1, jitter=lambda: 1.0, max_outage_s=2)
    broker = Broker(a=[error(503, "unavailable", retry_after=1)])
    rest, sleeps = transport(broker, urls=(A,), policy=policy)
    with pytest.raises(BrokerUnavailable) as failed:
        rest.request("GET", "/topics")
    assert (failed.value.code, failed.value.detail["retry_after"]) == ("unavailable", 1)
    # Two waits of retry_after (the outage budget), then the retries as usual.
    assert sleeps == [1.0, 1.0, 0.1]


def test_request__gives_up_unavailable_without_any_answer():
    rest, _ = transport(Broker())
    with pytest.raises(BrokerUnavailable) as failed:
        rest.request("GET", "/topics")
    assert failed.value.code == "unavailable"
    assert isinstance(failed.value.__cause__, httpx.ConnectError)


def test_request__not_idempotent_retries_only_what_never_left():
    broker = Broker(a=[httpx.ConnectError("refused")], b=[httpx.ReadTimeout("slow")])
    rest, _ = transport(broker)
    with pytest.raises(BrokerUnavailable, match="no answer"):
        rest.request("DELETE", "/topics/t", idempotent=False)
    assert broker.calls == ["a", "b"]
    broker = Broker(a=[error(503, "broker_error")])
    rest, _ = transport(broker)
    with pytest.raises(FerryError) as refused:
        rest.request("POST", "/topics", json={}, idempotent=False)
    assert (refused.value.code, refused.value.status) == ("broker_error", 503)
    assert broker.calls == ["a"]


def test_request__sends_the_key_and_drops_empty_params():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json=[])

    rest = Transport(A, "secret", http_transport=httpx.MockTransport(handler))
    rest.request("GET", "/groups/g/dlq", params={"topic": None, "limit": 5})
    assert seen[0].headers["authorization"] == "Bearer secret"
    assert str(seen[0].url) == "http://a:8000/api/v1/groups/g/dlq?limit=5"


def test_request__non_json_error_body():
    rest, _ = transport(Broker(a=[httpx.Response(400, text="<html>")]))
    with pytest.raises(FerryError) as refused:
        rest.request("GET", "/x")
    assert refused.value.code == "http_400"


async def test_async_request__fails_over_and_retries():
    broker = Broker(
        a=[httpx.ConnectError("refused")],
        b=[error(502, "bad_gateway"), httpx.Response(200, json={"ok": 1})],
    )
    rest = AsyncTransport(
        [A, B],
        "key",
        policy=RetryPolicy(retries=3, backoff_s=0.001, jitter=lambda: 1.0),
        http_transport=httpx.MockTransport(broker),
    )
    try:
        assert await rest.request("GET", "/topics") == {"ok": 1}
    finally:
        await rest.aclose()
    assert broker.calls == ["a", "b", "a", "b"]


def test_tls_context__what_each_verify_trusts(tmp_path, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    public_cas = ssl.create_default_context(cafile=certifi.where()).cert_store_stats()["x509_ca"]
    own = ssl.create_default_context()
    assert tls_context(own) is own
    public = tls_context(True)
    assert public.verify_mode == ssl.CERT_REQUIRED
    assert public.check_hostname
    assert public.cert_store_stats()["x509_ca"] == public_cas
    unchecked = tls_context(False)
    assert unchecked.verify_mode == ssl.CERT_NONE
    assert not unchecked.check_hostname
    # A CA file, as a str or a Path: its CAs, checked as strictly.
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(Path(certifi.where()).read_bytes())
    for path in (str(ca_file), ca_file):
        private = tls_context(path)
        assert private.verify_mode == ssl.CERT_REQUIRED
        assert private.check_hostname
        assert private.cert_store_stats()["x509_ca"] == public_cas
    with pytest.raises(FileNotFoundError):
        tls_context(tmp_path / "missing.crt")
