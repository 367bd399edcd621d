"""The host side of a pack's captured steps (ablate/engine/pack_graphs.py), on a CPU: torch's CUDA graph
API replaced by one that records which step body a graph holds and reruns it on replay, writing
its results into the captured record as a replayed graph writes its static outputs. A captured
pack must then train the eager pack's bits: warm-up steps undone, the step and its rates fed
through the device tensors, each replay's record copied out."""
import contextlib
import json

import torch

import ablate.engine.pack_graphs as PG
import ablate.engine.pack_train as PT
from ablate.engine.cell import Cell
from ablate.engine.train import plan_run

OPTIONS = {"model": "tiny", "layers": 2, "width": 32, "batch_size": 2, "seq_len": 16, "eval_every": 10,
           "eval_batches": 1, "final_eval_batches": 1, "threads": 1, "steps": 24, "kernels": "reference",
           "probe_every": 10, "log_every": 2, "grad_clip": 1.0}


class FakeGraph:
    recording = None

    def __init__(self):
        self.body = None  # (run, args, record) of the captured step

    def replay(self):
        run, args, record = self.body
        fresh = REAL_BODY(run, *args)
        record.loss.copy_(fresh.loss)
        if record.parts is not None:
            record.parts.copy_(fresh.parts)


REAL_BODY = PT.PackRun.body


def recording_body(self, *args):
    record = REAL_BODY(self, *args)
    if FakeGraph.recording is not None:
        FakeGraph.recording.body = (self, args, record)
    return record


@contextlib.contextmanager
def fake_capture(graph):
    FakeGraph.recording = graph
    try:
        yield
    finally:
        FakeGraph.recording = None


class FakeStream:
    def wait_stream(self, other):
        pass


def train(out, monkeypatch, captured):
    cells = [Cell.from_options({**OPTIONS, "seed": s}) for s in (0, 1)]
    with monkeypatch.context() as m:
        if captured:
            m.setattr(PT, "capture_enabled", lambda device: True)
            m.setattr(PT.PackRun, "body", recording_body)
            m.setattr(torch.cuda, "Stream", FakeStream)
            m.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
            m.setattr(torch.cuda, "current_stream", FakeStream)
            m.setattr(torch.cuda, "CUDAGraph", FakeGraph)
            m.setattr(torch.cuda, "graph", fake_capture)
        PT.train_pack(cells, [plan_run(c, None, out / c.id) for c in cells])
    return [[{k: v for k, v in json.loads(line).items() if k not in ("time_s", "tokens_per_s")}
             for line in (out / c.id / "metrics.jsonl").read_text().splitlines()] for c in cells]


def test_a_captured_pack_trains_the_eager_packs_bits(tmp_path, monkeypatch, capsys):
    replays = []
    real_replay = FakeGraph.replay
    monkeypatch.setattr(FakeGraph, "replay", lambda self: replays.append(1) or real_replay(self))
    captured = train(tmp_path / "captured", monkeypatch, True)
    assert "cannot be captured" not in capsys.readouterr().err
    # 24 steps: 3 probing ones (0, 10, 20) eager; two graphs (plain, logged) captured once each.
    assert len(replays) == 21
    assert captured == train(tmp_path / "eager", monkeypatch, False)
