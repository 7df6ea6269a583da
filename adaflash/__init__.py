"""adaflash: adaptive speculative decoding with on-policy distilled diffusion drafters."""

__version__ = "0.1.0"
