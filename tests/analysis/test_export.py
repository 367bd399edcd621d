"""ablate export: TensorBoard event files and W&B offline runs, read back with the libraries'
own readers (TensorBoard's EventAccumulator; W&B's .wandb record log, see read_wandb_records)."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ablate.analysis.export import ExportError, export_tensorboard, export_wandb
from ablate.cli import main
from tests.helpers.planted_links import plant_links, victims_untouched
from tests.helpers.synthetic_runs import write_grid, write_run


def two_cell_grid(root: Path, running_losses=(4.0, 3.6, 3.3)):
    done = write_run(root, "pre.layernorm.gelu.dense.res", 0, [4.0, 3.5, 3.2, 3.0], options={"lr": 1e-3})
    live = write_run(root, "post.layernorm.gelu.dense.res", 0, list(running_losses), options={"lr": 1e-3},
                     status="running", planned_steps=6)
    write_grid(root, [done, live])
    return done, live


def grow(run, scratch: Path, losses, status=None):
    """The engine's view of `run` having trained on: the rows of a longer run past the last
    logged step appended to its metrics.jsonl (and its summary.json, once finished)."""
    longer = write_run(scratch, run.variant_id, run.seed, losses, options=run.options, status=status,
                       planned_steps=run.config["train"]["steps"])
    added = [r for r in longer.metrics if r["step"] > run.metrics[-1]["step"]]
    with open(run.path / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in added)
    if longer.summary is not None:
        (run.path / "summary.json").write_text(json.dumps(longer.summary))
    run.metrics = run.metrics + added
    run.summary = longer.summary
    return run


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected_scalars(run) -> dict[str, list[tuple[int, float]]]:
    expected: dict[str, list] = {}
    for row in run.metrics:
        for key, value in row.items():
            if key != "step":
                expected.setdefault(key, []).append((row["step"], value))
    return expected


def assert_same_scalars(got, want):
    assert set(got) >= set(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag  # every step once
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag  # float32


def test_tensorboard_holds_every_scalar_once_with_its_step_and_the_hparams(tmp_path):
    pytest.importorskip("tensorboard")
    done, live = two_cell_grid(tmp_path / "grid")
    before = snapshot(tmp_path / "grid")
    result = export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    assert snapshot(tmp_path / "grid") == before  # nothing written into the run directories
    assert sorted(result.updated) == sorted([f"{done.group}/seed=0", f"{live.group}/seed=0"])

    for run in (done, live):
        got = tensorboard_scalars(tmp_path / "tb" / run.group / "seed=0")
        assert_same_scalars(got, expected_scalars(run))
        assert ("summary/final_loss" in got) == (run.summary is not None)
    finished = tensorboard_scalars(tmp_path / "tb" / done.group / "seed=0")
    assert finished["summary/final_loss"] == [(3, pytest.approx(done.summary["final_loss"]))]

    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(tmp_path / "tb"))
    mux.Reload()
    content = mux.PluginRunToTagToContent(metadata.PLUGIN_NAME)
    experiment = metadata.parse_experiment_plugin_data(content["."][metadata.EXPERIMENT_TAG])
    domains = {h.name: [v.string_value or v.number_value for v in h.domain_discrete.values]
               for h in experiment.hparam_infos}
    assert domains["norm"] == ["post", "pre"] and domains["lr"] == [1e-3]
    start = metadata.parse_session_start_info_plugin_data(
        content[f"{live.group}/seed=0"][metadata.SESSION_START_INFO_TAG])
    assert start.hparams["norm"].string_value == "post" and start.group_name == live.group


def test_reexport_writes_nothing_for_an_unchanged_folder_and_only_new_steps_for_a_grown_cell(tmp_path):
    pytest.importorskip("tensorboard")
    done, live = two_cell_grid(tmp_path / "grid")
    export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    first = snapshot(tmp_path / "tb")

    again = export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    assert snapshot(tmp_path / "tb") == first and again.updated == []

    grown = grow(live, tmp_path / "later", [4.0, 3.6, 3.3, 3.1, 3.0, 2.9])  # 3 more steps, finished
    result = export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    assert result.updated == [f"{live.group}/seed=0"]
    after = snapshot(tmp_path / "tb")
    assert {k: v for k, v in after.items() if k in first} == first  # old event files untouched
    added = [k for k in after if k not in first]
    assert len(added) == 1 and added[0].startswith(f"{live.group}/seed=0/") and ".steps-3-5." in added[0]
    got = tensorboard_scalars(tmp_path / "tb" / live.group / "seed=0")
    assert_same_scalars(got, expected_scalars(grown))  # steps 0-5 once each, no step twice
    assert got["summary/final_loss"] == [(5, pytest.approx(grown.summary["final_loss"]))]


def test_sparse_probe_metrics_and_non_finite_values_keep_their_own_steps(tmp_path):
    pytest.importorskip("tensorboard")
    run = write_run(tmp_path / "grid", losses=[3.0, 2.5, 2.4, 2.3])
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    rows[0]["logit_max"], rows[2]["logit_max"] = 7.0, 9.0  # every probe_every = 2 steps
    rows[1]["grad_norm"] = None  # non-finite
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    got = tensorboard_scalars(tmp_path / "tb" / run.group / "seed=0")
    assert got["logit_max"] == [(0, 7.0), (2, 9.0)]
    steps, values = zip(*got["grad_norm"])
    assert steps == (0, 1, 2, 3) and values[1] != values[1]  # NaN


def test_a_missing_extra_is_one_line_naming_the_install(tmp_path, monkeypatch, capsys):
    two_cell_grid(tmp_path / "grid")
    for target in ("tensorboard", "wandb"):
        monkeypatch.setitem(sys.modules, target, None)  # as if not installed
        assert main(["export", str(tmp_path / "grid"), "--to", target]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"pip install -e '.[{target}]'" in err, err
    assert not (tmp_path / "grid" / "tensorboard").exists()


def test_export_refuses_an_out_inside_a_run_directory(tmp_path):
    done, _ = two_cell_grid(tmp_path / "grid")
    with pytest.raises(ExportError, match="inside the run directory"):
        export_tensorboard(tmp_path / "grid", done.path / "tb")


def test_the_command_exports_a_grid_and_a_lone_run_beside_it(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    done, _ = two_cell_grid(tmp_path / "grid")
    assert main(["export", str(tmp_path / "grid"), "--to", "tensorboard"]) == 0
    assert "2 runs updated, 0 unchanged" in capsys.readouterr().out
    assert (tmp_path / "grid" / "tensorboard" / done.group / "seed=0").is_dir()
    before = snapshot(done.path)
    assert main(["export", str(done.path), "--to", "tensorboard"]) == 0
    assert snapshot(done.path) == before and (tmp_path / "grid" / "tensorboard").is_dir()


# ------------------------------------------------------------------------------ W&B

def read_wandb_records(path: Path) -> list:
    """The records of a W&B `.wandb` file: a 7-byte header (":W&B", magic 0xBEE1, version 0),
    then LevelDB-log blocks of 32 KiB whose records (crc32c, length, type) hold protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def display_name(records) -> str:
    return next(r.run.display_name for r in records if r.WhichOneof("record_type") == "run")


def snapshot_of_run(out: Path, cell_id: str):
    """The files of the offline folder whose run has config cell_id == `cell_id`."""
    for folder in (out / "wandb").glob("offline-run-*"):
        records = read_wandb_records(next(folder.glob("run-*.wandb")))
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        if any(item_key(u) == "cell_id" and json.loads(u.value_json) == cell_id for u in run.config.update):
            return folder.name, snapshot(folder)
    raise AssertionError(f"no offline run of {cell_id}")


def wandb_runs(out: Path) -> dict[str, list]:
    """{run id: [records of each offline folder in order]} under out/wandb."""
    found: dict[str, list] = {}
    for folder in sorted((out / "wandb").glob("offline-run-*")):
        for file in folder.glob("run-*.wandb"):
            found.setdefault(file.stem[len("run-"):], []).append(read_wandb_records(file))
    return found


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_wandb_offline_writes_a_run_folder_per_cell_with_group_config_and_rewrites_only_changed_cells(tmp_path, wandb_env):
    done, live = two_cell_grid(tmp_path / "grid")
    before = snapshot(tmp_path / "grid")
    result = export_wandb(tmp_path / "grid", tmp_path / "out")
    assert snapshot(tmp_path / "grid") == before and len(result.updated) == 2

    runs = wandb_runs(tmp_path / "out")
    assert len(runs) == 2
    by_name = {}
    for folders in runs.values():
        records = folders[0]
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        config = {item_key(u): json.loads(u.value_json) for u in run.config.update}
        history = [{item_key(i): json.loads(i.value_json) for i in r.history.item}
                   for r in records if r.WhichOneof("record_type") == "history"]
        by_name[run.display_name] = (run, config, history)
    for synthetic in (done, live):
        run, config, history = by_name[f"{synthetic.group}/seed=0"]
        assert run.run_group == synthetic.group and run.job_type == synthetic.variant_id
        assert "lr=0.001" in run.tags and "norm=" + synthetic.config["variant"]["norm"] in run.tags
        assert {k: v for k, v in config.items() if k != "_wandb"} == synthetic.config  # config.json as is
        assert [h["_step"] for h in history] == [r["step"] for r in synthetic.metrics]
        assert [h["loss"] for h in history] == [r["loss"] for r in synthetic.metrics]

    exported = snapshot(tmp_path / "out")
    assert export_wandb(tmp_path / "grid", tmp_path / "out").updated == []  # nothing new: nothing written
    assert snapshot(tmp_path / "out") == exported
    done_folder = snapshot_of_run(tmp_path / "out", done.cell_id)
    grow(live, tmp_path / "later", [4.0, 3.6, 3.3, 3.1], status="running")
    assert export_wandb(tmp_path / "grid", tmp_path / "out").updated == [f"{live.group}/seed=0"]
    assert snapshot_of_run(tmp_path / "out", done.cell_id) == done_folder  # the unchanged cell: untouched
    runs = wandb_runs(tmp_path / "out")
    assert sorted(len(folders) for folders in runs.values()) == [1, 1]  # the grown cell's folder replaced
    steps = {display_name(folders[0]): [int(json.loads(i.value_json)) for r in folders[0]
                                        if r.WhichOneof("record_type") == "history"
                                        for i in r.history.item if item_key(i) == "_step"]
             for folders in runs.values()}
    assert steps[f"{live.group}/seed=0"] == [0, 1, 2, 3]  # whole: sync replaces, it cannot append


def test_a_damaged_cell_is_named_in_one_line_and_the_rest_exported(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    done, live = two_cell_grid(tmp_path / "grid")
    (done.path / "config.json").write_text('{"cell_id": ')
    assert main(["export", str(tmp_path / "grid"), "--to", "tensorboard"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and done.path.name in warnings[0] and "config.json" in warnings[0]
    assert "1 run updated" in captured.out
    assert (tmp_path / "grid" / "tensorboard" / live.group / "seed=0").is_dir()


def test_a_new_axis_value_replaces_the_hparams_experiment(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    two_cell_grid(tmp_path / "grid")
    export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    write_run(tmp_path / "grid", "pre.layernorm.gelu.dense.res", 0, [4.0, 3.0], options={"lr": 3e-3})
    export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    files = [p.name for p in (tmp_path / "tb").glob("events.out.tfevents.*")]
    assert len(files) == 1 and ".experiment-" in files[0]  # the old one is gone: TensorBoard reads the first
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG]
    experiment = metadata.parse_experiment_plugin_data(content)
    lr = next(h for h in experiment.hparam_infos if h.name == "lr")
    assert [v.number_value for v in lr.domain_discrete.values] == [1e-3, 3e-3]


def test_the_custom_scalars_layout_draws_each_per_layer_metric_with_a_line_per_layer(tmp_path):
    pytest.importorskip("tensorboard")
    import re

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    done, _ = two_cell_grid(tmp_path / "grid")
    export_tensorboard(tmp_path / "grid", tmp_path / "tb")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    layout = layout_pb2.Layout.FromString(acc.Tensors(metadata.CONFIG_SUMMARY_TAG)[0].tensor_proto.string_val[0])
    charts = {c.title: c.multiline.tag[0] for c in layout.category[0].chart}
    assert set(charts) == {"grad_norm by layer", "grad_norm/attn by layer", "grad_norm/mlp by layer",
                           "grad_norm/norm by layer", "act_norm by layer", "update_ratio by layer"}
    keys = set(done.metrics[0])
    assert sorted(k for k in keys if re.match(charts["grad_norm by layer"], k)) == ["grad_norm/layer_0",
                                                                                   "grad_norm/layer_1"]
    assert [k for k in keys if re.match(charts["grad_norm/attn by layer"], k)] != []


V = "pre.layernorm.gelu.dense.res"


def run_cli(*args, cwd=None, env=None, timeout=60):
    """`python -m ablate ...` in a child process (a hang is a failure, not a stuck suite)."""
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, args)], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def clean_env(tmp_path: Path) -> dict:
    """HOME and TMPDIR in an empty folder of the test's, and no W&B settings from outside."""
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), TMPDIR=str(home / "tmp"), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), WANDB_SILENT="true")
    return env


@pytest.mark.parametrize("kind", ["absolute", "climbing"])
def test_a_tensorboard_export_writes_nothing_outside_out_whatever_the_group_says(tmp_path, kind):
    runs, out = tmp_path / "runs", tmp_path / "a" / "b" / "tb"
    group = str(tmp_path / "x" / "ESCAPE") if kind == "absolute" else "../../../x/ESCAPE"
    write_run(runs, V, 0, group=group)
    write_run(runs, V, 1, group="..")
    before = files_under(tmp_path)
    assert main(["export", str(runs), "--to", "tensorboard", "--out", str(out)]) == 0
    escaped = {p for p in files_under(tmp_path) - before if out not in p.parents and p != out}
    assert escaped <= {tmp_path / "a", tmp_path / "a" / "b"}  # --out's own parents, nothing else
    assert len(list(out.rglob("events.out.tfevents.*.start*"))) == 2


def test_export_temporaries_planted_as_links_leave_their_targets_untouched(tmp_path):
    runs, out, victims = tmp_path / "runs", tmp_path / "tb", tmp_path / "victims"
    victims.mkdir()
    run = write_run(runs, V, 0)
    run_dir = out / run.group / "seed=0"
    links = plant_links(victims, [run_dir / f".part-{i:06d}.tmp" for i in range(2)] + [out / ".part-000000.tmp"])
    assert main(["export", str(runs), "--to", "tensorboard", "--out", str(out)]) == 0
    assert victims_untouched(links)
    assert list(run_dir.glob("events.out.tfevents.*"))


def test_a_wandb_export_leaves_nothing_outside_out(tmp_path):
    pytest.importorskip("wandb")
    runs, out = tmp_path / "runs", tmp_path / "out"
    write_run(runs, V, 0)
    env = clean_env(tmp_path)
    result = run_cli("export", runs, "--to", "wandb", "--out", out, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert list(out.glob("wandb/offline-run-*"))
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "home").rglob("*") if p.is_file())
    assert left == []


@pytest.mark.parametrize("target", ["tensorboard", "wandb"])
def test_export_skips_a_step_out_of_range_with_a_warning(tmp_path, target, monkeypatch):
    pytest.importorskip(target)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var))
    runs, out = tmp_path / "runs", tmp_path / "out"
    run = write_run(runs, V, 0, status="running")
    with open(run.path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2**63, "loss": 1.0}) + "\n")
    result = run_cli("export", runs, "--to", target, "--out", out, env={**os.environ, "WANDB_SILENT": "true"},
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and str(2**63) in result.stderr
