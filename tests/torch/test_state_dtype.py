"""The optimizer state dtype through zps.torch: the config keys that set it (zps.state_dtype,
DeepSpeed's bf16.bf16_optimizer_states) and the one it refuses (bf16_master_weights_and_grads),
and, for every state dtype, a job that trains, checkpoints, exports fp32 masters with zps-ckpt
and repeats bit for bit."""


import pytest
import torch
import torch.nn.functional as F

import zps.torch as zt
from zps.torch import config as zconfig
from conftest import Mlp, base_config, checkpoint_stores, zps_ckpt

STATE_DTYPES = ["fp32", "bf16", "int8"]


def test_zps_state_dtype_goes_to_the_job():
    assert zconfig.load({}).state_dtype == "fp32"
    assert "state_dtype" not in zconfig.load({}).job["optimizer"]  # the job spec's default
    for dtype in STATE_DTYPES:
        c = zconfig.load({"zps": {"state_dtype": dtype}})
        assert c.state_dtype == dtype
        assert c.job["optimizer"]["state_dtype"] == dtype


def test_deepspeed_bf16_optimizer_states_means_bf16():
    c = zconfig.load({"bf16": {"enabled": True, "bf16_optimizer_states": True}})
    assert c.state_dtype == "bf16" and c.job["optimizer"]["state_dtype"] == "bf16"
    c = zconfig.load({"bf16": {"bf16_optimizer_states": True}, "zps": {"state_dtype": "bf16"}})
    assert c.state_dtype == "bf16"
    assert zconfig.load({"bf16": {"bf16_optimizer_states": False}}).state_dtype == "fp32"


def test_bf16_master_weights_are_refused():
    with pytest.raises(zt.ZpsError, match="fp32 master") as e:
        zconfig.load({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}})
    assert e.value.code == "INVALID_ARGUMENT"
    assert "bf16.bf16_master_weights_and_grads" in str(e.value)
    # false is DeepSpeed's default, and what zps does anyway
    zconfig.load({"bf16": {"bf16_master_weights_and_grads": False}})


def test_bad_or_contradicting_state_dtype_is_named():
    with pytest.raises(zt.ZpsError, match=r"zps\.state_dtype"):
        zconfig.load({"zps": {"state_dtype": "int4"}})
    with pytest.raises(zt.ZpsError, match=r"zps\.state_dtype.*bf16_optimizer_states"):
        zconfig.load({"bf16": {"bf16_optimizer_states": True}, "zps": {"state_dtype": "int8"}})


def _batches(n):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)) for _ in range(n)]


def _cfg(dtype, **zps_keys):
    cfg = base_config(serving_dtype="fp32", chunk_elems=8192, state_dtype=dtype, **zps_keys)
    cfg["optimizer"]["params"]["lr"] = 1e-3
    return cfg


def _train(engine, batches, checkpoint_at=-1):
    for i, (x, y) in enumerate(batches):
        if i == checkpoint_at:
            engine.save_checkpoint()
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()


@pytest.mark.parametrize("dtype", STATE_DTYPES)
def test_state_dtype_trains_checkpoints_and_exports(dtype, tmp_path):
    from zps.torch.export import state_dict_from_export
    torch.manual_seed(0)
    model = Mlp()
    with zt.initialize(model, _cfg(dtype, shards=2, data_dir=str(tmp_path / "c"))) as engine:
        assert engine.job["optimizer"]["state_dtype"] == dtype
        _train(engine, _batches(4), checkpoint_at=2)
        assert engine.last_checkpoint_step == 3
        out = tmp_path / "model.safetensors"
        zps_ckpt("export", "--data-dir", checkpoint_stores(engine), "--out", out, "--step", 3)
    plain = Mlp()
    plain.load_state_dict(state_dict_from_export(plain, out))
    # The same three steps again, on one shard without a checkpoint: the same fp32 masters.
    torch.manual_seed(0)
    again = Mlp()
    with zt.initialize(again, _cfg(dtype)) as engine:
        _train(engine, _batches(3))
        three = engine.state_dict()
    for k, v in plain.state_dict().items():
        assert torch.equal(v, three[k]), k
    torch.manual_seed(0)
    assert not torch.equal(Mlp().a.weight, three["a.weight"])  # it trained
