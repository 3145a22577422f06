"""The published cache-key sets for level "normalized": pairs that must not share a key (false
hits: a different question, or the same words asking something else), pairs that must share one
(true hits: the four blank-space folds of rust/normalize.rs, away from the blank space it keeps),
and pairs that mean the same to most readers but are kept apart on purpose (conservative misses).
Each pair carries its reason.

tests/native/test_cache_key_sets.py checks them against the fingerprint; bench/cache.py sends the
false-hit set through a real router and counts hits (must be 0).
"""

from __future__ import annotations

from typing import NamedTuple


class Pair(NamedTuple):
    a: str
    b: str
    why: str


FALSE_HITS: tuple[Pair, ...] = (
    # The examples of the issue ("Hostile clients, hostile regions", item 9).
    Pair("What is 3²?", "What is 32?", "superscript is an exponent"),
    Pair("x₂ + ½", "x2 + 1⁄2", "subscript index, vulgar fraction vs fraction slash"),
    Pair("Ⅻ", "xii", "roman numeral character vs letters"),
    Pair("Ⅻ", "XII", "roman numeral character vs letters"),
    Pair("abc!", "abc", "trailing punctuation"),
    Pair("Delete everything?", "Delete everything.", "a question vs an order"),
    Pair("Really?", "Really?!", "repeated punctuation"),
    Pair("What does a??! do", "What does a do", "`??!` is the C trigraph for `|`"),
    Pair(
        "```python\nif ready:\n    start()\nlog()\n```",
        "```python\nif ready:\n    start()\n    log()\n```",
        "fenced code differing only in indentation",
    ),
    Pair(
        "def f(x):\n    if x:\n        return 1\n    return 2",
        "def f(x):\n    if x:\n        return 1\n        return 2",
        "unfenced code differing only in indentation",
    ),
    Pair("    print(1)", "print(1)", "4 leading spaces make an indented code block"),
    Pair("a:\n  b: 1\n  c: 2", "a:\n  b: 1\nc: 2", "YAML nesting by indentation"),
    Pair("  x = 1\ny = 2", "x = 1\ny = 2", "first line's indentation in multi-line text"),
    Pair("- a\n  - b", "- a\n- b", "nested vs flat Markdown list"),
    Pair(
        "Decode this base64: SGVsbG8gV29ybGQ=",
        "Decode this base64: sgvsbg8gv29ybgq=",
        "base64 differing only in case",
    ),
    Pair("Decode SGVsbG8=", "Decode sGVsbG8=", "base64 differing in one letter's case"),
    Pair(
        "What does getUserId return?",
        "What does getUserID return?",
        "identifiers differing only in case",
    ),
    Pair("What does MAX_SIZE hold?", "What does max_size hold?", "constant vs variable"),
    Pair("Foo is undefined", "foo is undefined", "identifier at the start of the text"),
    Pair("Convert 5 mW to W", "Convert 5 MW to W", "milliwatt vs megawatt"),
    Pair("Mb to kB?", "mb to kB?", "megabit vs millibar, sentence-initial"),
    Pair("Is CO toxic?", "Is Co toxic?", "carbon monoxide vs cobalt"),
    Pair("Is US the answer?", "Is us the answer?", "a country vs a pronoun"),
    Pair(
        "Is ｐａｙｐａｌ.com safe to log in to?",
        "Is paypal.com safe to log in to?",
        "fullwidth look-alike domain",
    ),
    Pair("What is the code point of Ａ?", "What is the code point of A?", "fullwidth letter"),
    Pair("How many UTF-8 bytes is １２３?", "How many UTF-8 bytes is 123?", "fullwidth digits"),
    Pair("How many characters in ﬁne?", "How many characters in fine?", "ligature"),
    Pair("len('é') in Python?", "len('e\u0301') in Python?", "precomposed vs combining accent"),
    Pair("Convert 5 km² to m²", "Convert 5 km2 to m2", "squared unit"),
    Pair("Is 10⁻³ small?", "Is 10-3 small?", "superscript minus"),
    Pair("What is 1,000 / 10?", "What is 1.000 / 10?", "thousands separator vs decimal point"),
    Pair(
        "Is it safe to mix bleach and ammonia?",
        "Is it not safe to mix bleach and ammonia?",
        "negation",
    ),
    Pair("Do not delete the backup folder", "Do delete the backup folder", "negation"),
    Pair("Please delete the folder", "Delete the folder", "politeness words are words"),
    Pair(
        "What does `len('a  b')` return?",
        "What does `len('a b')` return?",
        "spaces inside an inline code span",
    ),
    Pair(
        "What does `print('a\u00a0b')` print?",
        "What does `print('a b')` print?",
        "no-break space inside an inline code span",
    ),
    Pair(
        "Run:\n```\nprint('a  b')\n```",
        "Run:\n```\nprint('a b')\n```",
        "spaces inside a fenced string literal",
    ),
    Pair(
        "~~~\n| a  | b |\n|----|---|\n~~~",
        "~~~\n| a | b |\n|----|---|\n~~~",
        "aligned table inside a tilde fence",
    ),
    Pair("Parse: a\tb\tc", "Parse: a b c", "tab-separated values"),
    Pair("Split a,b\nc,d", "Split a,b c,d", "CSV rows"),
    Pair("1. a\n2. b", "1. a 2. b", "list items"),
    Pair("a\n\nb", "a\nb", "paragraph break vs line break"),
    Pair("👩\u200d💻", "👩💻", "zero-width joiner makes one emoji"),
    Pair("Is 0.1 + 0.2 == 0.3?", "Is 0.1 + 0.2 = 0.3?", "comparison vs assignment"),
    # Blank space the first normalized level (router-fp/3) folded although it carries meaning.
    Pair(
        'How many spaces are between the quotes: "a     b"?',
        'How many spaces are between the quotes: "a b"?',
        "spaces inside double quotes",
    ),
    Pair(
        "What does len('a  b') return?",
        "What does len('a b') return?",
        "spaces inside a single-quoted string, no backticks",
    ),
    Pair(
        "「a  b」の空白は？",
        "「a b」の空白は？",
        "spaces inside corner brackets",
    ),
    Pair("foo  \nbar", "foo \nbar", "Markdown hard line break vs a stray trailing space"),
    Pair("Parse: a  \tb\nc\td", "Parse: a \tb\nc\td", "a tab-separated field's trailing padding"),
    Pair(
        "Item  Q1  Q2\nA         5\nB     3   4",
        "Item  Q1  Q2\nA     5\nB     3   4",
        "space-aligned columns: which column the 5 is in",
    ),
    Pair(
        "Name Age City\nBob      Rome",
        "Name Age City\nBob Rome",
        "space-aligned row with an empty cell under a single-spaced header",
    ),
)

TRUE_HITS: tuple[Pair, ...] = (
    Pair("How do I reset my password?", "  How do I reset my password? ", "fold 1 and 3"),
    Pair("How do I reset my password?", "How  do I   reset my password?", "fold 4"),
    Pair("How do I reset my password?", "How\u00a0do\u00a0I\u00a0reset my password?", "fold 4"),
    Pair("東京 タワー", "東京\u3000タワー", "fold 4: ideographic space"),
    Pair("10 km", "10\u202fkm", "fold 4: narrow no-break space"),
    Pair("a b", "a \u00a0\u2009 b", "fold 4: a mixed run"),
    Pair("Summarize this.", "Summarize this.\n\n", "fold 1"),
    Pair("Summarize this.", "Summarize this.\r\n", "fold 1: CRLF"),
    Pair("Summarize this.", "\n\nSummarize this.", "fold 2"),
    Pair("Hello world", "\u2003Hello world", "fold 3: em space"),
    Pair(
        "Line one here\nLine two\nLine three",
        "Line one  here\nLine two\nLine three  \n",
        "fold 4 and 1",
    ),
    Pair("First line\nsecond", "\n \nFirst line\nsecond", "fold 2: blank lines with spaces"),
    Pair(
        "Fix this:\n```\nx  =  1\n```",
        "Fix  this:\n```\nx  =  1\n```\n",
        "fold 4 outside the fence, 1 after it",
    ),
    Pair(
        "Use `git  status` to check.\n\nThen commit it.",
        "Use `git  status` to check.\n\nThen  commit  it. ",
        "fold 4 in a paragraph without backticks",
    ),
    Pair("Don't panic, it’s fine", "Don't  panic, it’s   fine", "fold 4: apostrophes"),
    Pair(
        'Summarize this.\n\nText: "a  b"',
        'Summarize  this.\n\nText: "a  b"',
        "fold 4 before the line of the first quote mark",
    ),
)

CONSERVATIVE_MISSES: tuple[Pair, ...] = (
    Pair("How do I reset my password?", "how do I reset my password?", "case is kept"),
    Pair("How do I reset my password?", "HOW DO I RESET MY PASSWORD?", "case is kept"),
    Pair("How do I reset my password?", "How do I reset my password??!", "punctuation is kept"),
    Pair(
        "How do I reset my password?",
        "Ｈｏｗ ｄｏ Ｉ ｒｅｓｅｔ ｍｙ ｐａｓｓｗｏｒｄ？",
        "fullwidth is kept",
    ),
    Pair("5 µs", "5 μs", "micro sign vs Greek mu: no Unicode normalization"),
    Pair("café", "cafe\u0301", "no Unicode normalization, not even NFC"),
    Pair("a b", "a\tb", "tabs are kept"),
    Pair("Use `a`  and  `b`", "Use `a` and `b`", "a line with a backtick is kept whole"),
    Pair("    Hello world", "Hello world", "4 leading spaces make code"),
    Pair("foo  \nbar", "foo   \nbar", "blank space at a line's end is kept exactly"),
    Pair(
        'He said "hi"  and  left',
        'He said "hi" and left',
        "from the line of the first quote mark on, every run is kept",
    ),
    Pair(
        "Line one here\nLine two",
        "Line one  here\nLine two",
        "a run on one of two lines may be a column with an empty cell",
    ),
)
