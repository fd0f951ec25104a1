"""State out and in: state_dict from the servers into a plain model, zt.init construction, and a
resumed job that takes the servers' values."""

import resource

import torch
import torch.nn as nn
import torch.nn.functional as F

import zps.torch as zt
from zps.cluster import LocalCluster
from zps.torch.params import storage_bytes
from conftest import base_config, checkpoint_stores, zps_ckpt


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 40, bias=False)
        self.head.weight = self.embed.weight          # tied in the parent's __init__
        nn.init.zeros_(self.body[3].bias)             # a parent re-initialising a child

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (n, 8, 9), generator=g)
    return [(b[:, :-1], b[:, 1:]) for b in ids]


def _loss(out, y):
    return F.cross_entropy(out.reshape(-1, 40), y.reshape(-1))


def test_state_dict_loads_into_the_unwrapped_model():
    torch.manual_seed(0)
    model = Net()
    plain = Net()
    with zt.initialize(model, base_config(serving_dtype="fp32")) as engine:
        for x, y in _batches(5):
            engine.backward(_loss(engine(x), y))
            engine.step()
        sd = engine.state_dict()
        assert list(sd) == list(plain.state_dict())
        plain.load_state_dict(sd)
        x, _ = _batches(1)[0]
        with torch.no_grad():
            torch.testing.assert_close(plain(x), engine(x), rtol=0, atol=0)


def test_zt_init_builds_without_holding_values():
    torch.manual_seed(0)
    reference = Net()
    torch.manual_seed(0)
    with zt.init():
        model = Net()
    for p in model.parameters():
        assert storage_bytes(p.data) == 0
    assert model.head.weight is model.embed.weight
    with zt.initialize(model, base_config(serving_dtype="fp32")) as engine:
        got = engine.state_dict()
        for k, v in reference.state_dict().items():
            assert torch.equal(got[k], v), k


def test_resumed_job_takes_the_servers_values(tmp_path):
    with LocalCluster(shards=2) as cluster:
        token = tmp_path / "token"
        token.write_text(cluster.token)
        cfg = {"zps": {"endpoint": cluster.endpoint, "token_file": str(token),
                       "serving_dtype": "fp32"}}
        torch.manual_seed(0)
        first = Net()
        batches = _batches(6)
        with zt.initialize(first, cfg) as engine:
            for x, y in batches[:3]:
                engine.backward(_loss(engine(x), y))
                engine.step()
            trained = engine.state_dict()
        # A new process-like start: fresh random weights, same job. It must not upload them.
        torch.manual_seed(123)
        second = Net()
        with zt.initialize(second, cfg) as engine:
            assert engine.global_step == 3
            resumed = engine.state_dict()
            for k in trained:
                assert torch.equal(trained[k], resumed[k]), k
            for x, y in batches[3:]:
                engine.backward(_loss(engine(x), y))
                assert engine.step()["step"] >= 3


def test_checkpoint_then_export_loads_into_the_unwrapped_model(tmp_path):
    from zps.torch.export import state_dict_from_export
    torch.manual_seed(0)
    model = Net()
    cfg = base_config(serving_dtype="fp32", shards=2, data_dir=str(tmp_path / "cluster"))
    with zt.initialize(model, cfg) as engine:
        for i, (x, y) in enumerate(_batches(4)):
            if i == 2:
                engine.save_checkpoint()
            engine.backward(_loss(engine(x), y))
            info = engine.step()
            if i == 2:
                assert info["checkpoint"] and engine.last_checkpoint_step == 3
        at_end = engine.state_dict()
        out = tmp_path / "model.safetensors"
        zps_ckpt("export", "--data-dir", checkpoint_stores(engine), "--out", out, "--step", 3)
    plain = Net()
    plain.load_state_dict(state_dict_from_export(plain, out))
    assert plain.head.weight is plain.embed.weight
    # The export is the state after step index 2 (version 3): one step before the end.
    assert not torch.equal(plain.body[0].weight, at_end["body.0.weight"])
    torch.manual_seed(0)
    again = Net()
    with zt.initialize(again, base_config(serving_dtype="fp32")) as engine:
        for x, y in _batches(3):
            engine.backward(_loss(engine(x), y))
            engine.step()
        three = engine.state_dict()
    for k, v in plain.state_dict().items():
        assert torch.equal(v, three[k]), k


def test_state_dict_is_the_fp32_masters_with_bf16_serving_copies():
    torch.manual_seed(0)
    model = Net()
    with zt.initialize(model, base_config(serving_dtype="bf16")) as engine:
        for x, y in _batches(3):
            engine.backward(_loss(engine(x), y))
            engine.step()
        sd = engine.state_dict()
        w = sd["body.0.weight"]
        # The masters carry more than bf16's 8 bits of mantissa; the served copy does not.
        assert not torch.equal(w, w.bfloat16().float())
        served = torch.empty_like(w)
        zp = engine.res.by_param[id(model.body[0].weight)]
        engine.client.fetch_into([zp.id], [served.data_ptr()], [0])
        assert torch.equal(served, w.bfloat16().float())
