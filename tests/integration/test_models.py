"""GET /v1/models and /v1/models/{id} end to end: a real router; the openai and anthropic SDKs
list, page and retrieve the models a key may use, and get their own errors' shapes."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest
import requests

from router.access.auth import hash_key
from tests.integration.conftest import region_toml, start_router, start_sim
from tests.support import Proc

MODELS = ("org/sim-3", "sim-1", "sim-2")  # listing order: sorted
ALL = "sk-all-0123456789abcdef"
ONE = "sk-one-0123456789abcdef"  # sim-1 only


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    sim = start_sim(tmp_path_factory.mktemp("sim"), "a", models=",".join(MODELS))
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{hash_key(key)}"\ntenant = "{name}"\n{extra}\n'
        for name, key, extra in (("all", ALL, ""), ("one", ONE, 'models = ["sim-1"]'))
    )
    proc = start_router(tmp_path_factory.mktemp("models"), keys + region_toml(sim, models=MODELS))
    yield proc
    proc.kill()
    sim.kill()


def _openai(router: Proc, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key=key, max_retries=0)


def _anthropic(router: Proc, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=router.url, api_key=key, max_retries=0)


def test_openai_retrieves_each_model_a_key_may_use(router: Proc) -> None:
    client = _openai(router, ALL)
    for name in MODELS:  # `org/sim-3` goes out with its slash as is
        model = client.models.retrieve(name)
        assert (model.id, model.object, model.owned_by) == (name, "model", "router")
    assert [m.id for m in client.models.list()] == list(MODELS)


def test_openai_retrieve_of_a_model_the_key_may_not_use_is_not_found(router: Proc) -> None:
    client = _openai(router, ONE)
    assert client.models.retrieve("sim-1").id == "sim-1"
    for name in ("sim-2", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve(name)
        assert caught.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        _openai(router, "sk-wrong-0123456789abcdef").models.retrieve("sim-1")


def test_anthropic_lists_every_page_and_retrieves(router: Proc) -> None:
    client = _anthropic(router, ALL)
    # One model a page: the SDK follows has_more / last_id through all three.
    first = client.models.list(limit=1)
    assert [m.id for m in first.data] == [MODELS[0]]
    assert first.has_more
    assert [m.id for m in first] == list(MODELS)
    assert [m.id for m in client.models.list()] == list(MODELS)
    model = client.models.retrieve("sim-2")
    assert (model.id, model.type, model.display_name) == ("sim-2", "model", "sim-2")
    assert model.created_at.year == 1970


def test_anthropic_errors_come_in_anthropic_shape(router: Proc) -> None:
    with pytest.raises(anthropic.NotFoundError):
        _anthropic(router, ONE).models.retrieve("sim-2")
    with pytest.raises(anthropic.AuthenticationError):
        _anthropic(router, "sk-wrong-0123456789abcdef").models.list()
    with pytest.raises(anthropic.BadRequestError):
        _anthropic(router, ALL).models.list(limit=0)
    resp = requests.get(
        router.url + "/v1/models",
        params={"after_id": "sim-9"},
        headers={"x-api-key": ALL, "anthropic-version": "2023-06-01"},
        timeout=10,
    )
    assert resp.status_code == 400
    assert resp.json()["type"] == "error"
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_a_key_pages_over_its_own_models_only(router: Proc) -> None:
    page = _anthropic(router, ONE).models.list()
    assert [m.id for m in page.data] == ["sim-1"]
    assert (page.first_id, page.last_id, page.has_more) == ("sim-1", "sim-1", False)


@pytest.mark.parametrize("method", ["POST", "DELETE", "PUT"])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/sim-1", "/v1/models/org/sim-3"])
def test_a_wrong_method_is_authenticated_before_its_405(
    router: Proc, method: str, path: str
) -> None:
    # It was a 405 to anyone, without Allow: a client without a key learned the path exists.
    url = router.url + path
    for headers in ({}, {"Authorization": "Bearer sk-wrong-0123456789abcdef"}):
        resp = requests.request(method, url, headers=headers, timeout=10)
        assert resp.status_code == 401
        assert resp.json()["error"]["type"] == "authentication_error"
        assert "Allow" not in resp.headers
    resp = requests.request(method, url, headers={"Authorization": f"Bearer {ALL}"}, timeout=10)
    assert resp.status_code == 405
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.headers["Allow"] == "GET,HEAD"
    # Anthropic's SDK (anthropic-version) gets Anthropic's shape, as GET on these routes does.
    anthropic_version = {"anthropic-version": "2023-06-01"}
    resp = requests.request(method, url, headers=anthropic_version, timeout=10)
    assert resp.status_code == 401
    assert resp.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": resp.json()["error"]["message"]},
    }
    resp = requests.request(
        method, url, headers={"x-api-key": ALL, **anthropic_version}, timeout=10
    )
    assert resp.status_code == 405
    assert resp.json()["type"] == "error"
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.headers["Allow"] == "GET,HEAD"
