"""The one error type of the Python package: a zps Status raised as an exception."""

from __future__ import annotations


class ZpsError(RuntimeError):
    """A zps failure. `code` is the Status code name (e.g. "INVALID_ARGUMENT", "UNAVAILABLE",
    "UNAUTHENTICATED"), and the message names the cause."""

    code: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message if message.startswith(code) else f"{code}: {message}")
        self.code = code


def stale_step(error: BaseException) -> bool:
    """A push refused because its step is already decided and published on that shard
    (FAILED_PRECONDITION "stale step N (chunk at version N+1)", ShardState::BeginPush)."""
    return (isinstance(error, ZpsError) and error.code == "FAILED_PRECONDITION"
            and "stale step" in str(error))
