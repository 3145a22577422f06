"""The model listing's pure rules: who sees what, and Anthropic's cursor pages."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from router.access.auth import ANONYMOUS_TENANT, Tenant
from router.config import Config, loads
from router.errors import InvalidRequest, NotFound
from router.server import models

NAMES = ("a", "b", "c", "d", "e")


def _config() -> Config:
    regions = "".join(
        f'[[regions]]\nname = "r{i}"\nbase_url = "http://127.0.0.1:{9000 + i}/v1"\n'
        f'models = ["{name}"]\n'
        for i, name in enumerate(NAMES)
    )
    return loads("[auth]\nenabled = false\n" + regions)


CONFIG = _config()
EVERYONE = ANONYMOUS_TENANT


def _anthropic(query: dict[str, str], tenant: Tenant = EVERYONE) -> dict[str, object]:
    return msgspec.json.decode(models.listing(CONFIG, tenant, query, anthropic=True))


@pytest.mark.parametrize(
    ("query", "ids", "more"),
    [
        ({}, ["a", "b", "c", "d", "e"], False),
        ({"limit": "2"}, ["a", "b"], True),
        ({"limit": "2", "after_id": "b"}, ["c", "d"], True),
        ({"limit": "2", "after_id": "d"}, ["e"], False),
        ({"after_id": "e"}, [], False),
        ({"limit": "2", "before_id": "e"}, ["c", "d"], True),
        ({"limit": "2", "before_id": "c"}, ["a", "b"], False),
        ({"before_id": "a"}, [], False),
        ({"limit": "1000"}, ["a", "b", "c", "d", "e"], False),
    ],
)
def test_anthropic_pages(query: dict[str, str], ids: list[str], more: bool) -> None:
    page = _anthropic(query)
    assert [m["id"] for m in page["data"]] == ids  # type: ignore[attr-defined]
    assert page["has_more"] is more
    assert (page["first_id"], page["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "-1"},
        {"limit": "two"},
        {"limit": "²"},
        {"after_id": "zz"},
        {"before_id": "zz"},
        {"after_id": "a", "before_id": "c"},
    ],
)
def test_bad_pages_are_invalid_requests(query: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _anthropic(query)
    assert caught.value.status == 400


def test_a_key_sees_and_pages_over_only_its_models() -> None:
    some = dataclasses.replace(ANONYMOUS_TENANT, models=frozenset({"b", "d"}))
    assert [m["id"] for m in _anthropic({}, some)["data"]] == ["b", "d"]  # type: ignore[attr-defined]
    # A model the key may not use is no cursor either: it does not exist for this key.
    with pytest.raises(InvalidRequest):
        _anthropic({"after_id": "c"}, some)
    with pytest.raises(NotFound) as caught:
        models.one(CONFIG, some, "c", anthropic=False)
    assert caught.value.code == "model_not_found"


def test_one_model_in_each_shape() -> None:
    openai = msgspec.json.decode(models.one(CONFIG, EVERYONE, "c", anthropic=False))
    assert openai == {
        "id": "c",
        "object": "model",
        "created": 0,
        "owned_by": "router",
        "endpoints": ["chat", "completions", "embeddings"],
    }
    anthropic = msgspec.json.decode(models.one(CONFIG, EVERYONE, "c", anthropic=True))
    assert anthropic == {
        "type": "model",
        "id": "c",
        "display_name": "c",
        "created_at": "1970-01-01T00:00:00Z",
    }
