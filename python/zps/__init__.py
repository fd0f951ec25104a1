"""zps: the Python side of the zps parameter server.

`zps.torch` trains any `torch.nn.Module` with its parameters living on zps shards
(docs/pytorch.md). This top-level package holds what is not torch-specific: the native binding
(`zps._native`), the error type, and the embedded local cluster (`zps.cluster`). Log records go
to the "zps" logger and its children (`zps._logging` says where they print by default).
"""

from zps import _logging
from zps._errors import ShardStopped, ZpsError

__all__: list[str] = ["ShardStopped", "ZpsError"]
__version__: str = "0.1.0"

_logging.install()
