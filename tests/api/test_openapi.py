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
