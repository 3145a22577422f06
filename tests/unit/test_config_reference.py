"""docs/CONFIG.md is generated from config.py and must not drift from it."""

from __future__ import annotations

import msgspec

from router.config import Config
from router.config_reference import field_comments, render
from tests.support import REPO


def test_config_md_is_current() -> None:
    text = (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    assert text == render(), (
        "docs/CONFIG.md is stale: run `python -m router.config_reference > docs/CONFIG.md`"
    )


def _sections(cls: type[msgspec.Struct], seen: set[type]) -> None:
    if cls in seen:
        return
    seen.add(cls)
    for field in msgspec.structs.fields(cls):
        for sub in _structs(field.type):
            _sections(sub, seen)


def _structs(info: object) -> list[type[msgspec.Struct]]:
    found: list[type[msgspec.Struct]] = []
    stack = [info]
    while stack:
        tp = stack.pop()
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            found.append(tp)
        stack.extend(getattr(tp, "__args__", ()))
        stack.extend(getattr(tp, "__metadata__", ()) and ())
    return found


def test_every_field_has_a_meaning() -> None:
    md = render()
    seen: set[type] = set()
    _sections(Config, seen)
    for cls in seen:
        comments = field_comments(cls)
        for name in cls.__struct_fields__:
            sub = _structs(msgspec.structs.fields(cls)[cls.__struct_fields__.index(name)].type)
            assert comments.get(name) or sub, f"{cls.__name__}.{name} has no comment in config.py"
            assert f"| `{name}` |" in md
