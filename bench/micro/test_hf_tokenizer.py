"""HfTokenizer.count vs the `tokenizers` package on the same tokenizer.json, side by side.

The tokenizers are trained here on the repository's own text (prose and code, 8000 tokens), one
with GPT-2's byte-level regex and one with Llama 3's split regex; the prompt is the ~2 KB one of
test_native.py. Every benchmark checks its count against the other side's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture
from tests.reference import chat_request, prompt_text
from tests.support import REPO

import router

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is a dev extra")
from tests import tokenizer_files  # noqa: E402  (needs tokenizers)

PROMPT = prompt_text()
BODY = chat_request()
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
cpu = pytest.mark.benchmark(timer=time.process_time)


def _texts() -> Iterator[str]:
    for pattern in ("README.md", "docs/**/*.md", "python/router/**/*.py", "tests/**/*.py"):
        for path in sorted(REPO.glob(pattern)):
            yield path.read_text(encoding="utf-8")


@pytest.fixture(scope="module", params=["gpt2", "llama3"])
def tokenizer_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("tok") / f"{request.param}.json"
    texts = list(_texts())
    if request.param == "gpt2":
        return tokenizer_files.byte_level_bpe(path, vocab_size=8000, corpus=texts)
    return tokenizer_files.llama3_style_bpe(path, vocab_size=8000, corpus=texts)


@cpu
def test_count_rust(benchmark: BenchmarkFixture, tokenizer_file: Path) -> None:
    native = router.HfTokenizer(tokenizer_file)
    count = benchmark(native.count, PROMPT)
    reference = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    assert count == len(reference.encode(PROMPT, add_special_tokens=False).ids)


@cpu
def test_count_tokenizers_package(benchmark: BenchmarkFixture, tokenizer_file: Path) -> None:
    reference = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    count = benchmark(lambda: len(reference.encode(PROMPT, add_special_tokens=False).ids))
    assert count == router.HfTokenizer(tokenizer_file).count(PROMPT)


@cpu
def test_count_chat_rust(benchmark: BenchmarkFixture, tokenizer_file: Path) -> None:
    native = router.HfTokenizer(tokenizer_file)
    template = router.ChatTemplate(CHATML)
    count = benchmark(native.count_chat, template, BODY)
    assert count == native.count(template.render(BODY))
