"""Where the package's log records go when the application configured no logging.

Progress lines (zps.torch's `steps_per_print`, INFO) and notices (WARNING) go through
`logging.getLogger(__name__)` in each module, under the "zps" logger. The handler below, on
"zps", prints them as the package did before it logged: INFO to stdout, WARNING and above to
stderr, the message alone. It stays silent once the application has a handler of its own, on the
root logger or on "zps", which then receives the records instead.
"""

from __future__ import annotations

import logging
import sys


class DefaultOutput(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or any(
                h is not self for h in logging.getLogger("zps").handlers):
            return
        stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001  (logging's contract: report, never raise)
            self.handleError(record)


def install() -> None:
    """Puts one DefaultOutput on the "zps" logger (once)."""
    top = logging.getLogger("zps")
    if not any(isinstance(h, DefaultOutput) for h in top.handlers):
        top.addHandler(DefaultOutput())
