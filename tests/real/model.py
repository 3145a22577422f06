"""A tiny random-weight llama-architecture GGUF and a matching Hugging Face tokenizer.json.

The vocabulary is byte-level BPE (GPT-2 style, like Llama 3): all 256 bytes are tokens, so any
text tokenizes, plus merges learned deterministically from a fixed corpus, plus the ChatML
special tokens. llama.cpp reads it as `tokenizer.ggml.model = "gpt2"`, pre-tokenizer "gpt-2";
the tokenizer.json uses the same regex (ByteLevel pre-tokenizer), vocabulary and merges, so
both count the same tokens. Weights are seeded: the same parameters give the same file.

    python -m tests.real.model          # writes (or reuses) the cached model; prints its path
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tests.real.artifacts import cache_root

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIALS = (ENDOFTEXT, IM_START, IM_END)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Bump when the generator changes in a way the parameters do not show.
GENERATOR = 1

CORPUS = """\
The router sends each request to the nearest healthy region and fails over to the next one when
a region is slow, overloaded or down. A streamed answer that breaks in the middle is continued in
another region from the text already sent, so the client sees one answer. Health checks probe
every region; thresholds flip a region between healthy and unhealthy, and the selection returns
an ordered list of fallbacks. Requests carry an identifier that the router passes upstream and
writes to the access log with the status, the region, the latency and the number of tokens.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. How much wood
would a woodchuck chuck if a woodchuck could chuck wood? Hello, world! Once upon a time there was
a model that answered every question with a story about the weather, the mountains and the sea.
"""


@dataclass(frozen=True)
class ModelSpec:
    """What the generated model looks like; its hash names the cached files."""

    n_layer: int = 8
    n_embd: int = 512
    n_head: int = 8
    n_head_kv: int = 8
    n_ff: int = 1376
    n_ctx_train: int = 4096
    n_merges: int = 300
    seed: int = 1234
    generator: int = GENERATOR

    def key(self) -> str:
        blob = json.dumps({**asdict(self), "corpus": CORPUS, "template": CHAT_TEMPLATE})
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ModelFiles:
    gguf: Path
    tokenizer_json: Path
    spec: ModelSpec


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def learn_merges(n_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges from CORPUS; ties broken by the pair's text, so deterministic."""
    b2u = bytes_to_unicode()
    words = Counter(re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", CORPUS))
    seqs = {w: [b2u[b] for b in w.encode()] for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            seq = seqs[word]
            for pair in itertools.pairwise(seq):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for word, seq in seqs.items():
            out: list[str] = []
            i = 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[word] = out
    return merges


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    merges: list[tuple[str, str]]

    @property
    def ids(self) -> dict[str, int]:
        return {tok: i for i, tok in enumerate(self.tokens)}

    def special_id(self, token: str) -> int:
        return self.tokens.index(token)


def build_vocab(spec: ModelSpec) -> Vocab:
    """Bytes 0-255 first (in byte order), then one token per merge, then the special tokens."""
    b2u = bytes_to_unicode()
    merges = learn_merges(spec.n_merges)
    tokens = [b2u[b] for b in range(256)]
    tokens += [a + b for a, b in merges]
    tokens += list(SPECIALS)
    assert len(set(tokens)) == len(tokens), "duplicate token"
    return Vocab(tokens, merges)


def tokenizer_json(vocab: Vocab) -> str:
    """The Hugging Face tokenizer.json for the same vocabulary (no BOS added, like the GGUF)."""
    n_plain = len(vocab.tokens) - len(SPECIALS)
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": n_plain + i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab.ids,
            "merges": [[a, b] for a, b in vocab.merges],
        },
    }
    return json.dumps(data, ensure_ascii=False)


def _weights(spec: ModelSpec, vocab: Vocab) -> dict[str, np.ndarray]:
    """Seeded random weights; numpy shapes are (out, in) as in torch.nn.Linear."""
    rng = np.random.default_rng(spec.seed)
    n_vocab = len(vocab.tokens)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones() -> np.ndarray:
        return np.ones(spec.n_embd, dtype=np.float32)

    head_dim = spec.n_embd // spec.n_head
    out: dict[str, np.ndarray] = {"token_embd.weight": mat(n_vocab, spec.n_embd)}
    for i in range(spec.n_layer):
        blk = f"blk.{i}"
        out[f"{blk}.attn_norm.weight"] = ones()
        out[f"{blk}.attn_q.weight"] = mat(spec.n_embd, spec.n_embd)
        out[f"{blk}.attn_k.weight"] = mat(spec.n_head_kv * head_dim, spec.n_embd)
        out[f"{blk}.attn_v.weight"] = mat(spec.n_head_kv * head_dim, spec.n_embd)
        out[f"{blk}.attn_output.weight"] = mat(spec.n_embd, spec.n_embd)
        out[f"{blk}.ffn_norm.weight"] = ones()
        out[f"{blk}.ffn_gate.weight"] = mat(spec.n_ff, spec.n_embd)
        out[f"{blk}.ffn_up.weight"] = mat(spec.n_ff, spec.n_embd)
        out[f"{blk}.ffn_down.weight"] = mat(spec.n_embd, spec.n_ff)
    out["output_norm.weight"] = ones()
    output = mat(n_vocab, spec.n_embd)
    # Only printable ASCII and the merged tokens may win at temperature 0: a zero row's logit is
    # 0 while some random row is always above it, so greedy output never ends early on a special
    # token and is always valid UTF-8 (a 400-token stream really is 400 tokens).
    b2u = bytes_to_unicode()
    printable = {b2u[b] for b in range(0x20, 0x7F)} | {b2u[0x0A]}
    for i, tok in enumerate(vocab.tokens):
        if (i < 256 and tok not in printable) or tok in SPECIALS:
            output[i] = 0
    out["output.weight"] = output
    return out


def write_gguf(path: Path, spec: ModelSpec, vocab: Vocab) -> None:
    import gguf  # only the build step needs it

    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("router-real-tiny")
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if tok in SPECIALS else gguf.TokenType.NORMAL
            for tok in vocab.tokens
        ]
    )
    writer.add_token_merges([f"{a} {b}" for a, b in vocab.merges])
    writer.add_bos_token_id(vocab.special_id(ENDOFTEXT))
    writer.add_eos_token_id(vocab.special_id(IM_END))
    writer.add_eot_token_id(vocab.special_id(IM_END))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _weights(spec, vocab).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)


def ensure_model(spec: ModelSpec | None = None) -> ModelFiles:
    """The cached GGUF and tokenizer.json for `spec`, written first if missing."""
    spec = spec or ModelSpec()
    directory = cache_root() / "models" / spec.key()
    directory.mkdir(parents=True, exist_ok=True)
    files = ModelFiles(directory / "model.gguf", directory / "tokenizer.json", spec)
    if not files.gguf.exists() or not files.tokenizer_json.exists():
        vocab = build_vocab(spec)
        files.tokenizer_json.write_text(tokenizer_json(vocab), encoding="utf-8")
        write_gguf(files.gguf, spec, vocab)
    return files


def main() -> None:
    files = ensure_model()
    print(f"model {files.gguf} ({files.gguf.stat().st_size / 2**20:.1f} MiB)")
    print(f"tokenizer {files.tokenizer_json}")


if __name__ == "__main__":
    main()
