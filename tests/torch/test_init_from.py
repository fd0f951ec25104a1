"""A new job's initial weights from safetensors: zt.initialize(..., init_from=path) with what
`zps-ckpt export` writes (one file, or the sharded set with its index), and the files that do not
fit the model (every offending name listed, nothing started or uploaded)."""

import json
import os
import pathlib
import struct
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zps._native
import zps.torch as zt
import zps.torch.engine as engine_mod
from zps.cluster import LocalCluster
from zps.torch.export import read_safetensors
from conftest import base_config, checkpoint_stores, zps_ckpt
from torchrun_args import torchrun_command

HERE = pathlib.Path(__file__).resolve().parent


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight          # tied: exported once, as embed.weight
        self.register_buffer("scale", torch.ones(16))

    def forward(self, ids):
        return self.head(self.norm(self.body(self.embed(ids))) * self.scale)


def _batches(n):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (n, 4, 9), generator=g)
    return [(b[:, :-1], b[:, 1:]) for b in ids]


def _loss(out, y):
    return F.cross_entropy(out.reshape(-1, 50), y.reshape(-1))


def write_safetensors(path, tensors, dtypes=None):
    """A plain safetensors writer: {name: tensor}; dtypes overrides a name's header dtype."""
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
             torch.float64: "F64", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": (dtypes or {}).get(name, names[t.dtype]),
                        "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Three steps of training on 2 shards, checkpointed at step 3 and exported: one fp32 file,
    one bf16 file, and the sharded set with a 4KB limit (embed.weight is 3200 bytes)."""
    tmp = tmp_path_factory.mktemp("exports")
    torch.manual_seed(0)
    model = Net()
    cfg = base_config(serving_dtype="fp32", shards=2, data_dir=str(tmp / "cluster"))
    with zt.initialize(model, cfg) as engine:
        for i, (x, y) in enumerate(_batches(3)):
            if i == 2:
                engine.save_checkpoint()
            engine.backward(_loss(engine(x), y))
            engine.step()
        assert engine.last_checkpoint_step == 3
        dirs = checkpoint_stores(engine)
        out = {"file": tmp / "model.safetensors", "bf16": tmp / "model-bf16.safetensors",
               "sharded": tmp / "sharded"}
        zps_ckpt("export", "--data-dir", dirs, "--out", out["file"])
        zps_ckpt("export", "--data-dir", dirs, "--out", out["bf16"], "--dtype", "bf16")
        printed = zps_ckpt("export", "--data-dir", dirs, "--out", out["sharded"],
                        "--max-shard-size", "4KB")
        assert "in 3 files" in printed, printed
    return out


def _fresh_model(seed=123):
    """Another initialisation, built inside zt.init: its own values are never uploaded."""
    torch.manual_seed(seed)
    with zt.init():
        return Net()


def _check_weights(engine, model, expected):
    """The servers' fp32 masters are exactly `expected` (by the module's first names), and the
    forward pass serves them."""
    got = engine.state_dict()
    for key in ("embed.weight", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
                "norm.weight", "norm.bias"):
        assert got[key].dtype == torch.float32
        assert torch.equal(got[key], expected[key].float()), key
    assert torch.equal(got["head.weight"], expected["embed.weight"].float())
    plain = Net()
    plain.load_state_dict(got)
    x, _ = _batches(1)[0]
    with torch.no_grad():
        assert torch.equal(engine(x), plain(x))


def test_sharded_export_round_trip(exports):
    sharded = exports["sharded"]
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    expected = {}
    for f in files:
        expected.update(read_safetensors(sharded / f))
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in expected.values())
    assert index["weight_map"] == {name: f for f in files for name in
                                   read_safetensors(sharded / f)}
    # The same bytes as the single-file export of the same step.
    single = read_safetensors(exports["file"])
    assert single.keys() == expected.keys()
    assert all(torch.equal(single[k], expected[k]) for k in single)

    for path in (sharded, sharded / "model.safetensors.index.json"):
        model = _fresh_model()
        with zt.initialize(model, base_config(serving_dtype="fp32"), init_from=path) as engine:
            assert engine.global_step == 0  # a new job
            _check_weights(engine, model, expected)
            x, y = _batches(1)[0]
            engine.backward(_loss(engine(x), y))
            assert engine.step()["step"] == 0


def test_a_resumed_job_takes_the_servers_values_not_the_file(tmp_path, exports):
    """init_from is a new job's start: a job that the servers already hold (a torchrun restart)
    keeps its trained values."""
    with LocalCluster(shards=1) as cluster:
        token = tmp_path / "token"
        token.write_text(cluster.token)
        cfg = {"zps": {"endpoint": cluster.endpoint, "token_file": str(token),
                       "serving_dtype": "fp32"}}
        start = read_safetensors(exports["file"])
        with zt.initialize(_fresh_model(), cfg, init_from=exports["file"]) as engine:
            _check_weights(engine, engine.module, start)
            for x, y in _batches(2):
                engine.backward(_loss(engine(x), y))
                engine.step()
            trained = engine.state_dict()
        with zt.initialize(_fresh_model(), cfg, init_from=exports["file"]) as engine:
            assert engine.global_step == 2
            resumed = engine.state_dict()
            assert not torch.equal(resumed["embed.weight"], start["embed.weight"])
            for k in trained:
                assert torch.equal(trained[k], resumed[k]), k


def test_single_file_and_bf16_file(exports):
    expected = read_safetensors(exports["file"])
    model = _fresh_model()
    with zt.initialize(model, base_config(serving_dtype="fp32"),
                       init_from=exports["file"]) as engine:
        _check_weights(engine, model, expected)
    # BF16 in the file: the masters are its values widened to fp32, exactly.
    bf16 = read_safetensors(exports["bf16"])
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())
    model = _fresh_model()
    with zt.initialize(model, base_config(serving_dtype="fp32"),
                       init_from=exports["bf16"]) as engine:
        _check_weights(engine, model, bf16)


def test_rank_0_holds_one_tensor_at_a_time(exports, monkeypatch):
    """Streaming: when a tensor is read, no tensor read before it is still held (bounded memory
    whatever the model size)."""
    import weakref
    from zps.torch import weights
    alive, reads = [], []
    original = weights.InitialWeights.read

    def read(self, t):
        held = [r for r in alive if r() is not None]
        reads.append((t.name, len(held)))
        out = original(self, t)
        alive.append(weakref.ref(out))
        return out

    monkeypatch.setattr(weights.InitialWeights, "read", read)
    model = _fresh_model()
    with zt.initialize(model, base_config(serving_dtype="fp32"), init_from=exports["file"]):
        pass
    assert [name for name, _ in reads] == list(read_safetensors(exports["file"]))
    # The upload loop keeps the previous parameter's values until the next is read.
    assert max(held for _, held in reads) <= 1, reads


def test_a_plain_model_file_with_a_buffer_and_fp16_values(tmp_path):
    """A file written from a plain model (not by zps): F16 values, and a buffer, which every
    rank copies into the module."""
    torch.manual_seed(7)
    source = Net()
    tensors = {k: v.half() for k, v in source.state_dict().items() if k != "head.weight"}
    tensors["scale"] = torch.full((16,), 0.5)
    write_safetensors(tmp_path / "plain.safetensors", tensors)
    model = Net()
    with zt.initialize(model, base_config(serving_dtype="fp32"),
                       init_from=tmp_path / "plain.safetensors") as engine:
        _check_weights(engine, model, tensors)
        assert torch.equal(model.scale, torch.full((16,), 0.5))


class MetaReady(nn.Module):
    """Modules built with a device argument: on the meta device, with no value anywhere (torch
    1.13 has no `with torch.device("meta")`)."""

    def __init__(self, device=None):
        super().__init__()
        self.embed = nn.Embedding(50, 16, device=device)
        self.body = nn.Linear(16, 16, device=device)
        self.head = nn.Linear(16, 50, bias=False, device=device)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(16, device=device))

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)) * self.scale)


def test_a_model_on_the_meta_device(tmp_path):
    torch.manual_seed(5)
    source = MetaReady()
    tensors = {k: v for k, v in source.state_dict().items() if k != "head.weight"}
    tensors["scale"] = torch.full((16,), 2.0)
    write_safetensors(tmp_path / "m.safetensors", tensors)
    model = MetaReady(device="meta")
    with zt.initialize(model, base_config(serving_dtype="fp32"),
                       init_from=tmp_path / "m.safetensors") as engine:
        # New CPU Parameters, the tie kept; the meta buffer took the file's value.
        assert model.head.weight is model.embed.weight
        assert all(p.device.type == "cpu" for p in model.parameters())
        assert model.scale.device.type == "cpu" and torch.equal(model.scale, tensors["scale"])
        got = engine.state_dict()
        for k in ("embed.weight", "body.weight", "body.bias"):
            assert torch.equal(got[k], tensors[k]), k
        plain = MetaReady()
        plain.load_state_dict(got)
        x, y = _batches(1)[0]
        with torch.no_grad():
            assert torch.equal(engine(x), plain(x))
        engine.backward(_loss(engine(x), y))
        assert engine.step()["step"] == 0
        assert not torch.equal(engine.state_dict()["body.weight"], tensors["body.weight"])


def test_a_meta_model_needs_every_value(tmp_path, nothing_starts):
    # Without init_from there is nothing to upload.
    with pytest.raises(zt.ZpsError, match="INVALID_ARGUMENT.*meta.*needs init_from"):
        zt.initialize(MetaReady(device="meta"), base_config())
    # A meta buffer the file does not hold has no value at all.
    tensors = {k: v for k, v in MetaReady().state_dict().items()
               if k not in ("head.weight", "scale")}
    write_safetensors(tmp_path / "no-buffer.safetensors", tensors)
    model = MetaReady(device="meta")
    with pytest.raises(zt.WeightsMismatch) as e:
        zt.initialize(model, base_config(), init_from=tmp_path / "no-buffer.safetensors")
    assert e.value.missing == ["scale (a buffer on the meta device)"]
    assert model.embed.weight.is_meta  # untouched


def _valid_tensors():
    torch.manual_seed(3)
    return {k: v for k, v in Net().state_dict().items() if k not in ("head.weight", "scale")}


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fails the test if initialize starts a cluster or connects to one."""
    def refuse(*args, **kwargs):
        raise AssertionError("initialize went on to start or contact the servers")
    monkeypatch.setattr(engine_mod, "LocalCluster", refuse)
    monkeypatch.setattr(zps._native, "Client", refuse)
    monkeypatch.setattr(zps._native, "check_memory_budget", refuse)


@pytest.mark.parametrize("case", ["missing", "extra", "shape", "dtype", "all"])
def test_a_file_that_does_not_fit_is_refused_before_anything_starts(tmp_path, case,
                                                                      nothing_starts):
    t = _valid_tensors()
    offending = []
    if case in ("missing", "all"):
        del t["body.0.bias"], t["norm.weight"]
        offending += ["body.0.bias", "norm.weight"]
    if case in ("extra", "all"):
        t["lm_head.weight"] = torch.zeros(2)
        t["rotary.inv_freq"] = torch.zeros(2)
        offending += ["lm_head.weight", "rotary.inv_freq"]
    if case in ("shape", "all"):
        t["body.0.weight"] = t["body.0.weight"].t().contiguous()
        t["scale"] = torch.ones(15)   # a buffer's shape too
        offending += ["body.0.weight", "scale"]
    if case in ("dtype", "all"):
        t["body.2.bias"] = t["body.2.bias"].double()          # would round into fp32
        t["norm.bias"] = torch.zeros(16, dtype=torch.int64)
        offending += ["body.2.bias", "norm.bias"]
    write_safetensors(tmp_path / "bad.safetensors", t)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(zt.WeightsMismatch) as e:
        zt.initialize(model, base_config(), init_from=tmp_path / "bad.safetensors")
    err = e.value
    assert isinstance(err, ValueError) and isinstance(err, zt.ZpsError)
    assert err.code == "INVALID_ARGUMENT"
    for name in offending:
        assert name in str(err), (name, str(err))
    # Names that fit are not listed.
    assert "embed.weight" not in str(err) and "body.2.weight" not in str(err)
    if case in ("missing", "all"):
        assert err.missing == ["body.0.bias", "norm.weight"]
    if case in ("extra", "all"):
        assert err.extra == ["lm_head.weight", "rotary.inv_freq"]
    if case in ("shape", "all"):
        assert [s[0] for s in err.shape] == ["body.0.weight", "scale"]
        assert err.shape[0][1:] == ((16, 32), (32, 16))
    if case in ("dtype", "all"):
        assert [(d[0], d[1]) for d in err.dtype] == [("body.2.bias", "F64"), ("norm.bias", "I64")]
    # The module is as it was: not initialized, values and buffers untouched.
    assert getattr(model, "_zps_engine", None) is None
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_tied_parameter_under_any_one_of_its_names(tmp_path):
    """Hugging Face's files keep a tied weight under one name, not always the module's first;
    under two names it is refused (the values could differ)."""
    from zps.torch import weights
    model = Net()
    named = engine_mod._unique_params(model)
    t = _valid_tensors()
    t["head.weight"] = t.pop("embed.weight")
    t["scale"] = torch.ones(16)
    write_safetensors(tmp_path / "second.safetensors", t)
    plan = weights.InitialWeights(tmp_path / "second.safetensors", named, model)
    tied = next(i for i, (names, _) in enumerate(named) if "embed.weight" in names)
    assert plan.param_tensor[tied].name == "head.weight"
    assert torch.equal(plan.param_f32(tied), t["head.weight"])
    t["embed.weight"] = t["head.weight"]
    write_safetensors(tmp_path / "both.safetensors", t)
    with pytest.raises(zt.WeightsMismatch, match="named twice 1: embed.weight and head.weight"):
        weights.InitialWeights(tmp_path / "both.safetensors", named, model)


def test_bad_files_are_refused_before_anything_starts(tmp_path, nothing_starts):
    write_safetensors(tmp_path / "good.safetensors", _valid_tensors())
    raw = (tmp_path / "good.safetensors").read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(raw[:-4])
    with pytest.raises(zt.ZpsError, match="DATA_LOSS.*bad header entry 'norm.bias'"):
        zt.initialize(Net(), base_config(), init_from=tmp_path / "truncated.safetensors")
    with pytest.raises(zt.ZpsError, match="NOT_FOUND"):
        zt.initialize(Net(), base_config(), init_from=tmp_path / "absent.safetensors")
    # An index that names a tensor its file does not hold, and one it does not name.
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    t = _valid_tensors()
    write_safetensors(sharded / "a.safetensors", {"embed.weight": t.pop("embed.weight")})
    write_safetensors(sharded / "b.safetensors", t)
    weight_map = {name: "b.safetensors" for name in t}
    weight_map["embed.weight"] = "a.safetensors"
    weight_map["body.0.bias"] = "a.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(zt.ZpsError, match=r"DATA_LOSS.*disagree on body\.0\.bias \(in "
                       r"b\.safetensors\), body\.0\.bias \(indexed in a\.safetensors\)"):
        zt.initialize(Net(), base_config(), init_from=sharded)
    # A directory with neither an index nor exactly one file.
    (sharded / "model.safetensors.index.json").unlink()
    with pytest.raises(zt.ZpsError, match="INVALID_ARGUMENT.*a.safetensors"):
        zt.initialize(Net(), base_config(), init_from=sharded)


def test_every_rank_checks_and_takes_the_buffers_under_torchrun(tmp_path):
    """Two ranks: a file that does not fit fails on each rank by itself (neither waits for the
    other); then the servers take the good file's values (rank 0 uploads) and every rank's
    buffer takes the file's."""
    values = {"lin.weight": torch.arange(32, dtype=torch.float32).reshape(4, 8) / 7,
              "lin.bias": torch.tensor([0.5, -1.0, 2.0, 0.25]),
              "scale": torch.tensor([2.0, 3.0, 4.0, 5.0])}
    write_safetensors(tmp_path / "good.safetensors", values)
    write_safetensors(tmp_path / "bad.safetensors",
                      {k: v for k, v in values.items() if k != "lin.bias"})
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1] / "python"))
    for k in ("ZPS_ENDPOINT", "ZPS_TOKEN", "ZPS_TOKEN_FILE"):
        env.pop(k, None)
    cmd = [*torchrun_command(2, "--max_restarts=0"), str(HERE / "init_from_script.py"),
           "--bad", str(tmp_path / "bad.safetensors"), "--good", str(tmp_path / "good.safetensors")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    results = sorted((json.loads(l[l.index("{"):])["result"] for l in p.stdout.splitlines()
                      if '{"result"' in l), key=lambda r: r["rank"])
    assert p.returncode == 0 and [r["rank"] for r in results] == [0, 1], out[-4000:]
    for r in results:
        assert r["error"] and "missing 1: lin.bias" in r["error"], r
        assert r["scale"] == values["scale"].tolist(), r
        assert r["start"]["lin.weight"] == values["lin.weight"].flatten().tolist(), r
        assert r["start"]["lin.bias"] == values["lin.bias"].tolist(), r
        assert r["step"] == 0
