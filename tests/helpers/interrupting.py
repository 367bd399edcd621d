"""Stop a training run as SIGINT would, at a chosen step, without sending a signal."""
import contextlib

import ablate.engine.train as T


@contextlib.contextmanager
def interrupted_at(monkeypatch, step: int):
    """Inside the block, train() behaves as if SIGINT arrived during `step`: it finishes that
    step, checkpoints, and raises ablate.engine.train.Interrupted."""
    received: list = []

    @contextlib.contextmanager
    def fake_signals():
        yield received

    real = T.lr_at

    def lr_at(s, cfg):
        if s == step:
            received.append(2)
        return real(s, cfg)

    with monkeypatch.context() as m:
        m.setattr(T, "_graceful_signals", fake_signals)
        m.setattr(T, "lr_at", lr_at)
        yield
