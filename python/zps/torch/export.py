"""Reading what `zps-ckpt export` writes (a safetensors file keyed by the layout's parameter
names, which are the module's own names: the first name of a tied parameter) back into a plain
model's state_dict. A small reader of the safetensors format (8-byte little-endian header length,
a JSON header, the raw tensors): no dependency beyond torch."""

import json
import struct

import torch

from zps._errors import ZpsError

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64}


def read_safetensors(path):
    """{name: tensor} of a safetensors file. Raises ZpsError (DATA_LOSS) for a malformed file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ZpsError("DATA_LOSS", f"{path}: too short for safetensors")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ZpsError("DATA_LOSS", f"{path}: header length {n} past the end")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta["dtype"])
        begin, end = meta["data_offsets"]
        if dtype is None or end > len(data) or begin > end:
            raise ZpsError("DATA_LOSS", f"{path}: bad entry {name}")
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if end > begin else \
            torch.empty(0, dtype=dtype)
        out[name] = t.reshape(meta["shape"])
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
