"""The asynchronous on-policy pipeline: inference worker → swap buffer → training worker(s) → versions."""
