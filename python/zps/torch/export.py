"""Reading what `zps-ckpt export` writes (a safetensors file keyed by the layout's parameter
names, which are the module's own names: the first name of a tied parameter) back into a plain
model's state_dict. The file's header is read and checked by init_from's reader
(weights.read_header): no dependency beyond torch."""

import torch

from zps._errors import ZpsError
from zps.torch.weights import _TORCH, read_header


def read_safetensors(path):
    """{name: tensor} of a safetensors file, in the header's order. Raises ZpsError: NOT_FOUND
    (no file), DATA_LOSS (malformed or truncated, as weights.read_header checks it, or a dtype
    torch does not hold)."""
    tensors = read_header(path)
    with open(path, "rb") as f:
        raw = f.read()
    out = {}
    for name, t in tensors.items():
        dtype = _TORCH.get(t.dtype)
        if dtype is None:
            raise ZpsError("DATA_LOSS", f"{path}: {name} is {t.dtype}, which torch does not hold")
        data = bytearray(raw[t.offset:t.offset + t.nbytes])
        flat = torch.frombuffer(data, dtype=dtype) if t.nbytes else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(t.shape)
    return out


def state_dict_from_export(model, path):
    """The export at `path` as a state_dict for `model`: every parameter under each of its names
    (tied ones too), and the model's current buffers. load_state_dict(strict=True) takes it."""
    tensors = read_safetensors(path)
    sd = model.state_dict(keep_vars=True)
    first_name = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for pname, p in module._parameters.items():
            if p is not None:
                first_name.setdefault(id(p), f"{mname}.{pname}" if mname else pname)
    out = {}
    for key, t in sd.items():
        if isinstance(t, torch.nn.Parameter):
            name = first_name[id(t)]
            if name not in tensors:
                raise ZpsError("NOT_FOUND", f"{path} has no parameter {name}")
            out[key] = tensors[name].to(t.dtype).reshape(t.shape)
        else:
            out[key] = t.detach().clone()
    return out
