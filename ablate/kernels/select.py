"""`--kernels auto`, and the parity check the `cpu` backend passes before it trains.

On a CPU, once per process: `cpu` (reference with the C kernels, cpu_backend.py) when it passes
the quick parity suite with the forms a new run would use, else `reference` (the GPU backends'
kernels do not run there, except Triton's slow interpreter). `--kernels cpu` runs the same check
(cpu_failure) and is refused in one line when it fails.

On a CUDA device: `reference`, unless another backend was measured faster on whole training
steps of the cell's shape on this device, driver and library versions (`ablate kernels tune`,
recorded in step_cache.py's file). Isolated per-op timings never decide: they measure host
latency, not a step. Only the chosen backend is loaded (built, JIT-compiled) and parity-checked,
once per process; one that fails its check falls back to `reference` with one line. A backend
not chosen is never imported. `AUTO_DETAILS[key]` keeps why, for whoever records the choice.
"""
from __future__ import annotations

import contextlib
import json
import sys

from ablate.core.errors import ConfigError
from ablate.core.paths import cache_root

_CHOICE: dict[str, str] = {}
AUTO_DETAILS: dict[str, dict] = {}


def _device_key(device) -> str:
    import torch  # lazy: torch only when used

    d = torch.device(device)
    return f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"


def pick_auto(device, shape: dict | None = None) -> str:
    """The backend `auto` trains with on `device`; `shape` (step_cache.step_shape) the cell's
    step, without which a CUDA device trains `reference` (nothing was measured for it)."""
    import torch  # lazy: torch only when used

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        fresh = "cpu" not in _CHOICE
        if _cpu_choice() != "cpu" and fresh:  # said once, when checked
            print("ablate: kernels 'cpu' failed its parity check on cpu; not used by auto", file=sys.stderr)
        return _CHOICE["cpu"]
    key = _device_key(device)
    cached = f"{key} {json.dumps(shape, sort_keys=True)}"
    if cached not in _CHOICE:
        _CHOICE[cached] = _pick_cuda(key, shape, cached)
    return _CHOICE[cached]


def failed_parity(name: str, backend, device: str, details: dict, quiet: bool = False) -> bool:
    """Run the quick parity suite; record and report a backend that fails or crashes it."""
    from ablate.kernels import parity  # lazy: torch only when used

    try:
        rows = parity.run_suite({name: backend}, device, quick=True)
    except Exception as e:  # a backend that crashes is not verified
        details["skipped"][name] = f"parity check raised {type(e).__name__}: {e}"
        return True
    failed = [r.case.id for r in rows if not r.passed]
    details["parity"][name] = f"{len(rows) - len(failed)}/{len(rows)} cases passed"
    if failed:
        details["skipped"][name] = f"failed parity on {device}: {', '.join(failed[:3])}"
        if not quiet:
            print(f"ablate: kernels {name!r} failed its parity check on {device}; not used by auto", file=sys.stderr)
    return bool(failed)


def _cpu_choice() -> str:
    """`cpu` when its kernels, in the forms a new run takes (each kernel's best here), pass the
    quick parity suite, else `reference`: checked once a process (the library and those forms
    do not change in it), the details in AUTO_DETAILS["cpu"]."""
    if "cpu" not in _CHOICE:
        from ablate.kernels import cpu_attention, cpu_gelu  # lazy: keeps torch off `ablate train --help`
        from ablate.kernels.cpu_backend import unchecked

        details: dict = {"parity": {}, "seconds": {}, "skipped": {}}
        AUTO_DETAILS["cpu"] = details
        with contextlib.ExitStack() as forms:
            for kernel in (cpu_gelu.KERNEL, cpu_attention.KERNEL):
                forms.enter_context(kernel.using(kernel.best()))
            failed = failed_parity("cpu", unchecked(), "cpu", details, quiet=True)
        details["choice"] = _CHOICE["cpu"] = "reference" if failed else "cpu"
    return _CHOICE["cpu"]


def refuse_failed_cpu() -> None:
    """`--kernels cpu`: the check `auto` makes, before anything trains; ConfigError (one line)
    when the C kernels compute other values than `reference` (a library built wrong)."""
    if _cpu_choice() == "cpu":
        return

    why = AUTO_DETAILS["cpu"]["skipped"]["cpu"]
    raise ConfigError(f"kernels 'cpu' failed its parity check on this machine ({why}): its C kernels compute "
                      f"other values than reference; valid: --kernels reference, or auto (which trains reference "
                      f"here), or fix the C compiler (CC) and remove {cache_root() / 'kernels'}")


def _pick_cuda(device: str, shape: dict | None, key: str) -> str:
    """`reference` unless the step cache says a backend is faster on this step here; the choice
    is loaded and checked, and nothing else is."""
    from ablate.kernels import step_cache  # lazy: torch only when used

    details: dict = {"parity": {}, "seconds": {}, "skipped": {}}
    AUTO_DETAILS[key] = AUTO_DETAILS[device] = details
    measured = step_cache.lookup(step_cache.device_key(device), shape) if shape is not None else None
    choice = "reference"
    if measured is not None:
        details["seconds"] = measured["seconds"]
        choice = measured["choice"]
    if choice != "reference" and not _verified(choice, device, details):
        choice = "reference"
    details["choice"] = choice
    return choice


def _verified(name: str, device: str, details: dict) -> bool:
    """Load the one backend `auto` chose and run its quick parity suite on the device."""
    from ablate.kernels import parity  # lazy: torch only when used

    backend = parity.load_backends((name,), device)[name]
    if isinstance(backend, str):
        details["skipped"][name] = backend
        print(f"ablate: kernels {name!r} was measured fastest here but cannot load ({backend}); auto trains "
              "reference", file=sys.stderr)
        return False
    return not failed_parity(name, backend, device, details)
