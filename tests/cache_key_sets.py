"""The published cache-key sets. For level "normalized": pairs of texts that must not share a key
(false hits: a different question, or the same words asking something else), pairs that must
share one (true hits: the four blank-space folds of rust/normalize.rs, away from the blank space
it keeps), and pairs that mean the same to most readers but are kept apart on purpose
(conservative misses); the same for a message's text parts, which a server renders as one text.
For both levels: request bodies that differ only in member order or repeated keys, apart where
a server could generate differently and together where every server reads members by key. Each
pair carries its reason.

tests/native/test_cache_key_sets.py checks them against the fingerprint; bench/cache.py sends the
false-hit set through a real router and counts hits (must be 0).
"""

from __future__ import annotations

from typing import NamedTuple


class Pair(NamedTuple):
    a: str
    b: str
    why: str


class PartsPair(NamedTuple):
    """The text parts of one user message."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    why: str


class BodyPair(NamedTuple):
    """Two raw request bodies (JSON text, so member order and repeated keys are as written)."""

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

# Level "normalized", a message's text parts (rust/normalize.rs `normalize_parts`): vLLM and
# llama.cpp's server join them with a line break for a template that takes a string, a template
# looping over the parts writes them one after the other, llama.cpp's render_content puts a
# blank line between them. Normalizing each part alone (router-fp/4) gave every pair one key.
PART_FALSE_HITS: tuple[PartsPair, ...] = (
    PartsPair(
        ("Fix this:\ndef f():", "  return 1"),
        ("Fix this:\ndef f():", "return 1"),
        "a part starting inside the text: its leading spaces are code indentation",
    ),
    PartsPair(("Join abc", " def"), ("Join abc", "def"), "a space between words vs none"),
    PartsPair(("  x = 1", "y = 2"), ("x = 1", "y = 2"), "first line's indentation in 2 parts"),
    PartsPair(
        ('How many spaces are between the quotes: "', "a     b", '"?'),
        ('How many spaces are between the quotes: "', "a b", '"?'),
        "a quotation opened in one part and closed in another",
    ),
    PartsPair(
        ("Run:\n```", "x  =  1", "```"),
        ("Run:\n```", "x = 1", "```"),
        "a fence opened in one part",
    ),
    PartsPair(("Run `ls", "-l  -a` now"), ("Run `ls", "-l -a` now"), "inline code across parts"),
    PartsPair(
        ("Name Age City", "Bob      Rome"),
        ("Name Age City", "Bob Rome"),
        "space-aligned columns across parts",
    ),
    PartsPair(
        ("a  b\nc  d", "e f\ng h\ni j\nk l"),
        ("a b\nc d", "e f\ng h\ni j\nk l"),
        "columns that are a paragraph of their own when parts are joined by a blank line",
    ),
    PartsPair(("a", "b"), ("ab",), "two parts (joined by a line break) vs one"),
    PartsPair(("a", "b"), ("a\nb",), "two parts (joined without separator) vs one"),
    PartsPair(("a\n", "b"), ("a", "\nb"), "where a part ends"),
    PartsPair(("", "a"), ("a", ""), "where a part ends"),
    PartsPair(("  ", "  x  y"), ("", "x y"), "leading spaces that make code when joined"),
)

PART_TRUE_HITS: tuple[PartsPair, ...] = (
    PartsPair(
        ("Hello  world", "Line two\nLine three\nLine four"),
        ("Hello world", "Line two\nLine three\nLine four"),
        "fold 4 inside a part, in every joining",
    ),
    PartsPair(("Hi there.", "Bye now. "), ("Hi there.", "Bye now."), "fold 1 at the last part"),
    PartsPair(("\n\nHi there.", "Bye."), ("Hi there.", "Bye."), "fold 2 at the first part"),
)


def _chat(extra: str) -> str:
    return '{"model":"m","temperature":0,"messages":[{"role":"user","content":"Hi"}]' + extra + "}"


def _schema(properties: str) -> str:
    return _chat(
        ',"response_format":{"type":"json_schema","json_schema":{"name":"r","strict":true,'
        '"schema":{"type":"object","properties":' + properties + ","
        '"required":["reasoning","answer"],"additionalProperties":false}}}'
    )


def _tool(parameters: str) -> str:
    return _chat(
        ',"tools":[{"type":"function","function":{"name":"f","parameters":' + parameters + "}}]"
    )


# Both levels: member order and repeated keys. Structured Outputs generate a schema's properties
# in order (OpenAI; vLLM's and llama.cpp's grammars follow it), chat templates render tools with
# `tojson`, which keeps it. Sorting every object's members (router-fp/4) gave every pair one key.
ORDER_FALSE_HITS: tuple[BodyPair, ...] = (
    BodyPair(
        _schema('{"reasoning":{"type":"string"},"answer":{"type":"string"}}'),
        _schema('{"answer":{"type":"string"},"reasoning":{"type":"string"}}'),
        "schema properties: reasoning first, or the answer first",
    ),
    BodyPair(
        _tool('{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string"}}}'),
        _tool('{"type":"object","properties":{"unit":{"type":"string"},"city":{"type":"string"}}}'),
        "tool parameters rendered into the prompt in order",
    ),
    BodyPair(
        _tool('{"type":"object","properties":{}}'),
        _tool('{"properties":{},"type":"object"}'),
        "a tool's schema members rendered in order",
    ),
    BodyPair(
        _chat(',"tool_choice":{"type":"function","function":{"name":"f"}}'),
        _chat(',"tool_choice":{"function":{"name":"f"},"type":"function"}'),
        "tool_choice is kept as written",
    ),
    BodyPair(
        _chat(',"guided_json":{"properties":{"x":{},"y":{}}}'),
        _chat(',"guided_json":{"properties":{"y":{},"x":{}}}'),
        "vLLM guided_json schema",
    ),
    BodyPair(
        _chat(',"x_vendor":{"a":1,"b":2}'),
        _chat(',"x_vendor":{"b":2,"a":1}'),
        "an unknown field's members",
    ),
    BodyPair(
        '{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}',
        '{"model":"m","messages":[{"role":"user","content":[{"text":"Hi","type":"text"}]}]}',
        "content parts keep their member order (the safe side)",
    ),
    BodyPair(
        _chat(',"response_format":{"type":"json_object","type":"text"}'),
        _chat(',"response_format":{"type":"text"}'),
        "a repeated key: a parser keeping the first reads json_object",
    ),
    BodyPair(
        _chat(',"response_format":{"type":"json_object","type":"text"}'),
        _chat(',"response_format":{"type":"text","type":"json_object"}'),
        "repeated keys in the other order",
    ),
    BodyPair(
        '{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}',
        '{"model":"m","messages":[{"role":"user","content":"b"}]}',
        "a message's repeated content",
    ),
)

ORDER_TRUE_HITS: tuple[BodyPair, ...] = (
    BodyPair(
        '{"model":"m","temperature":0,"messages":[{"role":"user","content":"Hi","name":"x"}]}',
        '{"messages":[{"name":"x","content":"Hi","role":"user"}],"temperature":0,"model":"m"}',
        "the request's and a message's own members: every server reads them by key",
    ),
    BodyPair(
        '{"model":"m","input":[{"role":"user","content":"Hi"}],"max_output_tokens":5}',
        '{"max_output_tokens":5,"input":[{"content":"Hi","role":"user"}],"model":"m"}',
        "a Responses input item's own members",
    ),
)
