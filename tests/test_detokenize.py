"""TextSoFar: a growing answer decoded in windows reads as the whole decode would, at every step."""

from __future__ import annotations

import random

import pytest

from adaflash.engine.detokenize import PARTIAL, TextSoFar

TEXTS = [
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.",
    "Crème brûlée, naïve café — 東京タワー 🗼🎉 and ∑ x² ≥ 0.",
    "  leading spaces,\ttabs\n\n\nand a trailing space ",
]


def whole(decode, ids):
    return decode(ids).rstrip(PARTIAL)


@pytest.mark.parametrize("seed", range(4))
def test_windows_read_as_the_whole_decode_at_every_step(tiny_target, seed):
    rng = random.Random(seed)
    decode = tiny_target.decode
    for text in TEXTS:
        ids = tiny_target.encode(text)
        so_far, taken, seen = TextSoFar(decode), 0, ""
        while taken < len(ids):
            taken = min(len(ids), taken + rng.randint(1, 4))  # a step's accepted tokens
            now = so_far.update(ids[:taken])
            assert now == whole(decode, ids[:taken]), (text, taken)
            assert now.startswith(seen)  # a stream never takes text back
            seen = now
        assert seen == text


def test_random_tokens_and_split_characters(tiny_target):
    """Byte tokens that split a character: the partial character is held back, never shown half."""
    rng = random.Random(7)
    decode = tiny_target.decode
    vocab = len(tiny_target.tokenizer)
    for _ in range(20):
        ids = [rng.randrange(vocab) for _ in range(40)]
        so_far = TextSoFar(decode)
        for end in range(1, len(ids) + 1):
            now = so_far.update(ids[:end])
            assert not now.endswith(PARTIAL)
        assert now == whole(decode, ids)


def test_windows_decode_a_few_tokens_not_the_whole_answer(tiny_target):
    calls: list[int] = []

    def counting(ids):
        calls.append(len(ids))
        return tiny_target.decode(ids)

    ids = tiny_target.encode(TEXTS[0] * 8)
    so_far = TextSoFar(counting)
    for end in range(1, len(ids) + 1):
        so_far.update(ids[:end])
    assert so_far.update(ids) == tiny_target.decode(ids)
    assert max(calls) <= 8, max(calls)  # windows, where the whole answer is hundreds of tokens
    with pytest.raises(ValueError, match="shrank"):
        so_far.update(ids[:3])


def test_the_targets_decode_is_transformers_decode(tiny_target, monkeypatch):
    """Target.decode goes to the fast tokenizer's backend directly, and gives transformers' text for the
    same ids: random ids, special tokens among them (left out), characters split across byte tokens. A
    tokenizer that cleans up spaces keeps transformers' decode."""
    tokenizer = tiny_target.tokenizer
    assert getattr(tokenizer, "backend_tokenizer", None) is not None and not tokenizer.clean_up_tokenization_spaces
    rng = random.Random(3)
    special = list(tokenizer.all_special_ids)
    cases = [tiny_target.encode(text) for text in TEXTS] + [special + tiny_target.encode(TEXTS[1]) + special]
    cases += [[rng.choice(special) if rng.random() < 0.1 else rng.randrange(len(tokenizer)) for _ in range(rng.randint(0, 30))]
              for _ in range(300)]
    for ids in cases:
        assert tiny_target.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True), ids
    calls = []
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    monkeypatch.setattr(type(tokenizer), "decode", lambda self, ids, **kw: calls.append(ids) or "cleaned")
    assert tiny_target.decode(cases[0]) == "cleaned" and calls == [cases[0]]
