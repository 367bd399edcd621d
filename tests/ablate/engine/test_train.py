"""`ablate train`: learning, determinism, metrics, divergence, resume, data, bad input; and a
resume trusts nothing on disk: a checkpoint cannot run code, a damaged one is refused in one line,
and a damaged metrics file loses no valid row."""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import ablate.engine.train as T
from ablate.cli import main
from ablate.core.errors import ConfigError
from ablate.engine.cell import Cell, run_cell
from ablate.engine.data import TokenData, load_data, read_shard, write_shard
from tests.helpers.interrupting import interrupted_at

FAST = {"model": "tiny", "batch_size": 4, "seq_len": 32, "eval_every": 5, "eval_batches": 2, "threads": 1}


def train_cell(out, **options):
    cell = Cell.from_options({**FAST, **options})
    result = run_cell(cell, out)
    return out / cell.id, result


def metrics(run_dir):
    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def without_timing(rows):
    return [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")} for r in rows]


@pytest.mark.slow
def test_loss_falls_on_the_default_corpus(tmp_path):
    run_dir, result = train_cell(tmp_path, steps=150, lr=3e-3, batch_size=8, seq_len=64, warmup=10)
    rows = metrics(run_dir)
    assert result.summary["status"] == "completed"
    assert np.mean([r["loss"] for r in rows[-10:]]) < rows[0]["loss"] - 1.5
    assert result.summary["final_val_loss"] < rows[0]["loss"] - 1.0


def test_cpu_runs_are_bitwise_repeatable(tmp_path):
    a, _ = train_cell(tmp_path / "a", steps=12, lr=1e-3)
    b, _ = train_cell(tmp_path / "b", steps=12, lr=1e-3)
    assert without_timing(metrics(a)) == without_timing(metrics(b))


def test_variants_with_one_seed_see_the_same_batches(tmp_path, monkeypatch):
    seen = {}
    original = TokenData.batch

    def recording(self, split, index, seed, *args, **kwargs):
        x, y = original(self, split, index, seed, *args, **kwargs)
        seen.setdefault(current, []).append((split, index, x.clone(), y.clone()))
        return x, y

    monkeypatch.setattr(TokenData, "batch", recording)
    for current in ("pre", "post"):
        train_cell(tmp_path / current, steps=3, norm=current)
    assert len(seen["pre"]) == len(seen["post"]) > 3
    for (s1, i1, x1, y1), (s2, i2, x2, y2) in zip(seen["pre"], seen["post"]):
        assert (s1, i1) == (s2, i2) and (x1 == x2).all() and (y1 == y2).all()
    # A different seed draws different batches.
    data = load_data(None, "bytes", 256)
    assert not (data.batch("train", 0, 0, 4, 32)[0] == data.batch("train", 0, 1, 4, 32)[0]).all()


def test_every_design_metric_is_logged_for_every_layer(tmp_path):
    run_dir, _ = train_cell(tmp_path, steps=5, layers=3)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(5))
    names = {"step", "tokens", "loss", "lr", "grad_norm", "grad_norm/embed", "time_s", "tokens_per_s"}
    for i in range(3):
        names |= {f"grad_norm/layer_{i}", f"grad_norm/layer_{i}/attn", f"grad_norm/layer_{i}/mlp",
                  f"grad_norm/layer_{i}/norm", f"act_norm/layer_{i}"}
    # Update ratios and the stability probes come on the probe steps (probe_every, default 10).
    probed = {f"{m}/layer_{i}" for i in range(3) for m in ("update_ratio", "attn_logit_max", "attn_entropy",
                                                          "cos_sim", "block_change")} | {"logit_lse", "logit_max"}
    for row in rows:
        assert names <= set(row), names - set(row)
        assert "grad_norm/layer_3" not in row
        assert (probed <= set(row)) if row["step"] % 10 == 0 else not (probed & set(row)), row["step"]
    assert "val_loss" in rows[-1] and "val_loss" in rows[4]
    # The total is the root-sum-square of the buckets plus the final norm (not bucketed).
    r = rows[0]
    parts = r["grad_norm/embed"] ** 2 + sum(r[f"grad_norm/layer_{i}"] ** 2 for i in range(3))
    assert parts <= r["grad_norm"] ** 2 * (1 + 1e-5)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["data"]["fingerprint"].startswith("sha256:")
    assert config["kernels"] == "cpu" and config["variant"]["id"] == "pre.layernorm.gelu.dense.res"


def test_huge_learning_rate_diverges_as_a_result(tmp_path):
    run_dir, result = train_cell(tmp_path, steps=60, lr=50.0)
    s = result.summary
    assert s["status"] == "diverged" and s["final_loss"] is None
    assert 0 <= s["diverged_at_step"] < 60 and s["steps"] == s["diverged_at_step"] + 1
    assert {p.name for p in run_dir.iterdir()} >= {"config.json", "metrics.jsonl", "summary.json"}
    assert not (run_dir / "checkpoint.pt").exists()
    text = (run_dir / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert metrics(run_dir)[-1]["step"] == s["diverged_at_step"]


def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ablate", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


CLI_ARGS = ["--steps", "40", "--batch-size", "4", "--seq-len", "32", "--checkpoint-every", "8",
            "--eval-every", "10", "--eval-batches", "2", "--threads", "1", "--quiet"]


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path):
    """SIGKILL (no chance to checkpoint: the last periodic checkpoint is resumed from) and
    SIGTERM (a checkpoint at the last finished step), each mid-run; both resumed runs log what
    the uninterrupted one logs. The three first runs train side by side, sharing one reference."""
    cell = "pre.layernorm.gelu.dense.res__batch_size=4__seq_len=32__steps=40__seed=0"
    ref = _cli(*CLI_ARGS, "--out", str(tmp_path / "ref"))
    cut = {how: _cli(*CLI_ARGS, "--out", str(tmp_path / how.name)) for how in (signal.SIGKILL, signal.SIGTERM)}
    waiting, deadline = dict(cut), time.time() + 120
    while waiting:  # each one signalled as soon as it has logged 21 steps
        for how, proc in list(waiting.items()):
            path = tmp_path / how.name / cell / "metrics.jsonl"
            if path.exists() and path.read_text().count("\n") >= 21:
                proc.send_signal(how)
                del waiting[how]
            else:
                assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{list(waiting)} did not reach step 21 in time"
        time.sleep(0.02)
    for how, proc in cut.items():
        proc.wait()
        assert not (tmp_path / how.name / cell / "summary.json").exists(), how.name
        assert (tmp_path / how.name / cell / "checkpoint.pt").exists(), how.name
    again = [_cli(*CLI_ARGS, "--out", str(tmp_path / how.name)) for how in cut]
    for proc in again + [ref]:
        assert proc.wait() == 0, proc.communicate()
    full = without_timing(metrics(tmp_path / "ref" / cell))
    for how in cut:
        resumed = metrics(tmp_path / how.name / cell)
        assert [r["step"] for r in resumed] == list(range(40)), how.name
        assert without_timing(resumed) == full, how.name


@pytest.mark.slow
def test_rerunning_a_finished_run_is_a_no_op(tmp_path, capsys):
    args = ["train", "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    run_dir = next(tmp_path.iterdir())
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    capsys.readouterr()
    assert main(args) == 0
    assert "already finished" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before


def test_shard_reader_round_trips(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, size=10_001).astype(np.uint16)
    write_shard(tmp_path / "train_000.bin", tokens)
    back = read_shard(tmp_path / "train_000.bin")
    assert isinstance(back, np.memmap) and back.dtype == np.uint16
    assert np.array_equal(np.asarray(back), tokens)
    header = np.fromfile(tmp_path / "train_000.bin", dtype=np.int32, count=256)
    assert list(header[:3]) == [20240520, 1, 10_001]
    write_shard(tmp_path / "val_000.bin", tokens[:3000])
    data = load_data(str(tmp_path), "bytes", 256)
    assert data.source == "shards" and data.vocab_size == 50257
    assert data.describe()["train_tokens"] == 10_001 and data.describe()["val_tokens"] == 3000
    x, y = data.batch("train", 0, 0, 2, 8)
    assert (x[:, 1:] == y[:, :-1]).all()


def test_trains_on_shards_and_on_text_with_bpe(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    tokens = np.random.default_rng(0).integers(0, 300, size=5000).astype(np.uint16)
    write_shard(tmp_path / "data.bin", tokens)
    run_dir, result = train_cell(tmp_path / "shards", steps=3, data=str(tmp_path / "data.bin"))
    assert result.summary["status"] == "completed"
    assert json.loads((run_dir / "config.json").read_text())["model"]["vocab_size"] == 50257
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(3000)))
    data = load_data(str(text), "bpe", 400)
    assert data.tokenizer == "bpe" and any((tmp_path / "cache").rglob("bpe-400.json"))
    assert int(max(a.max() for a in data.train)) < 400
    assert data.describe()["train_tokens"] < text.stat().st_size / 2  # BPE compresses


def test_bpe_trains_on_a_corpus_with_files_that_are_not_utf8(tmp_path, monkeypatch):
    """The default corpus, the stdlib, holds Latin-1 and KOI8-R files (test/encoded_modules):
    tokenizers' own file reader refused them, which broke every BPE size on the default data."""
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(2000)))
    (corpus / "b.py").write_bytes("# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n".encode("latin-1") * 50)
    data = load_data(str(corpus), "bpe", 300)
    assert data.tokenizer == "bpe" and int(max(a.max() for a in data.train)) < 300
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(next((tmp_path / "cache").rglob("bpe-300.json"))))
    assert "caf\ufffd" in tok.decode(tok.encode("caf\ufffd").ids)  # the byte became U+FFFD, as in encoding


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--variant", "nope"], "unknown variant 'nope'"),
        (["--steps", "-5"], "steps -5 must be at least 1"),
        (["--lr", "fast"], "lr 'fast' is not a valid float"),
        (["--data", "/no/such/path"], "data path '/no/such/path' does not exist"),
        (["--model", "huge"], "unknown model 'huge'; valid: tiny"),
        (["--variant", "mlp=swiglu,act=relu"], "does not apply to mlp=swiglu"),
        (["--set", "colour=red"], "unknown key 'colour'"),
        (["--kernels", "magic"], "unknown kernels 'magic'"),
    ],
)
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, args, fragment):
    out = tmp_path / "out"
    assert main(["train", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_bad_flag_from_the_command_line_has_no_traceback(tmp_path):
    proc = _cli("--lr", "x", "--out", str(tmp_path / "o"))
    out, err = proc.communicate()
    assert proc.returncode == 2 and err.strip().count("\n") == 0 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_top_level_help_and_a_bad_command_import_no_command_and_no_torch():
    """`ablate --help` answers at once: command modules (and torch) load only when named."""
    code = ("import sys\nfrom ablate.cli import main\n"
            "codes = []\n"
            "for argv in (['--help'], ['bogus'], []):\n"
            "    try:\n        codes.append(main(argv))\n"
            "    except SystemExit as e:\n        codes.append(e.code)\n"
            "print(codes, 'torch' in sys.modules, any(m.startswith('ablate.commands') for m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[0, 2, 2] False False", p.stdout
    assert "invalid choice: 'bogus'" in p.stderr


@pytest.mark.slow
def test_a_different_config_in_the_same_directory_is_refused(tmp_path, capsys):
    base = ["train", "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--quiet", "--out", str(tmp_path)]
    assert main(base) == 0
    run_dir = next(tmp_path.iterdir())
    (run_dir / "summary.json").unlink()  # pretend it is unfinished, then change an option
    assert main(base + ["--set", "eval_batches=3"]) == 2
    assert "holds a run with a different train" in capsys.readouterr().err


def test_probes_equal_their_definitions():
    """Per-layer gradient norms, residual RMS and update ratios against a direct computation."""
    import torch

    from ablate.engine.model import build_model
    from ablate.engine.probes import Probes
    from ablate.engine.sizes import get_size
    from ablate.variants import make_variant

    torch.manual_seed(0)
    size = get_size("tiny")
    model = build_model(make_variant(), size)
    probes = Probes(model)
    model.record_act_norms = True
    idx = torch.randint(0, 256, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    grads = probes.grad_norms()
    with torch.no_grad():  # the residual stream after each block, recomputed by hand
        x, expected_rms = model.wte(idx) + model.wpe(torch.arange(16)), []
        for block in model.blocks:
            x = block(x)
            expected_rms.append(x.square().mean().sqrt().item())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    probes.before_step()
    opt.step()
    _, metrics = probes.collect(loss, grads, model.act_norms, idx.numel() * size.d_model)

    def norm(names, tensors):
        return torch.sqrt(sum(tensors[n].double().square().sum() for n in names)).item()

    named = dict(model.named_parameters())
    g = {n: p.grad for n, p in named.items()}
    for i in range(size.n_layer):
        block = [n for n in named if n.startswith(f"blocks.{i}.")]
        assert metrics[f"grad_norm/layer_{i}"] == pytest.approx(norm(block, g), rel=1e-5)
        attn = [n for n in block if ".attn." in n]
        assert metrics[f"grad_norm/layer_{i}/attn"] == pytest.approx(norm(attn, g), rel=1e-5)
        norms = [n for n in block if ".wiring." in n]
        assert metrics[f"grad_norm/layer_{i}/norm"] == pytest.approx(norm(norms, g), rel=1e-5)
        delta = {n: named[n].detach() - before[n] for n in block}
        assert metrics[f"update_ratio/layer_{i}"] == pytest.approx(norm(block, delta) / norm(block, before), rel=1e-4)
    assert metrics["grad_norm/embed"] == pytest.approx(norm(["wte.weight", "wpe.weight"], g), rel=1e-5)
    assert metrics["grad_norm"] == pytest.approx(norm(list(named), g), rel=1e-5)
    for i, rms in enumerate(expected_rms):
        assert metrics[f"act_norm/layer_{i}"] == pytest.approx(rms, rel=1e-5)


@pytest.mark.slow
def test_options_come_from_a_config_file_and_flags_override_it(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('variant = "post-ln"\nsteps = 3\nbatch_size = 2\nseq_len = 16\nlr = 0.01\n')
    out = tmp_path / "out"
    assert main(["train", "--config", str(config), "--lr", "0.002", "--quiet", "--out", str(out)]) == 0
    run_dir = next(out.iterdir())
    train_options = json.loads((run_dir / "config.json").read_text())["train"]
    assert (train_options["variant"], train_options["steps"], train_options["lr"]) == ("post-ln", 3, 0.002)
    assert run_dir.name.startswith("post.layernorm.gelu.dense.res__")
    config.write_text("steps = [\n")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "bad")]) == 2
    assert "cannot be read (not valid TOML" in capsys.readouterr().err and not (tmp_path / "bad").exists()


# ------------------------------------------------------------- a resume trusts nothing on disk

OPTIONS = {"layers": 2, "steps": 6, "checkpoint_every": 3, "probes": False, "eval_batches": 1,
           "final_eval_batches": 1}


class Payload:
    """Unpickling this runs code: the side effect a planted checkpoint would cause."""

    def __reduce__(self):
        return (open, ("/tmp/ablate-planted-pickle-ran", "w"))


def _interrupted_run(tmp_path, monkeypatch, stop_at=2):
    cell = Cell.from_options(OPTIONS)
    run_dir = tmp_path / cell.id
    with interrupted_at(monkeypatch, stop_at), pytest.raises(T.Interrupted):
        T.train(cell, run_dir)
    return cell, run_dir


def test_a_planted_pickle_in_a_checkpoint_never_runs(tmp_path, monkeypatch):
    marker = "/tmp/ablate-planted-pickle-ran"
    if os.path.exists(marker):
        os.unlink(marker)
    cell, run_dir = _interrupted_run(tmp_path, monkeypatch)
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    ckpt["extra"] = Payload()  # what an attacker adds to a real checkpoint
    torch.save(ckpt, run_dir / "checkpoint.pt")
    with pytest.raises(ConfigError) as e:
        T.train(cell, run_dir)
    assert not os.path.exists(marker)  # the payload did not execute
    assert "checkpoint.pt cannot be resumed from" in str(e.value) and "\n" not in str(e.value)
    assert "remove it" in str(e.value)


def test_a_genuine_checkpoint_loads_with_weights_only(tmp_path, monkeypatch):
    cell, run_dir = _interrupted_run(tmp_path, monkeypatch)
    with open(run_dir / "checkpoint.pt", "rb") as f:
        assert b"__reduce__" not in f.read()
    torch.load(run_dir / "checkpoint.pt", weights_only=True)  # raises if it needed arbitrary unpickling
    summary = T.train(cell, run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 6


def test_a_garbage_metrics_line_on_resume_keeps_every_valid_row(tmp_path, monkeypatch, capsys):
    reference = T.train(Cell.from_options(OPTIONS), tmp_path / "ref")
    ref_rows = metrics(tmp_path / "ref")
    cell, run_dir = _interrupted_run(tmp_path / "run", monkeypatch)
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    # garbage in the middle, a JSON list, an object without a step, and a line cut short at the end
    path.write_text("\n".join([lines[0], "@@garbage@@", "[1, 2]", '{"loss": 1.0}', lines[1], lines[2], '{"step": 3, "lo'])
                    + "\n")
    summary = T.train(cell, run_dir)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(6))
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref_rows]
    assert summary["final_loss"] == reference["final_loss"]
    assert "skipped 4 unreadable line(s)" in capsys.readouterr().err


def test_symlinked_temporaries_in_a_run_folder_never_clobber_their_targets(tmp_path, monkeypatch):
    """checkpoint.tmp and metrics.tmp were fixed names the trainer wrote through; a link planted
    there must leave its target alone, through a checkpoint and a resume."""
    cell, run_dir = _interrupted_run(tmp_path, monkeypatch)
    targets = {}
    for name in ("checkpoint.tmp", "metrics.tmp", ".checkpoint.pt.tmp"):
        target = tmp_path / f"precious-{name.strip('.')}"
        target.write_text("keep me")
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(target)
        targets[name] = target
    summary = T.train(cell, run_dir)
    assert summary["status"] == "completed"
    for name, target in targets.items():
        assert target.read_text() == "keep me", name


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_one_line_exit_2_no_result_and_a_clean_resume(tmp_path, monkeypatch,
                                                                                       capsys):
    real_save, saves = torch.save, []

    class FullDisk:
        """A file on a disk that fills up: torch.save wraps the OSError in its own RuntimeError."""

        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 4096:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    def save(obj, f, *args, **kwargs):
        saves.append(1)
        return real_save(obj, FullDisk(f) if len(saves) == 2 else f, *args, **kwargs)  # the second checkpoint

    monkeypatch.setattr(torch, "save", save)
    args = ["train", "--layers", "2", "--steps", "6", "--checkpoint-every", "2", "--eval-batches", "1",
            "--final-eval-batches", "1", "--quiet", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left on device" in err.lower()
    (run_dir,) = (tmp_path / "o").iterdir()
    assert not (run_dir / "summary.json").exists() and not list(run_dir.glob("error-attempt*"))
    assert not list(run_dir.glob(".*.tmp"))
    monkeypatch.setattr(torch, "save", real_save)  # space freed
    assert main(args) == 0
    assert [r["step"] for r in metrics(run_dir)] == list(range(6))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
