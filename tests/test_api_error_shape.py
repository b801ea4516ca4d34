"""Every error of the APIs has their shape ``{"detail", "code"}`` (docs/api.md, docs/langgraph.md),
even where no router answers: a method a path does not take is a JSON 405 that keeps its
``Allow`` header, and a path under ``/api/`` or ``/lg/`` that matches no route a JSON 404. The
pages keep their HTML."""

import pytest
from django.test import Client

pytestmark = pytest.mark.one_database("sqlite")  # the middleware's effect, not the data


@pytest.mark.parametrize("method, path, allowed", [
    ("post", "/lg/info", "GET"),
    ("delete", "/lg/ok", "GET"),
    ("get", "/lg/threads/search", "POST"),
    ("options", "/lg/threads", "POST"),
    ("delete", "/api/projects", "GET, POST"),
])
def test_a_method_a_path_does_not_take_is_a_json_405_with_its_allow_header(db, method, path, allowed):
    response = getattr(Client(), method)(path)
    assert response.status_code == 405
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "method_not_allowed" and method.upper() in response.json()["detail"]
    assert set(response["Allow"].split(", ")) == set(allowed.split(", "))  # in no fixed order


@pytest.mark.parametrize("path", ["/api/", "/lg/", "/api/nothing/here", "/lg/store/items"])
def test_a_path_no_route_matches_under_the_apis_is_a_json_404(db, path):
    response = Client().get(path)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "not found", "code": "not_found"}


def test_the_pages_keep_their_html_and_a_browser_of_another_origin_reads_the_lg_error(db):
    page = Client().get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    response = Client().post("/lg/info", HTTP_ORIGIN="http://localhost:3000")
    assert response.status_code == 405 and response["Access-Control-Allow-Origin"] == "*"
