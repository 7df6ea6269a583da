"""A growing answer's text, decoded a few tokens at a time.

A stream's event and a stop-string check need the text so far. Decoding the whole answer each time
costs O(n) per token, O(n²) over an answer (about a second of CPU over a 4,000-token answer, taken
from the engine thread through the GIL). `TextSoFar` decodes only a window: the tokens of the last
piece it added, as context, and the new ones after them. What a window adds is the difference between
its text and its context's, so tokenizers whose decoding depends on the neighbours (a leading space,
bytes that complete a character) add the same as a whole decode would. Where a window's text does not
extend its context's, the answer is decoded whole once and the window starts again after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]
PARTIAL = "\ufffd"  # what a decoder shows for bytes that do not yet form a character


class TextSoFar:
    """The text of a token list that only grows, less a last character still being decoded."""

    CONTEXT = 4  # tokens kept as the window's context after a whole decode

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._text = ""  # the text of ids[:_read]
        self._start = 0  # the window's first token: the context of the last piece added
        self._read = 0

    def update(self, ids: Sequence[int]) -> str:
        """The text of `ids`, which extends the list of the last call; a trailing partial character is
        held back until the tokens that complete it arrive."""
        if len(ids) < self._read:
            raise ValueError(f"the token list shrank from {self._read} to {len(ids)}: a TextSoFar follows one answer")
        if len(ids) == self._read:
            return self._text
        context = self._decode(list(ids[self._start:self._read]))
        window = self._decode(list(ids[self._start:]))
        if not window.startswith(context):  # the tokenizer redrew the context's text: decode it all once
            whole = self._decode(list(ids))
            if whole.endswith(PARTIAL):
                return whole.rstrip(PARTIAL)
            self._text, self._start, self._read = whole, max(0, len(ids) - self.CONTEXT), len(ids)
            return whole
        added = window[len(context):]
        if added and not added.endswith(PARTIAL):
            self._text += added
            self._start, self._read = self._read, len(ids)
        return self._text + added.rstrip(PARTIAL) if added.endswith(PARTIAL) else self._text
