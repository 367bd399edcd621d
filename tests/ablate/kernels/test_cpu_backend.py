"""One meaning per kernel backend name: `reference` is plain PyTorch, `cpu` is reference with the
CPU's C kernels (GELU, attention), and `auto` picks `cpu` on a CPU once it passes the parity
suite. Runs recorded before the `cpu` backend (as `reference`, with CPU forms) resume on their
own bits, and a run made with a retired GELU form is refused in one line."""
import contextlib
import json

import pytest
import torch
import torch.nn.functional as F

import ablate.engine.train
from ablate.core.errors import ConfigError
from ablate.engine.cell import Cell, run_cell
from ablate.engine.train import CPU_KERNELS, recorded_kernels
from ablate.kernels import cpu_attention, cpu_gelu, get_backend, kernel_choices, parity, select
from ablate.kernels.cpu_backend import CpuBackend
from ablate.kernels.reference import ReferenceBackend
from ablate.variants import ACTIVATIONS

FAST = {"model": "tiny", "layers": 2, "batch_size": 4, "seq_len": 16, "eval_every": 100, "eval_batches": 1,
        "final_eval_batches": 1, "threads": 1, "steps": 6, "checkpoint_every": 100}
KERNELS_HERE = cpu_gelu.current() != cpu_gelu.PASSES and cpu_attention.current() != cpu_attention.SDPA
needs_kernels = pytest.mark.skipif(not KERNELS_HERE, reason="the CPU kernels do not build here")


def test_cpu_is_a_kernel_choice_beside_reference_and_auto():
    assert {"reference", "cpu", "auto"} <= set(kernel_choices())
    assert isinstance(get_backend("cpu", "cpu"), CpuBackend)
    assert type(get_backend("reference", "cpu")) is ReferenceBackend


def test_cpu_on_another_device_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="kernels 'cpu' runs on the CPU only, not on cuda; valid there: ") as e:
        get_backend("cpu", "cuda")
    assert "\n" not in str(e.value)


def test_reference_is_plain_pytorch_and_never_calls_the_c_kernels(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("reference called a C kernel")

    for module, names in ((cpu_gelu, ("gelu", "linear_gelu", "linear_gelu_linear")), (cpu_attention, ("attention",))):
        for name in names:
            monkeypatch.setattr(module, name, refuse)
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 5, 8, generator=g), torch.randn(32, 8, generator=g), torch.randn(32, generator=g)
    w2 = torch.randn(8, 32, generator=g)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    ref = ReferenceBackend()
    assert torch.equal(ref.activation("gelu", x), ACTIVATIONS.get("gelu")(x))
    assert torch.equal(ref.dense_mlp("gelu", x, w, b, w2, None), F.linear(ACTIVATIONS.get("gelu")(F.linear(x, w, b)), w2))
    assert torch.equal(ref.attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))


@needs_kernels
def test_cpu_sends_float32_gelu_and_attention_to_the_kernels_and_the_rest_to_reference(monkeypatch):
    calls = []
    for module, name in ((cpu_gelu, "gelu"), (cpu_attention, "attention")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    cpu = CpuBackend()
    x = torch.randn(2, 3, 8)
    q = k = v = torch.randn(1, 2, 4, 8)
    cpu.activation("gelu", x), cpu.attention(q, k, v)
    assert calls == ["gelu", "attention"]
    cpu.activation("gelu", x.double()), cpu.activation("relu", x), cpu.attention(q.double(), k.double(), v.double())
    assert calls == ["gelu", "attention"]  # another dtype, another activation: reference's code


def test_auto_on_a_cpu_picks_cpu_when_it_passes_its_parity_cases(monkeypatch):
    monkeypatch.setattr(select, "_CHOICE", {})
    assert select.pick_auto("cpu") == "cpu"
    checked = {r.split("-")[0] for r in [c.id for c in parity.cases("cpu", quick=True, ops=parity.CPU_OPS)]}
    assert checked == set(parity.CPU_OPS) and select.AUTO_DETAILS["cpu"]["choice"] == "cpu"


@needs_kernels
def test_auto_on_a_cpu_falls_back_to_reference_when_the_kernels_fail_parity(monkeypatch, capsys):
    monkeypatch.setattr(select, "_CHOICE", {})
    real = cpu_gelu.gelu
    monkeypatch.setattr(cpu_gelu, "gelu", lambda x: real(x) * 1.001)  # a kernel off by 0.1%
    assert select.pick_auto("cpu") == "reference"
    assert "kernels 'cpu' failed its parity check on cpu; not used by auto" in capsys.readouterr().err
    assert "act:gelu" in select.AUTO_DETAILS["cpu"]["skipped"]["cpu"]


@needs_kernels
def test_kernels_cpu_is_refused_in_one_line_when_its_kernels_fail_parity(monkeypatch, capsys):
    """E9: the check `auto` makes, before anything is built or trained; `kernels check` still
    reports the failing cases in its table rather than refusing."""
    from ablate.cli import main

    monkeypatch.setattr(select, "_CHOICE", {})
    real = cpu_gelu.gelu
    monkeypatch.setattr(cpu_gelu, "gelu", lambda x: real(x) * 1.001)  # a kernel off by 0.1%
    with pytest.raises(ConfigError, match=r"kernels 'cpu' failed its parity check .*act:gelu.*valid: --kernels "
                                          "reference") as e:
        get_backend("cpu", "cpu")
    assert "\n" not in str(e.value) and capsys.readouterr().err == ""
    monkeypatch.setattr(parity, "QUICK_SHAPES", (((2, 3, 37), "strided"),))
    assert main(["kernels", "check", "--quick", "--backends", "cpu"]) == 1
    assert "act:gelu" in capsys.readouterr().out


def test_kernels_cpu_is_checked_once_a_process(monkeypatch):
    monkeypatch.setattr(select, "_CHOICE", {})
    runs = []
    real = parity.run_suite
    monkeypatch.setattr(parity, "run_suite", lambda *a, **k: runs.append(a) or real(*a, **k))
    assert isinstance(get_backend("cpu", "cpu"), CpuBackend) and get_backend("auto", "cpu").name == select.pick_auto("cpu")
    assert len(runs) == 1


@pytest.mark.parametrize("config, expected", [
    ({"kernels": "reference", "device": "cpu", "gelu_cpu": "poly-bias", "attention_cpu": "blocked"}, "cpu"),
    ({"kernels": "reference", "device": "cpu", "gelu_cpu": "passes", "attention_cpu": "sdpa"}, "cpu"),
    ({"kernels": "reference", "device": "cpu"}, "cpu"),  # made before the kernels: their torch fallbacks
    ({"kernels": "reference", "device": "cpu", "gelu_cpu": None, "attention_cpu": None}, "reference"),  # today's
    ({"kernels": "reference", "device": "cuda:0", "gelu_cpu": None, "attention_cpu": None}, "reference"),
    ({"kernels": "triton", "device": "cuda:0", "gelu_cpu": None, "attention_cpu": None}, "triton"),
    ({"kernels": "cpu", "device": "cpu", "gelu_cpu": "poly-bias", "attention_cpu": "blocked"}, "cpu"),
])
def test_a_recorded_backend_is_read_by_todays_names(config, expected):
    assert recorded_kernels(config) == expected


def run(out, **options):
    cell = Cell.from_options({**FAST, **options})
    run_cell(cell, out)
    with open(out / cell.id / "metrics.jsonl") as f:
        return cell, [{k: v for k, v in json.loads(line).items() if k not in ("time_s", "tokens_per_s")} for line in f]


def interrupt_after(monkeypatch, out, step, **options):
    """Train until `step`, then stop with a checkpoint, as Ctrl-C would."""
    real_lr_at, received = ablate.engine.train.lr_at, []

    def lr_at(at, *args, **kwargs):
        if at == step:
            received.append(2)  # SIGINT
        return real_lr_at(at, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(ablate.engine.train, "lr_at", lr_at)
        m.setattr(ablate.engine.train, "_graceful_signals", lambda: contextlib.nullcontext(received))
        with pytest.raises(ablate.engine.train.Interrupted):
            run(out, **options)


def as_written_before_the_cpu_backend(run_dir, **changes):
    path = run_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(kernels="reference", **changes)
    path.write_text(json.dumps(config))


@needs_kernels
@pytest.mark.parametrize("request_", ["auto", "reference"])
def test_a_run_recorded_as_reference_with_cpu_kernels_resumes_on_its_own_bits(tmp_path, monkeypatch, request_):
    cell, full = run(tmp_path / "full", kernels="auto")
    interrupt_after(monkeypatch, tmp_path / "cut", 3, kernels="auto")
    cut_dir = tmp_path / "cut" / cell.id
    as_written_before_the_cpu_backend(cut_dir)  # `--kernels reference` then meant these kernels on a CPU
    if request_ == "reference":
        config = json.loads((cut_dir / "config.json").read_text())
        config["train"]["kernels"] = "reference"
        (cut_dir / "config.json").write_text(json.dumps(config))
    _, cut = run(tmp_path / "cut", kernels=request_)
    assert cut == full
    assert json.loads((cut_dir / "config.json").read_text())["kernels"] == "cpu"


@pytest.mark.parametrize("form", cpu_gelu.RETIRED)
def test_a_run_made_with_a_retired_gelu_form_is_refused_in_one_line(tmp_path, monkeypatch, form):
    cell, _ = run(tmp_path / "first", kernels="auto", steps=2)
    interrupt_after(monkeypatch, tmp_path / "cut", 1, kernels="auto")
    cut_dir = tmp_path / "cut" / cell.id
    as_written_before_the_cpu_backend(cut_dir, gelu_cpu=form)
    before = {p.name: p.read_bytes() for p in cut_dir.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=f"computed as '{form}', a form this version of ablate no longer computes; "
                                          "valid: remove that folder") as e:
        run(tmp_path / "cut", kernels="auto")
    assert "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in cut_dir.iterdir() if p.is_file()} == before  # nothing written


def test_the_retired_forms_are_no_longer_forms():
    assert not set(cpu_gelu.RETIRED) & set(cpu_gelu.FORMS) and set(CPU_KERNELS) == {"gelu_cpu", "attention_cpu"}


@needs_kernels
def test_kernels_check_takes_the_cpu_backend_and_checks_its_own_ops(monkeypatch, capsys):
    from ablate.cli import main

    monkeypatch.setattr(parity, "QUICK_SHAPES", (((2, 3, 37), "strided"),))
    assert main(["kernels", "check", "--quick", "--backends", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "attention" in out and "dense_mlp:gelu" in out and "layer_norm" not in out
    assert f"{2 * len(parity.CPU_OPS)}/{2 * len(parity.CPU_OPS)} cases passed" in out
