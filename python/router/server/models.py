"""GET /v1/models and GET /v1/models/{id}: the models a key may use, in OpenAI's shape, or in
Anthropic's for a client that sends `anthropic-version` (its SDK always does), cursor pages
included."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from router.access.auth import Tenant
from router.config import Config
from router.errors import InvalidRequest, NotFound

# Anthropic's `created_at` is the model's release date, "an epoch value if unknown".
_EPOCH = "1970-01-01T00:00:00Z"
_ANTHROPIC_DEFAULT_LIMIT = 20
_ANTHROPIC_MAX_LIMIT = 1000


def visible(config: Config, tenant: Tenant) -> tuple[str, ...]:
    """The model names `tenant`'s key may ask for, in listing order."""
    return tuple(name for name in config.served_models() if tenant.allows(name))


def _openai(config: Config, name: str) -> dict[str, object]:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "router",
        "endpoints": config.endpoints_of(name),
    }


def _anthropic(name: str) -> dict[str, object]:
    return {"type": "model", "id": name, "display_name": name, "created_at": _EPOCH}


def listing(config: Config, tenant: Tenant, query: Mapping[str, str], anthropic: bool) -> bytes:
    """The list body: every visible model (OpenAI), or one cursor page of them (Anthropic's
    `limit`, `after_id`, `before_id`); InvalidRequest for a bad page request."""
    names = visible(config, tenant)
    if not anthropic:
        data = [_openai(config, name) for name in names]
        return msgspec.json.encode({"object": "list", "data": data})
    page, has_more = _page(names, query)
    return msgspec.json.encode(
        {
            "data": [_anthropic(name) for name in page],
            "has_more": has_more,
            "first_id": page[0] if page else None,
            "last_id": page[-1] if page else None,
        }
    )


def _page(names: tuple[str, ...], query: Mapping[str, str]) -> tuple[tuple[str, ...], bool]:
    """Anthropic's cursor rules: `limit` items after `after_id` (or from the start), or the
    `limit` items just before `before_id`; and whether more lie beyond in that direction."""
    raw = query.get("limit")
    limit = _ANTHROPIC_DEFAULT_LIMIT
    if raw is not None:
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= _ANTHROPIC_MAX_LIMIT:
            raise InvalidRequest(
                f"limit: must be an integer from 1 to {_ANTHROPIC_MAX_LIMIT}.", param="limit"
            )
        limit = int(raw)
    after, before = query.get("after_id"), query.get("before_id")
    if after is not None and before is not None:
        raise InvalidRequest("Give after_id or before_id, not both.", param="before_id")
    if before is not None:
        end = _position(names, before, "before_id")
        start = max(0, end - limit)
        return names[start:end], start > 0
    start = 0 if after is None else _position(names, after, "after_id") + 1
    return names[start : start + limit], start + limit < len(names)


def _position(names: tuple[str, ...], cursor: str, param: str) -> int:
    try:
        return names.index(cursor)
    except ValueError:
        raise InvalidRequest(f"{param}: no model `{cursor}` to page from.", param=param) from None


def one(config: Config, tenant: Tenant, name: str, anthropic: bool) -> bytes:
    """One model's body; NotFound unless the key may use it (a model the key may not use is
    as absent as in its list)."""
    if name not in visible(config, tenant):
        raise NotFound(f"The model `{name}` does not exist.", param="model", code="model_not_found")
    return msgspec.json.encode(_anthropic(name) if anthropic else _openai(config, name))
