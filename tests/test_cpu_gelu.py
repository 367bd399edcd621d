"""The fused CPU tanh-GELU (ablate/kernels/cpu_gelu.py): parity with the float64 reference,
bits that do not depend on the thread count, the fallback where it cannot be built, and runs
that keep the form they started with."""
import json

import pytest
import torch
import torch.nn.functional as F

from ablate.cli import main
from ablate.kernels import cpu_gelu
from ablate.kernels.reference import ReferenceBackend

FUSED = [f for f in cpu_gelu.available() if f != cpu_gelu.PASSES]
ARGS = ["train", "--quiet", "--steps", "6", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
        "--final-eval-batches", "1", "--threads", "1", "--device", "cpu"]


@pytest.fixture
def threads():
    outer = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(outer)


@pytest.mark.skipif(not FUSED, reason=f"no fused form here: {cpu_gelu.library()[1]}")
@pytest.mark.parametrize("form", FUSED)
@pytest.mark.parametrize("shape", [(7,), (3, 4099), (16, 64, 256)])  # a partial block, several, tiny's MLP
def test_the_fused_gelu_matches_the_float64_reference(form, shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 4
    dy = torch.randn(shape)
    x64 = x.double().requires_grad_()
    ref = F.gelu(x64, approximate="tanh")
    (dref,) = torch.autograd.grad(ref, x64, dy.double())
    xf = x.clone().requires_grad_()
    with cpu_gelu.using(form):
        y = ReferenceBackend().activation("gelu", xf)  # through the kernel interface
    y.backward(dy)
    torch.testing.assert_close(y.double(), ref.detach(), atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(xf.grad.double(), dref, atol=2e-5, rtol=1e-5)


@pytest.mark.skipif(not FUSED, reason="no fused form here")
def test_special_values_and_strided_inputs_are_the_functions():
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 100.0, -100.0, -20.0, 20.0, 1e-30, 0.0])
    with cpu_gelu.using(FUSED[0]):
        y = cpu_gelu.gelu(x)
        torch.testing.assert_close(y, F.gelu(x, approximate="tanh"), equal_nan=True)
        wide = torch.randn(8, 10)
        torch.testing.assert_close(cpu_gelu.gelu(wide.t()), F.gelu(wide.t(), approximate="tanh"), atol=2e-6, rtol=2e-6)


@pytest.mark.skipif(not FUSED, reason="no fused form here")
def test_its_bits_do_not_depend_on_the_thread_count(threads):
    x = torch.randn(3 * 4096 + 17)
    dy = torch.randn_like(x)
    out = []
    for n in (1, 2):
        threads(n)
        xf = x.clone().requires_grad_()
        with cpu_gelu.using(FUSED[0]):
            y = cpu_gelu.gelu(xf)
        y.backward(dy)
        out.append((y.detach(), xf.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def rows(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in ("time_s", "tokens_per_s")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_a_compiler(monkeypatch):
    monkeypatch.setattr(cpu_gelu, "_lib", [(None, "no C compiler (a test)")])


def test_without_a_compiler_a_run_trains_with_the_passes_and_says_so(tmp_path, monkeypatch):
    without_a_compiler(monkeypatch)
    assert cpu_gelu.available() == [cpu_gelu.PASSES]
    assert main([*ARGS, "--out", str(tmp_path)]) == 0
    (config,) = tmp_path.glob("*/config.json")
    assert json.loads(config.read_text())["gelu_cpu"] == cpu_gelu.PASSES


def test_a_run_from_before_the_kernel_resumes_on_the_passes_bit_for_bit(tmp_path, monkeypatch, capsys):
    import ablate.train

    with monkeypatch.context() as m:  # the reference: a whole run on the passes, as before the kernel
        without_a_compiler(m)
        assert main([*ARGS, "--out", str(tmp_path / "ref")]) == 0
        m.setattr(ablate.train, "lr_at", _stop_after(2, ablate.train.lr_at, m))
        assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 130
    (config,) = (tmp_path / "cut").glob("*/config.json")
    old = json.loads(config.read_text())
    del old["gelu_cpu"]  # written before the option existed
    config.write_text(json.dumps(old))
    assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 0  # the kernel is available again: not used
    assert json.loads(config.read_text())["gelu_cpu"] == cpu_gelu.PASSES
    assert rows(config.parent) == rows(next((tmp_path / "ref").iterdir()))
    if FUSED:  # and a run started fused is refused, in one line, where no kernel builds
        old["gelu_cpu"] = FUSED[0]
        config.write_text(json.dumps(old))
        (config.parent / "summary.json").unlink()
        without_a_compiler(monkeypatch)
        capsys.readouterr()
        assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and FUSED[0] in err and "valid here: passes" in err


def _stop_after(step, real, m):
    """lr_at that asks the loop to stop (as Ctrl-C does) while training `step`."""
    import contextlib
    import signal

    import ablate.train

    received = []

    @contextlib.contextmanager
    def signals():
        yield received

    m.setattr(ablate.train, "_graceful_signals", signals)

    def lr_at(s, *args, **kwargs):
        if s == step:
            received.append(signal.SIGINT)
        return real(s, *args, **kwargs)

    return lr_at
