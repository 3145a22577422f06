"""The sim's deterministic text: same request -> same tokens; a prefill continues the sequence."""

from __future__ import annotations

from router.sim import text

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


def test_same_request_same_tokens_different_request_different_tokens() -> None:
    first, _ = text.chat_tokens("m", MESSAGES)
    again, _ = text.chat_tokens("m", [dict(m) for m in MESSAGES])
    other, _ = text.chat_tokens("m", [*MESSAGES[:1], {"role": "user", "content": "Bye"}])
    assert first == again
    assert first != other
    assert first != text.chat_tokens("m2", MESSAGES)[0]
    assert text.MIN_TOKENS <= len(first) <= text.MAX_TOKENS


def test_only_role_and_content_seed_the_text() -> None:
    decorated = [{**m, "name": "x"} for m in MESSAGES]
    reordered = [{"content": m["content"], "role": m["role"]} for m in MESSAGES]
    base = text.chat_tokens("m", MESSAGES)[0]
    assert text.chat_tokens("m", reordered)[0] == base
    assert text.chat_tokens("m", decorated)[0] == base


def test_every_prefill_prefix_resumes_to_the_full_text() -> None:
    full = text.full_chat_text("m", MESSAGES)
    for cut in range(len(full) + 1):
        prefill = full[:cut]
        tokens, used = text.chat_tokens("m", [*MESSAGES, {"role": "assistant", "content": prefill}])
        assert used == cut
        assert prefill + "".join(tokens) == full


def test_a_prefill_that_is_not_a_prefix_starts_a_new_sequence() -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Something else"}]
    tokens, used = text.chat_tokens("m", messages)
    assert used == 0
    assert "".join(tokens) != text.full_chat_text("m", MESSAGES)


def test_embeddings_are_deterministic_unit_vectors() -> None:
    v = text.embedding("e", "alpha", 8)
    assert v == text.embedding("e", "alpha", 8)
    assert v != text.embedding("e", "beta", 8)
    assert abs(sum(x * x for x in v) - 1.0) < 1e-9


def test_a_stop_string_ends_the_tokens_where_it_completes() -> None:
    tokens = ["The", " sea", " is", " blue", " today."]
    # Within one token: that token cut where the stop string starts.
    assert text.stopped(tokens, ["lue"]) == (["The", " sea", " is", " b"], "lue")
    # Across tokens: the earlier ones went out already; the completing one adds nothing.
    assert text.stopped(tokens, ["is blue"]) == (["The", " sea", " is"], "is blue")
    assert text.stopped(tokens, ["green", " sea"]) == (["The"], " sea")
    assert text.stopped(tokens, ["green", ""]) == (tokens, None)
