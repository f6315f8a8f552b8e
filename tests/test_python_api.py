"""The public Python API (`import meshminer`): the spec it builds, the form it sends,
the token it finds, the programs it exports, and a job trained by a real node."""

from __future__ import annotations

import email.parser
import hashlib
import json
import sys
import threading
import tomllib
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import meshminer
from meshminer.connection import token_for
from meshminer.spec import from_keywords, merged
from meshminer.toml import dumps
from node.client import request_json
from node.demo.localnet import LocalNetwork, LocalNode, free_port, wait_for

# --- the TOML writer -------------------------------------------------------------

scalars = st.one_of(
    st.text(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
)
values = st.one_of(
    scalars, st.lists(scalars, max_size=4), st.lists(st.lists(scalars, max_size=3), max_size=3)
)
tables = st.recursive(
    st.dictionaries(st.text(), values, max_size=5),
    lambda inner: st.dictionaries(
        st.text(), st.one_of(values, inner, st.lists(inner, min_size=1, max_size=3)), max_size=5
    ),
    max_leaves=20,
)


@given(tables)
def test_toml_round_trips_through_tomllib(table: dict[str, Any]) -> None:
    assert tomllib.loads(dumps(table)) == table


def test_toml_writes_a_layer_stack_as_an_array_of_tables() -> None:
    spec = {
        "name": 'digits "layers"',
        "model": {
            "arch": "layers",
            "layers": [{"type": "Linear", "out_features": 32}, {"type": "ReLU"}],
        },
        "optim": {"lr": 3e-4, "steps": 10},
    }
    text = dumps(spec)
    assert text.count("[[model.layers]]") == 2
    assert tomllib.loads(text) == spec


def test_toml_refuses_what_it_cannot_hold_naming_the_key() -> None:
    with pytest.raises(TypeError, match=r"optim\.lr: TOML cannot hold NoneType"):
        dumps({"optim": {"lr": None}})
    with pytest.raises(TypeError, match=r"model\.hidden\[1\]"):
        dumps({"model": {"hidden": [1, object()]}})


# --- spec keys from keywords ------------------------------------------------------


def test_keyword_paths_nest_and_merge_over_the_spec() -> None:
    keys = from_keywords(
        {"optim__lr": 3e-4, "elastic__workers": 3, "data__batch_size": 16, "placement": "local"}
    )
    assert keys == {
        "optim": {"lr": 3e-4},
        "elastic": {"workers": 3},
        "data": {"batch_size": 16},
        "placement": "local",
    }
    base = {"name": "x", "data": {"source": "builtin:digits"}, "optim": {"steps": 5, "lr": 1.0}}
    spec = merged(merged(base, {"optim": {"lr": 0.5, "name": "sgd"}}), keys)
    assert spec == {
        "name": "x",
        "placement": "local",
        "data": {"source": "builtin:digits", "batch_size": 16},
        "optim": {"steps": 5, "lr": 3e-4, "name": "sgd"},  # the keyword wins over spec=
        "elastic": {"workers": 3},
    }


@pytest.mark.parametrize("keyword", ["optim____lr", "__lr", "optim__", "optim__lr__"])
def test_a_keyword_path_with_an_empty_part_is_refused(keyword: str) -> None:
    with pytest.raises(ValueError, match=rf"'{keyword}' is not a spec key path.*optim__lr"):
        from_keywords({keyword: 1})


def test_a_key_given_as_table_and_as_value_is_refused() -> None:
    with pytest.raises(ValueError, match="optim is given both as a table and as a single value"):
        from_keywords({"optim": 1, "optim__lr": 2})
    with pytest.raises(ValueError, match=r"name is given both"):
        merged({"name": "x"}, from_keywords({"name__first": "y"}))


# --- the token ----------------------------------------------------------------------


@pytest.fixture
def data_dir_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A node data dir (in $MESHMINER_DATA_DIR) holding an `api.token`; no token in the env."""
    (tmp_path / "api.token").write_text("local-secret\n")
    monkeypatch.setenv("MESHMINER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("MESHMINER_TOKEN", raising=False)
    return "local-secret"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8470", "http://localhost:9000", "http://[::1]:8470"]
)
def test_the_data_dirs_token_goes_to_a_node_on_this_machine(data_dir_token: str, url: str) -> None:
    assert token_for(url) == data_dir_token


@pytest.mark.parametrize("url", ["http://192.0.2.10:8470", "https://node.example.org"])
def test_the_data_dirs_token_never_goes_to_another_host(data_dir_token: str, url: str) -> None:
    assert token_for(url) is None


def test_a_given_token_wins_then_the_environment(
    data_dir_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESHMINER_TOKEN", "from-env")
    assert token_for("http://192.0.2.10:8470") == "from-env"
    assert token_for("http://127.0.0.1:8470", "given") == "given"


# --- what submit sends ----------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """A stand-in node that keeps each POST and answers as a node does (201, the job)."""

    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((dict(self.headers), body))
        answer = json.dumps({"id": "0123456789abcdef", "state": "queued"}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """The stand-in node's URL and what it received."""
    _Recorder.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", _Recorder.received
    finally:
        server.shutdown()
        server.server_close()


def _form(headers: dict[str, str], body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The multipart form as {field: (file name, content)}."""
    message = email.parser.BytesParser().parsebytes(
        f"Content-Type: {headers['Content-Type']}\r\n\r\n".encode() + body
    )
    return {
        part.get_param("name", header="content-disposition"): (
            part.get_filename(),
            part.get_payload(decode=True),
        )
        for part in message.get_payload()
    }


def test_submit_sends_the_spec_the_programs_the_data_and_the_init_weights(
    recorder: tuple[str, list], tmp_path: Path
) -> None:
    url, received = recorder
    program, eval_program = tmp_path / "a.pt2", tmp_path / "b.pt2"
    program.write_bytes(b"train graph")
    eval_program.write_bytes(b"eval graph")
    data = tmp_path / "train.npz"
    data.write_bytes(b"npz bytes")
    init = tmp_path / "start.safetensors"
    init.write_bytes(b"weights")

    job = meshminer.submit(
        meshminer.Exported(program, eval_program),
        data=data,
        mode="elastic",
        init=init,
        api=url,
        token="t0ken",
        spec={"elastic": {"rounds": 4, "inner_steps": 10}},
        elastic__workers=3,
        optim__lr=3e-4,
    )

    assert job.id == "0123456789abcdef" and job.state == "queued"
    ((headers, body),) = received
    assert headers["Authorization"] == "Bearer t0ken"
    form = _form(headers, body)
    assert {k: v[0] for k, v in form.items()} == {
        "spec": None,
        "data": "train.npz",
        "program": "model.pt2",
        "eval_program": "model.eval.pt2",
        "init": "start.safetensors",
    }
    assert form["program"][1] == b"train graph" and form["eval_program"][1] == b"eval graph"
    assert form["data"][1] == b"npz bytes" and form["init"][1] == b"weights"
    assert tomllib.loads(form["spec"][1].decode()) == {
        "name": "program",
        "mode": "elastic",
        "model": {
            "arch": "program",
            "program": "model.pt2",
            "eval_program": "model.eval.pt2",
            "output": "logits",
            "init": "start.safetensors",
        },
        "data": {"source": "train.npz"},
        "optim": {"lr": 3e-4},
        "elastic": {"rounds": 4, "inner_steps": 10, "workers": 3},
    }


def test_submit_of_a_dict_model_and_a_builtin_source_uploads_nothing(
    recorder: tuple[str, list],
) -> None:
    url, received = recorder
    meshminer.submit({"arch": "mlp", "hidden": [8]}, data="builtin:digits", steps=5, api=url)
    ((headers, body),) = received
    form = _form(headers, body)
    assert list(form) == ["spec"]
    assert tomllib.loads(form["spec"][1].decode()) == {
        "name": "mlp",
        "mode": "single",
        "model": {"arch": "mlp", "hidden": [8]},
        "data": {"source": "builtin:digits"},
        "optim": {"steps": 5},
    }


def test_submit_of_shards_sends_each_as_its_own_field_in_order(
    recorder: tuple[str, list], tmp_path: Path
) -> None:
    url, received = recorder
    shards = [tmp_path / f"part-{k}.bin" for k in range(3)]
    for k, shard in enumerate(shards):
        shard.write_bytes(bytes([k, 0]) * 8)
    meshminer.submit(
        {"arch": "char_transformer", "context": 4},
        data=shards,
        mode="elastic",
        api=url,
        data__format="tokens16",
        data__vocab_size=8,
    )
    ((headers, body),) = received
    form = _form(headers, body)
    assert {k: v[0] for k, v in form.items()} == {
        "spec": None,
        "shard0": "part-0.bin",
        "shard1": "part-1.bin",
        "shard2": "part-2.bin",
    }
    assert [form[f"shard{k}"][1] for k in range(3)] == [s.read_bytes() for s in shards]
    assert tomllib.loads(form["spec"][1].decode())["data"] == {
        "shards": ["part-0.bin", "part-1.bin", "part-2.bin"],
        "format": "tokens16",
        "vocab_size": 8,
    }


def test_submit_refuses_two_shards_of_one_name_before_sending(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "part.bin").write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match=r"data\[1\]: a second file named 'part.bin'"):
        meshminer.submit(
            {"arch": "char_transformer"},
            data=[tmp_path / "a" / "part.bin", tmp_path / "b" / "part.bin"],
            api="http://x:1",
        )


def test_submit_refuses_a_missing_data_file_before_sending(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data: no such file"):
        meshminer.submit({"arch": "mlp"}, data=tmp_path / "nope.csv", steps=1, api="http://x:1")


def test_no_node_answering_says_how_to_start_one() -> None:
    with pytest.raises(meshminer.NodeUnreachable, match="meshminer node run"):
        meshminer.jobs(api=f"http://127.0.0.1:{free_port()}")


# --- export -------------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class _NetWithLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _Net()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(x), y)


@pytest.fixture
def check_pt2(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """A stand-in for the node's program check: the problems it reports, by file name."""
    problems: dict[str, list[str]] = {}
    stand_in = types.ModuleType("training.program")
    stand_in.check_pt2 = lambda path: problems.get(Path(path).name, [])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "training.program", stand_in)
    return problems


def test_export_saves_both_modes_with_a_dynamic_batch_and_restores_the_modes(
    check_pt2: dict[str, list[str]], tmp_path: Path
) -> None:
    model = _Net()
    model.body[1].eval()  # a mixed-mode model comes back as it was, module by module
    exported = meshminer.export(model, torch.randn(4, 4), path=tmp_path)
    assert exported == meshminer.Exported(tmp_path / "model.pt2", tmp_path / "model.eval.pt2")
    assert model.training and not model.body[1].training and model.body[2].training

    x = torch.randn(7, 4)  # another batch size than the example's
    model.eval()
    with torch.no_grad():
        expected = model(x)
    evaluated = torch.export.load(exported.eval_program).module()(x)
    assert torch.equal(evaluated, expected)
    trained = torch.export.load(exported.program).module()(x)
    assert trained.shape == (7, 3) and not torch.equal(trained, expected)  # dropout is on


def test_export_of_a_model_with_its_loss_takes_a_tuple_batch(
    check_pt2: dict[str, list[str]], tmp_path: Path
) -> None:
    batch = (torch.randn(4, 4), torch.tensor([0, 1, 2, 0]))
    exported = meshminer.export(_NetWithLoss(), batch, eval=False, path=tmp_path)
    assert exported.eval_program is None
    loss = torch.export.load(exported.program).module()(torch.randn(6, 4), torch.zeros(6).long())
    assert loss.shape == ()


def test_a_refused_program_lists_every_problem(
    check_pt2: dict[str, list[str]], tmp_path: Path
) -> None:
    check_pt2["model.pt2"] = ["model.pt2: node 3 (aten.foo.default): not on the allow-list"]
    check_pt2["model.eval.pt2"] = ["model.eval.pt2: node 5 (aten.bar.default): not allowed"]
    with pytest.raises(meshminer.ProgramRefused) as refused:
        meshminer.export(_Net(), torch.randn(4, 4), path=tmp_path)
    assert "model.pt2: node 3 (aten.foo.default)" in str(refused.value)
    assert "model.eval.pt2: node 5 (aten.bar.default)" in str(refused.value)
    assert isinstance(refused.value, meshminer.MeshminerError)


def test_the_nodes_own_check_accepts_an_exported_model(tmp_path: Path) -> None:
    program = pytest.importorskip("training.program")
    if not hasattr(program, "check_pt2"):
        pytest.skip("training.program.check_pt2 is not written yet")
    exported = meshminer.export(_Net(), torch.randn(4, 4), path=tmp_path)
    assert exported.program.is_file() and exported.eval_program is not None


# --- end to end, on a real node -------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    """One node for the module's jobs; `placement = "local"` makes it train them itself."""
    net = LocalNetwork(tmp_path_factory.mktemp("python-api"))
    try:
        yield net.add()
    finally:
        net.stop()


def _model_of(job: meshminer.Job, data_file: Path | None = None) -> nn.Module:
    """A fresh module built from the job's spec (and its uploaded data), as the node does."""
    from training.data.info import probe
    from training.model.modules import build_model
    from training.model.plan import plan_model
    from training.spec.job import parse_spec

    spec = parse_spec(job.info["spec"])
    return build_model(plan_model(spec.model, probe(spec, data_file)))


@pytest.mark.slow
def test_a_dict_model_trains_on_the_node_and_its_weights_load(
    node: LocalNode, tmp_path: Path
) -> None:
    job = meshminer.submit(
        {"arch": "mlp", "hidden": [16]},
        data="builtin:digits",
        steps=30,
        placement="local",
        api=node.api,
    )
    assert job.wait(timeout=120) is job and job.state == "completed"
    assert job.metrics["steps"] == 30 and "val_accuracy" in job.metrics

    saved = tmp_path / "w.safetensors"
    weights = job.weights(saved)
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == job.info["weights_sha256"]
    module = job.load_into(_model_of(job))  # strict: every name and shape as built
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, weights[name])
    assert sum(t.numel() for t in weights.values()) == job.info["summary"]["parameters"]

    assert meshminer.job(job.id, api=node.api).state == "completed"
    assert job.id in {j.id for j in meshminer.jobs(api=node.api)}


@pytest.mark.slow
def test_an_uploaded_csv_trains(node: LocalNode, tmp_path: Path) -> None:
    data = tmp_path / "train.csv"
    data.write_text("a,b,target\n" + "".join(f"{i},{i % 5},{i % 2}\n" for i in range(60)))
    job = meshminer.submit(
        {"arch": "mlp", "hidden": [4]},
        data=data,
        steps=5,
        name="csv",
        api=node.api,
        spec={"placement": "local", "data": {"label": "target"}},
        data__batch_size=8,
    )
    assert job.info["spec"]["data"]["source"].startswith("blob:")
    job.wait(timeout=120, progress=False)
    assert job.info["spec"]["data"]["batch_size"] == 8
    job.load_into(_model_of(job, data))


@pytest.mark.slow
def test_the_nodes_refusal_names_the_key(node: LocalNode) -> None:
    with pytest.raises(meshminer.NodeError, match=r"model\.arch must be one of") as refused:
        meshminer.submit({"arch": "nope"}, data="builtin:digits", steps=5, api=node.api)
    assert refused.value.status == 400
    with pytest.raises(meshminer.NodeError, match=r"optim\.lerning_rate"):
        meshminer.submit(
            {"arch": "mlp"}, data="builtin:digits", steps=5, optim__lerning_rate=1, api=node.api
        )


@pytest.mark.slow
def test_wait_times_out_and_a_cancelled_job_raises_job_failed(node: LocalNode) -> None:
    job = meshminer.submit(
        {"arch": "mlp", "hidden": [16]},
        data="builtin:digits",
        steps=10**6,
        name="long",
        placement="local",
        api=node.api,
    )
    with pytest.raises(TimeoutError, match=f"job {job.id} is still"):
        job.wait(timeout=0.5, progress=False)
    wait_for(lambda: job.refresh().state == "running", 60, "the job to start")
    request_json(node.api, "POST", f"/api/v1/jobs/{job.id}/cancel")
    with pytest.raises(meshminer.JobFailed, match=f"job {job.id} cancelled") as failed:
        job.wait(timeout=60, progress=False)
    assert failed.value.state == "cancelled"


@pytest.mark.slow
def test_a_users_own_module_trains_through_the_python_api(node: LocalNode) -> None:
    from tests.programs.models import ResNet

    torch.manual_seed(0)
    model = ResNet(width=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    job = meshminer.submit(
        model,
        torch.randn(4, 1, 8, 8),
        data="builtin:digits",
        steps=20,
        placement="local",
        api=node.api,
        data__batch_size=16,
    )
    assert job.info["spec"]["model"]["program"].startswith("blob:")
    assert job.wait(timeout=120).state == "completed"
    job.load_into(model)  # strict: the user's own names and shapes
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
