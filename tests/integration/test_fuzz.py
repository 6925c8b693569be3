"""Schema-driven fuzzing of the REST API against a real Daphne (schemathesis, docs/api.md).

Every operation of /api/v1/openapi.json gets a bounded number of generated requests, sent with
an admin key; the test fails on any 5xx and on any response whose status, content type or body
the schema does not document.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks
from schemathesis.specs.openapi import checks as openapi_checks

from broker.api import api
from tests.integration.conftest import start_daphne, stop

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Examples per operation: about 40 operations, so a few hundred requests in all.
EXAMPLES = 10


@pytest.fixture(scope="module")
def fuzz_url(django_db_setup, django_db_blocker):
    # Long polls are capped at 50 ms: a generated max_wait_ms must not hold a test for 30 s.
    with django_db_blocker.unblock():
        proc, url = start_daphne(FERRY_MAX_WAIT_MS="50")
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture
def fuzz_key(key_factory):
    return key_factory("admin:*", name="fuzz")[1]


# The schema the server serves at /api/v1/openapi.json, built here (pytest-django has set
# Django up before collection): schemathesis' lazy fixture loader does not run on pytest 9.
schema = schemathesis.openapi.from_dict(api.get_openapi_schema())


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api__no_server_errors_and_every_response_documented(case, fuzz_url, fuzz_key):
    case.call_and_validate(
        base_url=fuzz_url,
        headers={"Authorization": f"Bearer {fuzz_key}"},
        timeout=10,
        checks=[
            checks.not_a_server_error,
            openapi_checks.status_code_conformance,
            openapi_checks.content_type_conformance,
            openapi_checks.response_schema_conformance,
        ],
    )
