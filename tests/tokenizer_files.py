"""Small `tokenizer.json` files trained at test time with the `tokenizers` package, offline."""

from __future__ import annotations

from pathlib import Path

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

CHATML_SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

# Enough varied text for a few hundred merges: prose, code, numbers, non-Latin scripts, emoji.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Hello, world! How are you doing today? I'm fine, thanks; you're kind.",
    "def count(text: str) -> int:\n    return len(text.split())  # words\n\n",
    "for (int i = 0; i < 10; ++i) { total += values[i] * 2; }",
    "Numbers: 0 1 2 3 42 1234567890 3.14159 -17 1e-9 0xdeadbeef 2026-12-04",
    "Größe, naïve café — “quotes”, Ünïcödé; Ελληνικά, русский текст, עברית, العربية.",
    "日本語のテキストと中文文本，한국어 문장도 있습니다。",
    "emoji 🎉🚀✨ and flags 🇫🇷🇯🇵 and families 👨‍👩‍👧 mixed with text",
    "   leading spaces, tabs\tand\t\ttabs, trailing   \n\n\nnewlines   ",
    "A router sends each request to the healthiest region and fails over on errors.",
    "Tokens, tokenizers and token counts: prompts, completions, messages, responses.",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis.",
]


def _save(tokenizer: Tokenizer, path: Path) -> Path:
    tokenizer.save(str(path))
    return path


def byte_level_bpe(
    path: Path,
    specials: list[str] = CHATML_SPECIALS,
    vocab_size: int = 600,
    corpus: list[str] = CORPUS,
) -> Path:
    """A GPT-2 style byte-level BPE; its post-processor puts the first special token in front."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus * 4, trainer=trainer)
    bos = specials[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, tokenizer.token_to_id(bos))],
    )
    return _save(tokenizer, path)


def llama3_style_bpe(path: Path, vocab_size: int = 600, corpus: list[str] = CORPUS) -> Path:
    """A byte-level BPE split by Llama 3's pre-tokenizer regex (lookahead included)."""
    tokenizer = Tokenizer(models.BPE())
    pattern = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=LLAMA3_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus * 4, trainer=trainer)
    return _save(tokenizer, path)


def wordpiece(path: Path) -> Path:
    """A BERT-style WordPiece with its normalizer (lowercase, accents stripped) and [CLS]/[SEP]."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]"], show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer.post_processor = processors.BertProcessing(
        ("[SEP]", tokenizer.token_to_id("[SEP]")), ("[CLS]", tokenizer.token_to_id("[CLS]"))
    )
    return _save(tokenizer, path)


def llama2_style_bpe(path: Path) -> Path:
    """A SentencePiece-style BPE as Llama 2 and Mistral ship it: spaces become "▁" in the
    normalizer, no pre-tokenizer, byte fallback and an unknown token, BOS in front."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<unk>", "<s>", "</s>", "<0x0A>", "<0xF0>", "<0x9F>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", tokenizer.token_to_id("<s>"))],
    )
    return _save(tokenizer, path)


def unigram_metaspace(path: Path) -> Path:
    """A SentencePiece Unigram (T5 style): NFKC, "▁" word boundaries, an unknown token."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    return _save(tokenizer, path)
