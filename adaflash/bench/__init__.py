"""Benchmarks: an async client for any SGLang-dialect server, SGLang's metric names, comparisons.

Light on purpose (no torch at import): `metrics` and `compare` are pure functions the TUI reuses,
`client` needs aiohttp only, `matrix` starts servers as subprocesses.
"""
