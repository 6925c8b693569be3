"""REST to the broker: several URLs with failover, retries with backoff, typed errors.

See docs/client.md#retries-and-failover. Every rule is written once, without I/O, and driven by
two thin shells, the sync `Transport` (httpx.Client) and the asyncio `AsyncTransport`
(httpx.AsyncClient), the way httpx and redis-py share their request logic:

- `Request`: one REST call as the client builds it (method, path, body, query, idempotent).
- `Attempts` and `attempt_all`: which URL next, how long to wait first, what to retry, and the
  error a failure maps to.
- `Exchange`: a call made of requests and rules around them (a producer's hooks, a reader's
  answer parsing), written once as a generator that yields each `Request` and gets its answer's
  body back (or its error thrown in).
- `steps`: an exchange and the attempts of each of its requests, as the effects a shell performs:
  sleep this long, send this HTTP request. `Transport.run` and `AsyncTransport.run` perform them
  and do nothing else.
"""

import asyncio
import logging
import os
import random
import ssl
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from ferry_client import errors

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT_S = 10.0

# Failures that happen before the request reaches a broker: retrying them never repeats a write.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

Params = Mapping[str, str | int | None]
T = TypeVar("T")
# How to check a broker's HTTPS certificate (docs/client.md#tls): True for the default trust
# store, a CA file's path (a private CA, or scripts/haproxy's self-signed .crt), an SSLContext
# as given, or False for no check at all (a trial only).
Verify = bool | str | os.PathLike[str] | ssl.SSLContext


@dataclass(frozen=True)
class Request:
    """One REST call: its method, path under /api/v1, JSON body and query (None values dropped).

    `idempotent=False` retries it only when it never reached a broker (so it never runs twice);
    `timeout` overrides the transport's for this call; `accept` asks for a media type other than
    JSON (an Arrow stream), and the answer is then its bytes; `headers` are sent besides the
    client's own (a routing hint).
    """

    method: str
    path: str
    json: Any = None
    params: Params | None = None
    idempotent: bool = True
    timeout: float | None = None
    accept: str | None = None
    headers: Mapping[str, str] | None = None


# A call written once for both shells: yields each Request and receives its answer's body.
Exchange = Generator[Request, Any, T]
# What a shell does for the rules: sleep this many seconds (and send back None), or send this HTTP
# request (and send back its response, or the transport error it raised).
Effect = float | httpx.Request
Outcome = httpx.Response | httpx.TransportError | None
Steps = Generator[Effect, Outcome, T]


def normalize_url(url: str) -> str:
    """A broker base URL as given ("http://host:8000", with or without /api/v1 and a slash)."""
    url = url.strip().rstrip("/")
    if url.endswith(API_PREFIX):
        url = url[: -len(API_PREFIX)]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"A broker URL starts with http:// or https://, not {url!r}.")
    return url


def tls_context(verify: Verify) -> ssl.SSLContext:
    """The TLS context for `verify`, made once and shared by REST and WebSockets, so both trust
    the same certificates. True is httpx's default: certifi's bundle, or the file or directory
    in SSL_CERT_FILE / SSL_CERT_DIR. A CA file that cannot be read fails here, at construction,
    not at the first request."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if isinstance(verify, bool):
        return httpx.create_ssl_context(verify=verify)
    return ssl.create_default_context(cafile=os.fspath(verify))


def ws_url(base_url: str) -> str:
    """The WebSocket endpoint of a broker base URL: http → ws, https → wss."""
    return "ws" + base_url[len("http") :] + "/ws/v1/"


class Endpoints:
    """The broker base URLs, tried in turn from the one that last answered (failover)."""

    def __init__(self, urls: str | Sequence[str]) -> None:
        given = urls.split(",") if isinstance(urls, str) else list(urls)
        self.urls = tuple(normalize_url(u) for u in given if u.strip())
        if not self.urls:
            raise ValueError("Give at least one broker URL.")
        self._preferred = 0

    def order(self) -> tuple[str, ...]:
        """Every URL once, starting with the preferred one."""
        i = self._preferred
        return self.urls[i:] + self.urls[:i]

    def succeeded(self, url: str) -> None:
        """The next requests start with this URL."""
        self._preferred = self.urls.index(url)


def full_jitter() -> float:
    """Spread the retries of many clients so they do not hit a recovering broker at once."""
    return random.uniform(0.5, 1.0)  # noqa: S311 -- timing jitter, not a secret.


# A broker that cannot reach its database answers 503 with this code and a retry_after
# (docs/operations.md): waited out beyond `retries`, up to RetryPolicy.max_outage_s.
OUTAGE_CODES = frozenset({"unavailable"})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a failed request.

    `retries` counts failures; a 503 `unavailable` with `retry_after` (the broker's database is
    away) is retried after that long without counting, for up to `max_outage_s` in all.
    """

    retries: int = 3
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    jitter: Callable[[], float] = full_jitter
    max_outage_s: float = 30.0

    def delay(self, attempt: int, url_count: int) -> float:
        """Seconds to wait before retry `attempt` (1-based) over `url_count` URLs.

        A URL not yet tried in this round is tried at once (failover); a new round over the
        URLs waits base · 2^(round - 1), capped, with jitter.
        """
        if attempt % url_count:
            return 0.0
        rounds = attempt // url_count
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (rounds - 1)) * self.jitter()


def body_of(response: httpx.Response) -> Any:
    """The JSON body of a response; None for 204 No Content."""
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return {"raw": response.text[:200]}


class Attempts:
    """One request's attempts: which URL next, how long to wait, and when to give up.

    Retried: connection errors (always: nothing reached a broker), and for idempotent
    requests also timeouts, dropped connections and 5xx answers. A 4xx is never retried: it
    raises the broker's FerryError at once.
    """

    def __init__(
        self, policy: RetryPolicy, endpoints: Endpoints, what: str, *, idempotent: bool
    ) -> None:
        self.policy = policy
        self.endpoints = endpoints
        self.what = what
        self.idempotent = idempotent
        self.last: BaseException | None = None
        # Set by an outage's answer: wait this long, then try again without counting a failure.
        self.retry_after: float | None = None
        self.outage_waited_s = 0.0

    def __iter__(self) -> Iterator[tuple[str, float]]:
        """(base URL, seconds to wait first) for each attempt."""
        order = self.endpoints.order()
        sent = failures = 0
        delay = 0.0
        while True:
            yield order[sent % len(order)], delay
            sent += 1
            if self.retry_after is not None:
                delay, self.retry_after = self.retry_after, None
                continue
            failures += 1
            if failures > self.policy.retries:
                return
            delay = self.policy.delay(failures, len(order))

    def failed(self, url: str, exc: httpx.TransportError) -> None:
        """A request that got no answer: retry it if that is safe, else raise."""
        self.last = exc
        logger.warning("%s on %s failed: %r", self.what, url, exc)
        if not (self.idempotent or isinstance(exc, NOT_SENT)):
            raise errors.BrokerUnavailable(
                "unavailable", f"{self.what} on {url} got no answer: {exc!r}"
            ) from exc

    def answered(
        self, url: str, response: httpx.Response, *, raw: bool = False
    ) -> tuple[bool, Any]:
        """(True, body) when done; (False, None) to retry a 5xx; raises the error of a 4xx.

        With `raw`, a successful body is the response's bytes (errors are still JSON).
        """
        if raw and response.status_code < 400:
            self.endpoints.succeeded(url)
            return True, response.content
        body = body_of(response)
        if response.status_code < 400:
            self.endpoints.succeeded(url)
            return True, body
        error = errors.FerryError.from_body(body, response.status_code)
        if response.status_code < 500 or not self.idempotent:
            raise error
        logger.warning("%s on %s answered %s", self.what, url, error)
        self.last = error
        retry_after = error.detail.get("retry_after")
        if error.code in OUTAGE_CODES and isinstance(retry_after, int | float) and retry_after >= 0:
            wait_s = max(float(retry_after), self.policy.backoff_s)
            if self.outage_waited_s + wait_s <= self.policy.max_outage_s:
                self.retry_after = wait_s
                self.outage_waited_s += wait_s
        return False, None

    def give_up(self) -> errors.BrokerUnavailable:
        last = self.last
        if isinstance(last, errors.FerryError):
            failure = errors.BrokerUnavailable(last.code, last.message, last.detail, last.status)
        else:
            failure = errors.BrokerUnavailable(
                "unavailable",
                f"{self.what}: no broker answered after {self.policy.retries + 1} attempts "
                f"({', '.join(self.endpoints.urls)}); last: {last!r}",
            )
        failure.__cause__ = last
        return failure


def client_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "User-Agent": "ferry-client/0.1"}


def attempt_all(
    request: Request,
    build: Callable[..., httpx.Request],
    policy: RetryPolicy,
    endpoints: Endpoints,
    default_timeout: float,
) -> Steps[Any]:
    """Every attempt of one request, until an answer, a refusal or giving up (no I/O here).

    `build` is the httpx client's build_request, so the request carries the client's headers.
    """
    attempts = Attempts(
        policy, endpoints, f"{request.method} {request.path}", idempotent=request.idempotent
    )
    query = {k: v for k, v in (request.params or {}).items() if v is not None}
    headers = {**(request.headers or {}), **({"Accept": request.accept} if request.accept else {})}
    for url, delay in attempts:
        if delay:
            yield delay
        outcome = yield build(
            request.method,
            url + API_PREFIX + request.path,
            json=request.json,
            params=query,
            headers=headers or None,
            timeout=request.timeout or default_timeout,
        )
        if isinstance(outcome, httpx.Response):
            done, body = attempts.answered(url, outcome, raw=request.accept is not None)
            if done:
                return body
        elif outcome is not None:
            attempts.failed(url, outcome)
    raise attempts.give_up()


def steps(
    exchange: Exchange[T],
    build: Callable[..., httpx.Request],
    policy: RetryPolicy,
    endpoints: Endpoints,
    default_timeout: float,
) -> Steps[T]:
    """The effects an exchange needs: each request's attempts in turn (no I/O here).

    A request's answer goes back into the exchange; its FerryError or BrokerUnavailable is
    thrown into it, where the exchange may handle it or let it out.
    """
    body: Any = None
    error: Exception | None = None
    while True:
        try:
            request = exchange.send(body) if error is None else exchange.throw(error)
        except StopIteration as done:
            result: T = done.value
            return result
        body, error = None, None
        try:
            body = yield from attempt_all(request, build, policy, endpoints, default_timeout)
        except Exception as exc:
            error = exc


def single(request: Request) -> Exchange[Any]:
    """The exchange of one request: its answer's body."""
    return (yield request)


class Closing:
    """`with` closes it: for the blocking clients (producer, admin, reader)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Transport:
    """Blocking REST calls with failover and retries (httpx.Client; safe across threads)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        policy: RetryPolicy = RetryPolicy(),
        http_transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        verify: Verify = True,
    ) -> None:
        self.endpoints = Endpoints(urls)
        self.policy = policy
        self.timeout = timeout
        self._sleep = sleep
        self._client = httpx.Client(
            headers=client_headers(api_key),
            timeout=timeout,
            transport=http_transport,
            verify=tls_context(verify),
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Params | None = None,
        idempotent: bool = True,
        timeout: float | None = None,
        accept: str | None = None,
    ) -> Any:
        """The answer's JSON body (None for 204), or a FerryError / BrokerUnavailable.

        With `accept` (a media type other than JSON), the answer's bytes instead.
        """
        return self.send(Request(method, path, json, params, idempotent, timeout, accept))

    def send(self, request: Request) -> Any:
        """The answer's body of one Request (or its error)."""
        return self.run(single(request))

    def run(self, exchange: Exchange[T]) -> T:
        """Run an Exchange: the shell that sleeps and sends what its steps ask for."""
        todo = steps(
            exchange, self._client.build_request, self.policy, self.endpoints, self.timeout
        )
        outcome: Outcome = None
        try:
            while True:
                effect = todo.send(outcome)
                if isinstance(effect, httpx.Request):
                    try:
                        outcome = self._client.send(effect)
                    except httpx.TransportError as exc:
                        outcome = exc
                else:
                    self._sleep(effect)
                    outcome = None
        except StopIteration as done:
            result: T = done.value
            return result

    def close(self) -> None:
        self._client.close()


class AsyncTransport:
    """The same calls for asyncio (httpx.AsyncClient); use it from one event loop."""

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        policy: RetryPolicy = RetryPolicy(),
        http_transport: httpx.AsyncBaseTransport | None = None,
        verify: Verify = True,
    ) -> None:
        self.endpoints = Endpoints(urls)
        self.policy = policy
        self.timeout = timeout
        self._client = httpx.AsyncClient(
            headers=client_headers(api_key),
            timeout=timeout,
            transport=http_transport,
            verify=tls_context(verify),
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Params | None = None,
        idempotent: bool = True,
        timeout: float | None = None,
        accept: str | None = None,
    ) -> Any:
        """The answer's JSON body (None for 204), or a FerryError / BrokerUnavailable.

        With `accept` (a media type other than JSON), the answer's bytes instead.
        """
        return await self.send(Request(method, path, json, params, idempotent, timeout, accept))

    async def send(self, request: Request) -> Any:
        """The answer's body of one Request (or its error)."""
        return await self.run(single(request))

    async def run(self, exchange: Exchange[T]) -> T:
        """Run an Exchange: the shell that sleeps and sends what its steps ask for."""
        todo = steps(
            exchange, self._client.build_request, self.policy, self.endpoints, self.timeout
        )
        outcome: Outcome = None
        try:
            while True:
                effect = todo.send(outcome)
                if isinstance(effect, httpx.Request):
                    try:
                        outcome = await self._client.send(effect)
                    except httpx.TransportError as exc:
                        outcome = exc
                else:
                    await asyncio.sleep(effect)
                    outcome = None
        except StopIteration as done:
            result: T = done.value
            return result

    async def aclose(self) -> None:
        await self._client.aclose()


class Client(Closing):
    """A blocking REST client (Admin, Reader): one Transport, retrying `retries` times.

    `urls` is one broker URL or several (a list, or comma-separated) for failover.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = 3,
        http_transport: httpx.BaseTransport | None = None,
        verify: Verify = True,
    ) -> None:
        self._rest = Transport(
            urls,
            api_key,
            timeout=timeout,
            policy=RetryPolicy(retries=retries),
            http_transport=http_transport,
            verify=verify,
        )

    def close(self) -> None:
        self._rest.close()
