"""The option schema (ablate.config) as the only list of what defines a run."""
import json

import pytest

from ablate.config import EXECUTION_KEYS, IDENTITY_KEYS, OPTIONS
from ablate.config import TRAIN_ID_OPTIONS
from ablate.errors import ConfigError


# A value other than the default for every experiment option, valid with the others at default.
OTHER = {"variant": "post-ln", "norm": "post", "norm_type": "rmsnorm", "act": "relu", "mlp": "swiglu",
         "residual": False, "qk_norm": "layernorm", "model": "small", "layers": 3, "width": 32, "mlp_ratio": 2.0,
         "init": "xavier", "optimizer": "adam", "lr": 2e-3, "weight_decay": 0.0, "beta1": 0.8, "beta2": 0.9,
         "grad_clip": 1.0, "z_loss": 1e-4, "steps": 3, "warmup": 1, "schedule": "constant", "min_lr_ratio": 0.5,
         "seed": 1, "batch_size": 4, "seq_len": 32, "dtype": "bfloat16", "diverge_factor": 3.0,
         "eval_batches": 2, "final_eval_batches": 3}

NEEDS = {"momentum": {"optimizer": "sgd"}, "nesterov": {"optimizer": "sgd"}, "decay_fraction": {"schedule": "wsd"}}
OTHER.update({"momentum": 0.5, "nesterov": True, "decay_fraction": 0.5, "data": None})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished run per base configuration, shared by the cases (training is the slow part)."""
    from ablate.cell import Cell
    from ablate.train import train

    root, done = tmp_path_factory.mktemp("identity"), {}

    def get(base):
        key = json.dumps(base, sort_keys=True)
        if key not in done:
            cell = Cell.from_options(base, id_keys=TRAIN_ID_OPTIONS)
            train(cell, root / key.__hash__().__str__() / cell.id)
            done[key] = (cell, root / key.__hash__().__str__() / cell.id)
        return done[key]

    return get


def test_the_schema_is_the_only_list_of_identity_keys():
    assert set(IDENTITY_KEYS).isdisjoint(EXECUTION_KEYS)
    assert {"threads", "device", "kernels", "compile", "flush_denormal", "checkpoint_every"} == set(EXECUTION_KEYS)
    assert {"lr", "init", "optimizer", "z_loss", "mlp_ratio", "qk_norm", "seed"} <= set(IDENTITY_KEYS)
    for name in ("log_every", "probes", "probe_every", "eval_every"):
        assert OPTIONS[name].role == "observation"


def test_every_identity_option_has_a_test_value():
    assert set(IDENTITY_KEYS) <= set(OTHER)


@pytest.mark.parametrize("key", [k for k in IDENTITY_KEYS if k != "data"])
def test_changing_an_identity_option_changes_the_cell_id_or_is_refused_on_the_run(trained, key):
    from ablate.cell import Cell
    from ablate.train import check_existing_run

    base = {"layers": 2, "steps": 2, "eval_batches": 1, "final_eval_batches": 1, "probes": False, **NEEDS.get(key, {})}
    first, run_dir = trained(base)
    other = Cell.from_options({**base, key: OTHER[key]}, id_keys=TRAIN_ID_OPTIONS)
    if other.id != first.id:  # named in the folder: a different run directory
        return
    assert not OPTIONS[key].in_id or key in ("variant", "norm", "norm_type", "act", "mlp", "residual", "qk_norm")
    with pytest.raises(ConfigError, match="holds a run with a different"):
        check_existing_run(other, run_dir)


@pytest.mark.slow
def test_a_run_directory_from_before_the_schema_still_resumes_and_reports(tmp_path, monkeypatch):
    """An old config.json (no identity_keys, plugins, model.init, and none of the new options in
    `train`) of an interrupted run: the same command resumes it to the uninterrupted metrics."""
    import ablate.train as T
    from tests.helpers.interrupting import interrupted_at
    from ablate.analysis.load import load_runs
    from ablate.cell import Cell

    options = {"layers": 2, "steps": 6, "checkpoint_every": 100, "probes": False}
    T.train(Cell.from_options(options), tmp_path / "reference")
    cell = Cell.from_options(options)
    run_dir = tmp_path / "grid" / cell.id
    with interrupted_at(monkeypatch, 2), pytest.raises(T.Interrupted):  # checkpoints after step 2
        T.train(cell, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    for key in ("init", "optimizer", "z_loss", "mlp_ratio", "qk_norm", "momentum", "nesterov", "decay_fraction",
                "final_eval_batches", "probe_every"):
        del config["train"][key]
    for section, key in (("model", "init"), ("model", "mlp_ratio"), ("variant", "qk_norm")):
        del config[section][key]
    del config["identity_keys"], config["plugins"]
    (run_dir / "config.json").write_text(json.dumps(config))
    T.check_existing_run(cell, run_dir)  # the same run: not refused
    T.train(cell, run_dir)

    def losses(d):
        return [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]

    assert losses(run_dir) == losses(tmp_path / "reference")
    runs = load_runs(tmp_path / "grid")
    assert list(runs.cells["cell_id"]) == [cell.id] and runs.cells["status"].iloc[0] == "completed"
