"""Serving: the embedded engine over HTTP in SGLang's dialect, and SGLang's own launch command lines.

`adaflash.serve.server` holds the aiohttp server (heavy: it runs the engine); `adaflash.serve.sglang`
only builds argv lists and never imports SGLang or torch, so the control plane can use it.
"""
