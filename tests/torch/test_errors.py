"""Bad use of zps.torch gets a ZpsError that names the cause; nothing hangs, nothing stored
changes."""

import os
import socket
import tempfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zps.torch as zt
from zps.cluster import LocalCluster
from conftest import base_config


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def test_unknown_config_key_is_named():
    for cfg, key in [({"optimiser": {}}, "config.optimiser"),
                     ({"zps": {"shard": 2}}, "config.zps.shard"),
                     ({"optimizer": {"type": "AdamW", "params": {"lr": 1, "amsgrad": True}}},
                      "config.optimizer.params.amsgrad"),
                     ({"fp16": {"enabled": True, "auto_cast": True}}, "config.fp16.auto_cast"),
                     ({"zero_optimization": {"stage": 3, "offload_param": {}}},
                      "config.zero_optimization.offload_param")]:
        with pytest.raises(zt.ZpsError, match=key.replace(".", r"\.")) as e:
            zt.initialize(_model(), cfg)
        assert e.value.code == "INVALID_ARGUMENT"


def test_bad_values_are_named():
    with pytest.raises(zt.ZpsError, match="optimizer.type"):
        zt.initialize(_model(), {"optimizer": {"type": "Lamb"}})
    with pytest.raises(zt.ZpsError, match="zps.serving_dtype"):
        zt.initialize(_model(), {"zps": {"serving_dtype": "int8"}})
    with pytest.raises(zt.ZpsError, match="zero_optimization.stage"):
        zt.initialize(_model(), {"zero_optimization": {"stage": 2}})
    with pytest.raises(zt.ZpsError, match="config file"):
        zt.initialize(_model(), "/nonexistent/ds_config.json")


def test_config_from_a_json_file():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write('{"optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "zps": {"shards": 1}}')
    try:
        with zt.initialize(_model(), f.name) as engine:
            assert engine.config.optimizer == "adamw"  # DeepSpeed's Adam is decoupled by default
            loss = engine(torch.randn(2, 4)).sum()
            engine.backward(loss)
            engine.step()
    finally:
        os.unlink(f.name)


def test_unserved_dtype_is_refused():
    model = _model().double()
    with pytest.raises(zt.ZpsError, match="float64") as e:
        zt.initialize(model, base_config())
    assert e.value.code == "INVALID_ARGUMENT"


def test_second_initialize_on_the_same_module():
    model = _model()
    with zt.initialize(model, base_config()):
        with pytest.raises(zt.ZpsError, match="already initialized") as e:
            zt.initialize(model, base_config())
        assert e.value.code == "FAILED_PRECONDITION"


def test_parameters_added_or_replaced_after_initialize():
    model = _model()
    with zt.initialize(model, base_config()) as engine:
        model[0].extra = nn.Parameter(torch.zeros(3))
        with pytest.raises(zt.ZpsError, match="gained parameters"):
            engine(torch.randn(2, 4))
        del model[0].extra
        engine(torch.randn(2, 4))  # back to the registered set: fine
        model[1].weight = nn.Parameter(torch.zeros(2, 9))
        with pytest.raises(zt.ZpsError, match="replaced after"):
            engine(torch.randn(2, 4))


def test_unreachable_servers_fail_fast():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["ZPS_TOKEN"] = "x"
    try:
        cfg = {"zps": {"endpoint": f"127.0.0.1:{port}", "connect_timeout_s": 1.0}}
        with pytest.raises(zt.ZpsError) as e:
            zt.initialize(_model(), cfg)
        assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        assert f"127.0.0.1:{port}" in str(e.value)
    finally:
        del os.environ["ZPS_TOKEN"]


def test_wrong_token_is_refused_and_changes_nothing(tmp_path):
    with LocalCluster(shards=1) as cluster:
        good = tmp_path / "good"
        good.write_text(cluster.token)
        bad = tmp_path / "bad"
        bad.write_text("not-the-token")
        model = _model()
        cfg = {"zps": {"endpoint": cluster.endpoint, "token_file": str(good), "shards": 1}}
        with zt.initialize(model, cfg) as engine:
            before = engine.state_dict()
            intruder = _model()
            bad_cfg = {"zps": {"endpoint": cluster.endpoint, "token_file": str(bad),
                               "shards": 1, "connect_timeout_s": 2.0}}
            with pytest.raises(zt.ZpsError) as e:
                zt.initialize(intruder, bad_cfg)
            assert e.value.code == "UNAUTHENTICATED"
            after = engine.state_dict()
            for k in before:
                assert torch.equal(before[k], after[k])


def test_a_shard_lost_mid_training_is_an_error_not_a_hang(tmp_path):
    with LocalCluster(shards=2) as cluster:
        token = tmp_path / "token"
        token.write_text(cluster.token)
        model = _model()
        # 64-element chunks put part of the model on shard 1, so the steps need it.
        cfg = {"zps": {"endpoint": cluster.endpoint, "token_file": str(token),
                       "op_timeout_s": 20, "chunk_elems": 64},
               "zero_optimization": {"stage3_param_persistence_threshold": 0}}
        with zt.initialize(model, cfg) as engine:
            x = torch.randn(2, 4)
            engine.backward(engine(x).sum())
            engine.step()
            cluster.kill_shard(1)
            with pytest.raises(zt.ZpsError) as e:
                for _ in range(3):
                    engine.backward(engine(x).sum())
                    engine.step()
            assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), e.value
            # Either the lost shard is named, or the coordinator says the job is recovering.
            assert "shard 1" in str(e.value) or "recovering" in str(e.value), e.value
            engine.res.release_all()
            assert engine.res.live_bytes == 0
