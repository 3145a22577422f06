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
        "please",
        "Please,",
        "thanks",
        "thank you",
        "PLZ",
        " ",
        "  ",
        "\t",
        "\n",
        ".",
        "!",
        "?",
        ",",
        "…",
        "。",
        "Hello",
        "WORLD",
        "ß",
        "ﬁ",
        "İ",
        "\u0345",
        "\u0301",
        "ǅ",
        "Σ",
        "ς",
        "\u3000",
        "\u00a0",
        "\u2028",
        "\x1c",
        "\x85",
        "ｆｕｌｌ",
        "Ⅻ",
        "㍱",
        "x",
    ]
)
TEXT = st.one_of(
    st.text(CHARS, max_size=40),
    st.lists(PIECES, max_size=12).map("".join),
    st.lists(st.one_of(PIECES, st.text(CHARS, max_size=3)), max_size=8).map("".join),
)
FLAGS = st.booleans()


@settings(max_examples=250, deadline=None)
@given(TEXT, FLAGS, FLAGS)
def test_matches_reference(text: str, strip_punctuation: bool, strip_filler: bool) -> None:
    got = router.normalize(text, strip_punctuation=strip_punctuation, strip_filler=strip_filler)
    want = reference.normalize(text, strip_punctuation=strip_punctuation, strip_filler=strip_filler)
    assert got == want


@settings(max_examples=250, deadline=None)
@given(TEXT, FLAGS, FLAGS)
def test_idempotent(text: str, strip_punctuation: bool, strip_filler: bool) -> None:
    once = router.normalize(text, strip_punctuation=strip_punctuation, strip_filler=strip_filler)
    twice = router.normalize(once, strip_punctuation=strip_punctuation, strip_filler=strip_filler)
    assert twice == once
