"""The optimizer state dtype through zps.torch: the config keys that set it (zps.state_dtype,
DeepSpeed's bf16.bf16_optimizer_states) and the one it refuses (bf16_master_weights_and_grads)."""

import pytest

import zps.torch as zt
from zps.torch import config as zconfig

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
