"""The one error type of the Python package: a zps Status raised as an exception."""


class ZpsError(RuntimeError):
    """A zps failure. `code` is the Status code name (e.g. "INVALID_ARGUMENT", "UNAVAILABLE",
    "UNAUTHENTICATED"), and the message names the cause."""

    def __init__(self, code, message):
        super().__init__(message if message.startswith(code) else f"{code}: {message}")
        self.code = code
