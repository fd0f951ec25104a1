"""zps.torch: train any torch.nn.Module, its code unchanged, with its parameters on zps.

    import zps.torch as zt
    engine = zt.initialize(model, config)
    loss = loss_fn(engine(x), y); engine.backward(loss); info = engine.step()

Import torch before this package (it loads a native library that torch's allocator must not
follow). docs/pytorch.md has the whole story.
"""

import torch  # noqa: F401  (first: see above)

from zps._errors import ShardStopped, ZpsError
from zps.torch.construct import init
from zps.torch.engine import Engine, initialize
from zps.torch.weights import WeightsMismatch

__all__: list[str] = ["Engine", "ShardStopped", "WeightsMismatch", "ZpsError", "init",
                      "initialize"]
