"""Property: Rust normalize equals the Python reference and is idempotent."""

from __future__ import annotations

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
