"""What the data source's errors tell a Spark user to check (no broker, no Spark)."""

import itertools
import ssl

import httpx

from ferry_client import BrokerUnavailable
from pipeline.errors import explain, untrusted
from pipeline.options import Connection

CONN = Connection("https://broker.example.com", "fry_x", 30.0)


def chained(*errors: Exception) -> Exception:
    """errors[0] raised from errors[1], raised from errors[2], …, as the client raises them."""
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    return errors[0]


def test_an_untrusted_certificate_points_at_caFile():
    failure = chained(
        BrokerUnavailable("unavailable", "no broker answered"),
        httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED]"),
        ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate"),
    )
    assert "(check the 'caFile' option)" in str(explain(CONN, failure, "a read"))


def test_any_other_failure_to_connect_points_at_url():
    failure = chained(BrokerUnavailable("unavailable", "refused"), ConnectionRefusedError(111))
    assert "(check the 'url' option)" in str(explain(CONN, failure, "a read"))


def test_a_chain_that_loops_ends():
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert not untrusted(first)
