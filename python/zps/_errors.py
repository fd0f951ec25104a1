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


class ShardStopped(ZpsError):
    """An embedded shard (zps.cluster.LocalCluster) exited while the job needed it. `code` is the
    shard's own Status code when its log ends with one ("zps-server: CODE: message", what
    zps-server prints before it exits), else UNAVAILABLE (killed by a signal, or no status).

    shard: its ordinal; returncode: its exit code, or minus the signal that ended it (as
    subprocess has it); status: the shard's own "CODE: message" ("" when it left none);
    log_path: its log; cluster_dir: the cluster directory, kept for the user to read."""

    shard: int
    returncode: int
    status: str
    log_path: str
    cluster_dir: str

    def __init__(self, code: str, message: str, *, shard: int, returncode: int, status: str,
                 log_path: str, cluster_dir: str) -> None:
        super().__init__(code, message)
        self.shard, self.returncode, self.status = shard, returncode, status
        self.log_path, self.cluster_dir = log_path, cluster_dir
