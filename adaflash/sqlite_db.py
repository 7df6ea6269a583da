"""sqlite-utils for the run log, imported without pandas.

sqlite-utils imports pandas whenever it is installed (datasets brings it) only to map
`pandas.Timestamp` to TEXT, a type the run log never stores. That import slows the start of every
process that opens the run log: the CLI, each worker, each job's watchdog. A later `import pandas`
elsewhere works as usual.
"""

from __future__ import annotations

import sys

if "sqlite_utils" not in sys.modules and "pandas" not in sys.modules:
    sys.modules["pandas"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        import sqlite_utils
    finally:
        del sys.modules["pandas"]

import sqlite_utils  # noqa: E402 - the module the guard above imported (or one imported before)

__all__ = ["sqlite_utils"]
