"""REST edge tests for the OpenAPI schema and the interactive docs."""

ENDPOINTS = {
    "/api/v1/health": {"get"},
    "/api/v1/topics": {"get", "post"},
    "/api/v1/topics/{name}": {"get", "patch", "delete"},
    "/api/v1/topics/{name}/messages": {"post"},
    "/api/v1/topics/{name}/partitions/{partition}/messages": {"get"},
    "/api/v1/topics/{name}/offsets": {"get"},
    "/api/v1/topics/{name}/partitions/{partition}/messages/{offset}/trace": {"get"},
    "/api/v1/topics/{name}/scheduled": {"get"},
    "/api/v1/scheduled/{scheduled_id}": {"delete"},
    "/api/v1/groups": {"get"},
    "/api/v1/groups/{group}": {"get", "patch"},
    "/api/v1/groups/{group}/poll": {"post"},
    "/api/v1/groups/{group}/commit": {"post"},
    "/api/v1/groups/{group}/reset": {"post"},
    "/api/v1/groups/{group}/members": {"post"},
    "/api/v1/groups/{group}/members/{member_id}": {"delete"},
    "/api/v1/groups/{group}/members/{member_id}/heartbeat": {"post"},
    "/api/v1/groups/{group}/ack": {"post"},
    "/api/v1/groups/{group}/nack": {"post"},
    "/api/v1/groups/{group}/reject": {"post"},
    "/api/v1/groups/{group}/extend": {"post"},
    "/api/v1/groups/{group}/dlq": {"get"},
    "/api/v1/groups/{group}/dlq/redrive": {"post"},
    "/api/v1/groups/{group}/dlq/purge": {"post"},
    "/api/v1/groups/{group}/dlq/redrive-jobs": {"post"},
    "/api/v1/redrive-jobs/{job_id}": {"get", "delete"},
    "/api/v1/overview": {"get"},
    "/api/v1/transactions": {"get", "post"},
    "/api/v1/transactions/{transaction_id}": {"get"},
    "/api/v1/transactions/{transaction_id}/messages": {"post"},
    "/api/v1/transactions/{transaction_id}/offsets": {"post"},
    "/api/v1/transactions/{transaction_id}/acks": {"post"},
    "/api/v1/transactions/{transaction_id}/commit": {"post"},
    "/api/v1/transactions/{transaction_id}/rollback": {"post"},
}


def test_openapi__lists_paths(client):
    response = client.get("/api/v1/openapi.json")

    assert response.status_code == 200
    paths = response.json()["paths"]
    for path, methods in ENDPOINTS.items():
        assert methods <= set(paths.get(path, {})), path


def test_openapi__filter_condition_uses_json_names(client):
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]

    assert set(schemas["HeaderConditionIn"]["properties"]) == {"name", "eq", "in", "exists"}


def test_docs__served(client):
    response = client.get("/api/v1/docs")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"/api/v1/openapi.json" in response.content


def test_docs__short_url_redirects(client):
    response = client.get("/api/docs")

    assert response.status_code == 302
    assert response["Location"] == "/api/v1/docs"


def test_openapi__documents_errors_and_name_patterns(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert set(schema["components"]["schemas"]["ErrorOut"]["properties"]) == {"error"}
    get_topic = schema["paths"]["/api/v1/topics/{name}"]["get"]
    for status in ("400", "401", "403", "404", "422", "500", "503"):
        error = get_topic["responses"][status]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/ErrorOut"}
    assert "`topic_not_found`" in get_topic["responses"]["404"]["description"]
    (name,) = get_topic["parameters"]
    assert name["schema"]["pattern"] == "^[A-Za-z0-9._-]{1,200}$"
    health = schema["paths"]["/api/v1/health"]["get"]["responses"]
    assert "401" not in health
    assert "500" in health


def test_openapi__integer_ranges(client):
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    partitions = schemas["TopicIn"]["properties"]["partitions"]["anyOf"][0]
    assert (partitions["minimum"], partitions["maximum"]) == (-(2**31), 2**31 - 1)
    offset = schemas["PartitionOffsetIn"]["properties"]["offset"]
    assert (offset["minimum"], offset["maximum"]) == (-(2**63), 2**63 - 1)
