"""bench/timing.py: the host-time loop drains the device before each sample, untimed."""
from __future__ import annotations

from ablate.bench import timing


def test_host_seconds_syncs_before_each_sample_and_averages_calls():
    events = []
    samples = timing.host_seconds(lambda: events.append("call"), repeats=3, warmup=2, calls=4,
                                  sync=lambda: events.append("sync"))
    assert len(samples) == 3 and all(s >= 0 for s in samples)
    assert events == ["call"] * 2 + (["sync"] + ["call"] * 4) * 3
