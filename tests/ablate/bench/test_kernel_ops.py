"""The kernel bench on a CPU: device and host time per implementation, both printed."""
from __future__ import annotations

import math

import torch

from ablate.bench import kernel_ops as bench
from ablate.kernels.reference import ReferenceBackend


class Other(ReferenceBackend):
    name = "other"


def test_cpu_bench_reports_device_and_host_time_per_implementation():
    cases = [bench.BenchCase("add_layer_norm", 4, 16, torch.float32), bench.BenchCase("bias_act:gelu", 4, 16,
                                                                                      torch.bfloat16)]
    seen = []
    bench.run_bench(cases, {"other": Other(), "broken": "why it is missing"}, "cpu", use_compile=False,
                    repeats=2, progress=seen.append)
    assert [[r.impl for r in rs] for rs in seen] == [["eager", "other"]] * 2
    for r in (r for rs in seen for r in rs):
        assert r.error is None and r.how == "wall"
        assert all(t > 0 and math.isfinite(t) for t in (r.fwd_s, r.fwdbwd_s, r.fwd_host_s, r.fwdbwd_host_s))
    text = bench.format_header(1e9) + "\n" + bench.format_case(seen[0], 1e9)
    assert "host f+b" in text and "graph = CUDA-graph replay" in text
    assert text.splitlines()[-1].split()[-2:] == ["wall", "missed"]  # `other`, against the targets


def test_an_implementation_that_raises_is_reported_not_fatal():
    class Broken(ReferenceBackend):
        def layer_norm(self, *a):
            raise RuntimeError("no kernel\nsecond line")

    seen = []
    bench.run_bench([bench.BenchCase("layer_norm", 2, 8, torch.float32)], {"broken": Broken()}, "cpu",
                    use_compile=False, repeats=1, progress=seen.append)
    (eager, broken), = seen
    assert eager.error is None and broken.error == "RuntimeError: no kernel"
    assert "error: RuntimeError: no kernel" in bench.format_case(seen[0], 1e9)


def test_bias_gelu_is_a_default_case():
    assert "bias_act:gelu" in {c.op for c in bench.default_cases(8)}
