"""A pack (ablate/engine/pack_train.py) against its cells trained alone: the same rows, probes and
outcome within float32 reordering; a diverging member leaves the others' bits alone; a packed
cell resumes alone and lone cells join a pack; a plugin's variant packs (or is refused in one
line and trains alone); and the step reads nothing back to the host."""
import json
import math

import pytest
import torch

import ablate.engine.pack_train as PT
import ablate.engine.train as T
from ablate.engine.cell import Cell, run_cell
from ablate.engine.pack_run import run_pack
from ablate.engine.pack_optim import PackRefused
from ablate.engine.train import plan_run
from ablate.variants import ACTIVATIONS, INITS
from ablate.variants.inits import gpt2

# Tiny and fast: 2 blocks of width 32, every step logged, stability probes every 10th.
OPTIONS = {"model": "tiny", "layers": 2, "width": 32, "batch_size": 2, "seq_len": 16, "eval_every": 25,
           "eval_batches": 2, "final_eval_batches": 2, "threads": 1, "steps": 50, "kernels": "reference",
           "probe_every": 10}
SEEDS = (0, 1, 2)
# The stated float32 tolerance of a member against its lone run after 50 steps (relative): the
# packed step reorders float32 sums (batched matmuls, a norm per parameter over all members,
# the stacked AdamW's arithmetic). Measured: losses 2e-7, gradient norms 2e-6, the stability
# probes (an eager forward of the probed slice, as the compiled lone path does) 9e-5.
RTOL = {"loss": 1e-5, "val_loss": 1e-5, "lr": 0.0, "grad_norm": 1e-4, "act_norm": 1e-4, "update_ratio": 1e-4}
STABILITY_RTOL = 1e-3
TIMING = ("time_s", "tokens_per_s", "wall_time_s")

MISH = "mish_pack_test"
if MISH not in ACTIVATIONS:  # a plugin's activation, registered as a plugin file registers it
    ACTIVATIONS.register(MISH, lambda x: x * torch.tanh(torch.nn.functional.softplus(x)), origin="tests")


HALF_INIT = "gpt2_half_pack_test"
if HALF_INIT not in INITS:  # a plugin's init: each member is built by it, with its own seed
    def _gpt2_half(model):
        gpt2(model)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(0.5)
    INITS.register(HALF_INIT, _gpt2_half, origin="tests")


class _NoVmap(torch.autograd.Function):  # the old style: functorch cannot batch it
    @staticmethod
    def forward(ctx, x):
        return x.relu()

    @staticmethod
    def backward(ctx, g):
        return g


NOVMAP = "relu_novmap_pack_test"
if NOVMAP not in ACTIVATIONS:
    ACTIVATIONS.register(NOVMAP, _NoVmap.apply, origin="tests")


def cells(**options):
    return [Cell.from_options({**OPTIONS, **options, "seed": s}) for s in SEEDS]


def lone(out, cell_list):
    for c in cell_list:
        T.train(c, out / c.id)


def pack(out, cell_list):
    return PT.train_pack(cell_list, [plan_run(c, None, out / c.id) for c in cell_list])


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read(run_dir, name):
    return json.loads((run_dir / name).read_text())


def untimed(items):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in items]


def tolerance(name):
    base = name.split("/")[0]
    return RTOL.get(base, STABILITY_RTOL)


def assert_agree(a_dir, b_dir):
    """Every file the analysis reads, within the stated tolerance: metrics.jsonl row by row and
    key by key, summary.json, and config.json (equal)."""
    a, b = rows(a_dir), rows(b_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert list(ra) == list(rb)
        for key, va in ra.items():
            if key in TIMING or key in ("step", "tokens"):
                assert key in TIMING or va == rb[key]
                continue
            vb = rb[key]
            assert (va is None) == (vb is None), (ra["step"], key)
            if va is not None:
                assert math.isclose(va, vb, rel_tol=tolerance(key), abs_tol=1e-7), (ra["step"], key, va, vb)
    sa, sb = read(a_dir, "summary.json"), read(b_dir, "summary.json")
    assert sa["status"] == sb["status"] and sa["diverged_at_step"] == sb["diverged_at_step"]
    assert sa["steps"] == sb["steps"] and sa["error"] == sb["error"]
    for key in ("final_loss", "final_val_loss"):
        assert (sa[key] is None) == (sb[key] is None)
        if sa[key] is not None:
            assert math.isclose(sa[key], sb[key], rel_tol=1e-5)
    ca, cb = read(a_dir, "config.json"), read(b_dir, "config.json")
    assert {k: v for k, v in ca.items() if k != "machine"} == {k: v for k, v in cb.items() if k != "machine"}


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    out = tmp_path_factory.mktemp("alone")
    lone(out, cells())
    return out


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("packed")
    pack(out, cells())
    return out


def test_a_pack_of_three_seeds_agrees_with_them_trained_alone(alone, packed):
    for c in cells():
        assert_agree(alone / c.id, packed / c.id)
        assert not (packed / c.id / "checkpoint.pt").exists()  # finished: as a lone run, no checkpoint
    logged = rows(packed / cells()[0].id)
    assert len(logged) == 50 and "grad_norm/layer_1/mlp" in logged[0] and "cos_sim/layer_0" in logged[10]


def test_a_pack_is_bitwise_repeatable_and_a_members_bits_do_not_depend_on_its_packs_size(packed, tmp_path):
    pack(tmp_path / "again", cells())
    for c in cells():
        assert untimed(rows(tmp_path / "again" / c.id)) == untimed(rows(packed / c.id))
    alone_in_a_pack = cells()[1:2]
    pack(tmp_path / "one", alone_in_a_pack)
    assert untimed(rows(tmp_path / "one" / alone_in_a_pack[0].id)) == untimed(rows(packed / alone_in_a_pack[0].id))


def test_a_member_that_diverges_is_frozen_there_and_leaves_the_others_unchanged(packed, tmp_path):
    wild = [*cells()[:2], Cell.from_options({**OPTIONS, "seed": 2, "lr": 1.0, "warmup": 30})]
    pack(tmp_path / "pack", wild)
    for c in wild[:2]:  # the same bits as in the pack whose third member trained calmly
        assert untimed(rows(tmp_path / "pack" / c.id)) == untimed(rows(packed / c.id))
        assert read(tmp_path / "pack" / c.id, "summary.json")["status"] == "completed"
    summary = read(tmp_path / "pack" / wild[2].id, "summary.json")
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 28  # mid-run, past a probe step
    lone(tmp_path / "lone", wild[2:])  # and the diverged member diverges where it does alone, with the same rows
    alone_rows, packed_rows = rows(tmp_path / "lone" / wild[2].id), rows(tmp_path / "pack" / wild[2].id)
    assert [list(r) for r in alone_rows] == [list(r) for r in packed_rows]
    assert read(tmp_path / "lone" / wild[2].id, "summary.json")["diverged_at_step"] == 28
    # (At lr 1.0 float32 reordering grows fast as it diverges; the first step agrees.)
    assert math.isclose(alone_rows[0]["loss"], packed_rows[0]["loss"], rel_tol=1e-6)


def interrupt_pack_at(monkeypatch, step):
    """The pack behaves as if SIGINT arrived during `step` (as tests/helpers/interrupting.py
    does for a lone run)."""
    import contextlib

    received = []

    @contextlib.contextmanager
    def fake_signals():
        yield received

    real = PT.PackRun.batches

    def batches(self, s):
        if s == step:
            received.append(2)
        return real(self, s)
    monkeypatch.setattr(PT, "graceful_signals", fake_signals)
    monkeypatch.setattr(PT.PackRun, "batches", batches)


@pytest.mark.slow
def test_a_packed_cell_resumes_alone_and_lone_cells_join_a_pack(alone, packed, tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        interrupt_pack_at(m, 19)
        with pytest.raises(T.Interrupted):
            pack(tmp_path / "p", cells())
    first = cells()[0]
    ckpt = torch.load(tmp_path / "p" / first.id / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 20 and set(ckpt) == {"model", "optimizer", "step", "torch_rng", "first_loss", "elapsed"}
    run_cell(first, tmp_path / "p")  # the packed cell, resumed alone
    assert_agree(alone / first.id, tmp_path / "p" / first.id)
    # Lone runs stopped at one step join one pack and finish there.
    from tests.helpers.interrupting import interrupted_at

    for c in cells():
        with interrupted_at(monkeypatch, 19), pytest.raises(T.Interrupted):
            T.train(c, tmp_path / "l" / c.id)
    pack(tmp_path / "l", cells())
    for c in cells():
        assert_agree(alone / c.id, tmp_path / "l" / c.id)


def test_a_plugin_variant_and_init_pack(tmp_path):
    plugin = cells(act=MISH, init=HALF_INIT)
    lone(tmp_path / "lone", plugin[:2])
    pack(tmp_path / "pack", plugin[:2])
    for c in plugin[:2]:
        assert_agree(tmp_path / "lone" / c.id, tmp_path / "pack" / c.id)


def test_a_variant_vmap_cannot_batch_is_refused_in_one_line_and_trains_alone(tmp_path, capsys):
    plugin = [Cell.from_options({**OPTIONS, "act": NOVMAP, "steps": 3, "seed": s}) for s in (0, 1)]
    with pytest.raises(PackRefused, match="under torch.func.vmap"):
        pack(tmp_path / "refused", plugin)
    run_pack([(c, None) for c in plugin], tmp_path / "pack", 0, True, run_cell)
    err = capsys.readouterr().err
    assert err.count("not stacked") == 1 and "train alone" in err
    lone(tmp_path / "lone", plugin)
    for c in plugin:
        assert untimed(rows(tmp_path / "pack" / c.id)) == untimed(rows(tmp_path / "lone" / c.id))


def test_a_pack_refuses_what_it_cannot_stack_in_one_line(tmp_path):
    mixed = [cells(steps=2)[0], Cell.from_options({**OPTIONS, "steps": 2, "seed": 1, "width": 16})]
    for group, words in [(cells(optimizer="sgd", steps=2)[:2], "optimizer 'sgd'"),
                         (cells(kernels="cpu", steps=2)[:2], "kernels 'cpu'"),
                         (mixed, "members that differ in more than seed, lr, warmup")]:
        with pytest.raises(PackRefused, match=words) as e:
            pack(tmp_path, group)
        assert "\n" not in str(e.value)
        assert not any((tmp_path / c.id / "metrics.jsonl").exists() for c in group)  # nothing written


def test_the_step_reads_nothing_back_and_the_pack_reads_back_every_n_steps(tmp_path, monkeypatch):
    counted = []
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
        real = getattr(torch.Tensor, name)

        def counting(self, *a, _real=real, _name=name, **k):
            counted.append(_name)
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counting)
    steps = []
    real_step = PT.PackRun.step

    def step(self, s, x, y):
        before = len(counted)
        record = real_step(self, s, x, y)
        steps.append(len(counted) - before)
        return record
    monkeypatch.setattr(PT.PackRun, "step", step)
    reads = PT.READBACKS[0]
    pack(tmp_path, cells(steps=30, eval_every=15, grad_clip=1.0)[:2])
    assert len(steps) == 30 and set(steps) == {0}  # forward, backward, clipping, optimizer, probes
    # One read every READBACK_EVERY (10) steps; the evaluations at steps 14 and 29 add one.
    assert PT.READBACKS[0] - reads == 4
