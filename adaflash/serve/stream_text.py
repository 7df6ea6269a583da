"""What a streamed chunk may show of a request's text so far.

Each chunk carries the cumulative text (SGLang's /generate stream), and clients print the difference
from the last one. So a chunk shows nothing the final text could take back: a character still being
decoded (U+FFFD at the end) and the end of the text where a stop string may be starting, which the
final text drops if the stop string completes.
"""

from __future__ import annotations


def shown_text(text: str, stops: list[str]) -> str:
    """`text` less a half-decoded last character and any ending that begins one of `stops`."""
    text = text.rstrip("\ufffd")
    cut = len(text)
    for stop in stops:
        at = text.find(stop)
        if at >= 0:  # complete already: the final text ends before it
            cut = min(cut, at)
            continue
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                cut = min(cut, len(text) - size)
                break
    return text[:cut]
