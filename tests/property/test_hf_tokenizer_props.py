"""Property: HfTokenizer's ids equal the tokenizers package's, ChatTemplate renders as Jinja2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import router
from tests.property.test_tokens_props import ADVERSARIAL_TEXT, TEXT

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is a dev extra")
pytest.importorskip("jinja2", reason="jinja2 is a dev extra")
from tests import tokenizer_files  # noqa: E402  (needs tokenizers)
from tests.native.test_hf_tokenizer import CHATML, KINDS, LLAMA3, jinja_render  # noqa: E402


@pytest.fixture(scope="module", params=KINDS)
def tokenizer_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    build = getattr(tokenizer_files, request.param)
    path: Path = build(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return path


def test_ids_equal_tokenizers_package(tokenizer_file: Path) -> None:
    native = router.HfTokenizer(tokenizer_file)
    reference = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    specials = st.sampled_from(["", "<s>", "<|im_start|>", "<|eot_id|>", "[CLS]", "</s>x"])

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(TEXT, ADVERSARIAL_TEXT), specials, st.booleans())
    def check(text: str, special: str, add_special_tokens: bool) -> None:
        for t in (text, special + text + special):
            ids = reference.encode(t, add_special_tokens=add_special_tokens).ids
            assert native.encode(t, add_special_tokens=add_special_tokens) == ids, repr(t)
            assert native.count(t, add_special_tokens=add_special_tokens) == len(ids), repr(t)

    check()


# Whitespace Python strips and Rust's str::trim does not (0x1C-0x1F) among Unicode spaces.
SPACES = st.text(st.sampled_from(" \t\n\x1c\x1f\u00a0\u2028\u3000ab"), max_size=8)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.one_of(TEXT, SPACES)}
)


@pytest.mark.parametrize("template", [CHATML, LLAMA3], ids=["chatml", "llama3"])
def test_render_equals_jinja2(template: str) -> None:
    native = router.ChatTemplate(template, "<s>", "</s>")

    @settings(max_examples=100, deadline=None)
    @given(st.lists(MESSAGE, max_size=4), st.booleans())
    def check(messages: list[dict[str, str]], add_generation_prompt: bool) -> None:
        expected = jinja_render(template, messages, None, add_generation_prompt)
        body = json.dumps({"messages": messages}).encode()
        assert native.render(body, add_generation_prompt) == expected

    check()
