"""Property: Rust normalize equals the Python reference and is idempotent; a message's text parts
share a key only when every way of joining them normalizes alike."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

import router
from tests import reference

# Assigned code points only: NFKC of characters unassigned in Python's Unicode database may
# differ from the (newer) tables compiled into the Rust crate.
CHARS = st.characters(exclude_categories=("Cs", "Cn", "Co"))
PIECES = st.sampled_from(
    [
        "Hello",
        "WORLD",
        "x",
        "3²",
        "½",
        "Ⅻ",
        "ｆｕｌｌ",
        "ß",
        "\u0301",
        "?!",
        ".",
        " ",
        "  ",
        "   ",
        "    ",
        "\t",
        "\n",
        "\r\n",
        "\n\n",
        "\x0b",
        "\x1c",
        "\x1f",
        "\x85",
        "\u2028",
        "\u00a0",
        "\u3000",
        "\u2009",
        "\u200b",
        "`",
        "``",
        "```",
        "```py",
        "~~~",
        "~~~~",
        "    x  =  1",
        '"',
        "'",
        "\u2019",
        "\u00ab",
        "a  b",
    ]
)
TEXT = st.one_of(
    st.text(CHARS, max_size=40),
    st.lists(PIECES, max_size=12).map("".join),
    st.lists(st.one_of(PIECES, st.text(CHARS, max_size=3)), max_size=8).map("".join),
)
BLANK = set(reference.SPACES + reference.LINE_BREAKS)


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_matches_reference(text: str) -> None:
    assert router.normalize(text) == reference.normalize(text)


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_idempotent(text: str) -> None:
    once = router.normalize(text)
    assert router.normalize(once) == once


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_only_blank_space_changes(text: str) -> None:
    """Every other character survives, in order; no line break is added."""
    once = router.normalize(text)
    assert [c for c in once if c not in BLANK] == [c for c in text if c not in BLANK]
    breaks = set(reference.LINE_BREAKS)
    assert sum(c in breaks for c in once) <= sum(c in breaks for c in text)


def _parts_body(parts: list[str]) -> bytes:
    content = [{"type": "text", "text": p} for p in parts]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(TEXT, min_size=2, max_size=4))
def test_text_parts_match_reference(parts: list[str]) -> None:
    body = _parts_body(parts)
    assert router.canonical(body, level="normalized") == reference.canonical(
        body, level="normalized"
    )


@settings(max_examples=500, deadline=None)
@given(st.lists(TEXT, min_size=2, max_size=4), st.data())
def test_text_parts_share_a_key_only_if_every_joining_normalizes_alike(
    parts: list[str], data: st.DataObject
) -> None:
    """Blank space changed in some parts, or a part boundary moved: the same key only if the
    parts joined by nothing, a line break and a blank line normalize alike, part for part."""
    other = list(parts)
    for i, part in enumerate(other):
        change = data.draw(st.sampled_from(["keep", "fold", "widen", "strip", "shift"]))
        if change == "fold":
            other[i] = part.replace("  ", " ")
        elif change == "widen":
            other[i] = part.replace(" ", "  ", 1)
        elif change == "strip":
            other[i] = part.strip(" ")
        elif change == "shift" and i + 1 < len(other) and part:
            other[i], other[i + 1] = part[:-1], part[-1] + other[i + 1]
    same = router.fingerprint(_parts_body(parts), level="normalized") == router.fingerprint(
        _parts_body(other), level="normalized"
    )
    if same:
        for joiner in ("", "\n", "\n\n"):
            assert router.normalize(joiner.join(parts)) == router.normalize(joiner.join(other))
        # Where each part ends counts too: the joinings with a line break, part for part.
        assert reference.normalize_parts(parts)[0] == reference.normalize_parts(other)[0]
