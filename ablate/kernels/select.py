"""`--kernels auto`: the fastest backend that passed its parity check on this device.

On a CPU, once per process: `cpu` (reference with the C kernels, cpu_backend.py) when it passes
the quick parity suite with the forms a new run would use, else `reference` (the GPU backends'
kernels do not run there, except Triton's slow interpreter). On a CUDA device, once per process
and device: every GPU backend that loads (the
`cuda` one builds on first use; a missing nvcc or a failed build leaves it out) runs the quick
parity suite on the device, and those that pass every case are timed, with `reference`, on a
representative forward + backward (bench.quick_time); the fastest wins. `AUTO_DETAILS[device]`
keeps why, for whoever records the choice.
"""
from __future__ import annotations

import sys

_CHOICE: dict[str, str] = {}
AUTO_DETAILS: dict[str, dict] = {}


def _device_key(device) -> str:
    import torch

    d = torch.device(device)
    return f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"


def pick_auto(device) -> str:
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        if "cpu" not in _CHOICE:
            _CHOICE["cpu"] = _pick_cpu()
        return _CHOICE["cpu"]
    key = _device_key(device)
    if key not in _CHOICE:
        _CHOICE[key] = _pick(key)
    return _CHOICE[key]


def _failed_parity(name: str, backend, device: str, details: dict) -> bool:
    """Run the quick parity suite; record and report a backend that fails or crashes it."""
    from ablate.kernels import parity

    try:
        rows = parity.run_suite({name: backend}, device, quick=True)
    except Exception as e:  # a backend that crashes is not verified
        details["skipped"][name] = f"parity check raised {type(e).__name__}: {e}"
        return True
    failed = [r.case.id for r in rows if not r.passed]
    details["parity"][name] = f"{len(rows) - len(failed)}/{len(rows)} cases passed"
    if failed:
        details["skipped"][name] = f"failed parity on {device}: {', '.join(failed[:3])}"
        print(f"ablate: kernels {name!r} failed its parity check on {device}; not used by auto", file=sys.stderr)
    return bool(failed)


def _pick_cpu() -> str:
    """`cpu` when its kernels, in the forms a new run takes (each kernel's best here), pass."""
    import contextlib

    from ablate.kernels import cpu_attention, cpu_gelu
    from ablate.kernels.cpu_backend import load

    details: dict = {"parity": {}, "seconds": {}, "skipped": {}}
    AUTO_DETAILS["cpu"] = details
    with contextlib.ExitStack() as forms:
        for kernel in (cpu_gelu.KERNEL, cpu_attention.KERNEL):
            forms.enter_context(kernel.using(kernel.best()))
        failed = _failed_parity("cpu", load(), "cpu", details)
    details["choice"] = "reference" if failed else "cpu"
    return details["choice"]


def _pick(device: str) -> str:
    from ablate.bench import kernel_ops as bench
    from ablate.kernels import parity
    from ablate.kernels.reference import ReferenceBackend

    details: dict = {"parity": {}, "seconds": {}, "skipped": {}}
    AUTO_DETAILS[device] = details
    verified: dict[str, object] = {"reference": ReferenceBackend()}
    for name, backend in parity.load_backends(parity.GPU_BACKENDS, device).items():
        if isinstance(backend, str):
            details["skipped"][name] = backend
        elif not _failed_parity(name, backend, device, details):
            verified[name] = backend
    for name, backend in verified.items():
        try:
            details["seconds"][name] = bench.quick_time(backend, device)
        except Exception as e:
            details["skipped"][name] = f"timing raised {type(e).__name__}: {e}"
    timed = details["seconds"]
    choice = min(timed, key=timed.get) if timed else "reference"
    details["choice"] = choice
    return choice
