"""zps: the Python side of the zps parameter server.

`zps.torch` trains any `torch.nn.Module` with its parameters living on zps shards
(docs/pytorch.md). This top-level package holds what is not torch-specific: the native binding
(`zps._native`), the error type, and the embedded local cluster (`zps.cluster`).
"""

from zps._errors import ZpsError

__all__ = ["ZpsError"]
__version__ = "0.1.0"
