"""docs/CONFIG.md, generated from config.py: every section and field with its type, default and
meaning (the comments above or beside the field). `python -m router.config_reference` prints it;
tests/unit/test_config_reference.py fails when the file drifts from the code."""

from __future__ import annotations

import inspect
import io
import re
import sys
import tokenize
import types
import typing
from typing import Any, get_args, get_origin

import msgspec

from router import config as config_module
from router.config import Config
from router.config_env import ENV_PREFIX, OVERRIDABLE, env_name

_FIELD = re.compile(r"^\s+(?P<name>[a-z_][a-z0-9_]*)\s*:")


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment lines directly above it plus its trailing comment."""
    source = inspect.getsource(cls)
    out: dict[str, str] = {}
    pending: list[str] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokens:
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].strip() != tok.string:
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match and not stripped.startswith(("def ", "class ", "return")):
            text = " ".join([*pending, trailing.get(number, "")]).strip()
            out[match["name"]] = text
        pending = []
    return out


def _type_name(tp: Any) -> str:
    """A reader's name for an annotation: `int (>= 1)`, `"json" | "plain"`, `list of str`."""
    origin = get_origin(tp)
    if origin is typing.Annotated:
        base, *metas = get_args(tp)
        bounds = []
        for meta in metas:
            if isinstance(meta, msgspec.Meta):
                for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                    value = getattr(meta, attr)
                    if value is not None:
                        bounds.append(f"{sign} {value}")
                if meta.pattern is not None:
                    bounds.append(f"matching `{meta.pattern}`")
        inner = _type_name(base)
        return f"{inner} ({', '.join(bounds)})" if bounds else inner
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        key, value = get_args(tp)
        return f"table of {_type_name(key)} -> {_type_name(value)}"
    if tp is type(None):
        return "unset"
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return "table"
    return getattr(tp, "__name__", str(tp))


def _default(field: msgspec.structs.FieldInfo) -> str:
    if field.required:
        return "required"
    value = field.default
    if value is msgspec.NODEFAULT:
        value = field.default_factory()
    if isinstance(value, msgspec.Struct):
        return "(table)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        return "[]" if not value else str(list(value))
    if isinstance(value, dict):
        return "{}"
    return repr(value)


def _section_type(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct a field holds (directly, optionally, in a list or a table), if any."""
    for candidate in (tp, *get_args(tp)):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
        if get_origin(candidate) in (tuple, dict):
            found = _section_type(get_args(candidate)[-1])
            if found is not None:
                return found
    return None


def _title(path: str, tp: Any) -> str:
    origin = [get_origin(a) for a in (tp, *get_args(tp))]
    if tuple in origin:
        return f"[[{path}]]"
    if dict in origin:
        return f"[{path}.<name>]"
    return f"[{path}]"


def _sections(
    cls: type[msgspec.Struct], path: str, title: str
) -> list[tuple[str, str, type[msgspec.Struct]]]:
    out = [(path, title, cls)]
    hints = typing.get_type_hints(cls, vars(config_module), include_extras=True)
    for field in msgspec.structs.fields(cls):
        sub = _section_type(hints[field.name])
        if sub is not None:
            child = f"{path}.{field.name}" if path else field.name
            sub_path = child + (".<name>" if dict in _origins(hints[field.name]) else "")
            out += _sections(sub, sub_path, _title(child, hints[field.name]))
    return out


def _origins(tp: Any) -> list[Any]:
    return [get_origin(a) for a in (tp, *get_args(tp))]


def render() -> str:
    """The whole of docs/CONFIG.md."""
    out = [
        "# Configuration reference",
        "",
        "Generated from `python/router/config.py` by `python -m router.config_reference > "
        "docs/CONFIG.md`; `tests/unit/test_config_reference.py` fails when they differ.",
        "",
        "The config is one TOML file (`router serve --config FILE`, checked by "
        "`router check-config FILE`). Unknown fields are refused, with a suggestion when one "
        "is close to a real name. Sizes are bytes, durations seconds (`_s`) or milliseconds "
        "(`_ms`).",
        "",
        "## Environment overrides",
        "",
        "What differs per host can come from the environment instead of the file: "
        f"`{ENV_PREFIX}<SECTION>_<FIELD>`, upper case, dots as underscores "
        f"(e.g. `{env_name('server', 'listen')}`). An override set but empty is an error. "
        "These fields can be overridden:",
        "",
    ]
    out += [f"- `{env_name(*key)}` -> `{'.'.join(key)}`" for key in OVERRIDABLE]
    out.append("")
    for path, title, cls in _sections(Config, "", "top level"):
        # cleandoc: 3.13 dedents docstrings itself, earlier versions keep their indent.
        doc = inspect.cleandoc(cls.__doc__ or "")
        doc = doc.split(":", 1)[1].strip() if doc.startswith("[") and ":" in doc else doc
        doc = doc[:1].upper() + doc[1:]
        out += [f"## {title}" if path else "## Top level", "", doc, ""]
        out += ["| field | type | default | meaning |", "|---|---|---|---|"]
        comments = field_comments(cls)
        hints = typing.get_type_hints(cls, vars(config_module), include_extras=True)
        for field in msgspec.structs.fields(cls):
            meaning = comments.get(field.name, "") or _fallback(field.name, hints[field.name])
            meaning = meaning.replace("|", "\\|")
            out.append(
                f"| `{field.name}` | {_type_name(hints[field.name])} | {_default(field)} | "
                f"{meaning} |"
            )
        out.append("")
    return "\n".join(out)


def _fallback(name: str, tp: Any) -> str:
    sub = _section_type(tp)
    if sub is None:
        return ""
    doc = inspect.cleandoc(sub.__doc__ or "").split(":", 1)[-1].strip()
    return doc[:1].upper() + doc[1:]


if __name__ == "__main__":
    sys.stdout.write(render())
