"""The embedded speculative-decoding engine: one interface for every method."""

from adaflash.engine.params import Output, Request, SamplingParams

__all__ = ["Output", "Request", "SamplingParams"]
