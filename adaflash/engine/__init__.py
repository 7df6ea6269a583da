"""The embedded speculative-decoding engine: one interface for every method."""

from adaflash.engine.params import METHODS, Output, Request, SamplingParams

__all__ = ["METHODS", "Output", "Request", "SamplingParams"]
