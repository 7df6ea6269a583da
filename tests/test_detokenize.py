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
