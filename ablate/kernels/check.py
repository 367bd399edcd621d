"""`ablate kernels check`: the parity suite (parity.py) run for the named backends on one device,
a line per case as it goes (verbose), then its op x backend table; exit status 1 on any failure.

Without a GPU, the Triton kernels run in Triton's interpreter on the CPU (TRITON_INTERPRET=1 is
set before Triton loads) and `cuda` is reported unavailable. `cpu` is checked on the ops it has
C kernels for, as `auto` does, and the forms its kernels take on this machine are named.
"""
from __future__ import annotations

import os
import sys

from ablate.kernels import cpu_attention, cpu_gelu, parity


def interpret_triton_on_cpu(device: str) -> bool:
    """On a CPU, Triton's kernels can only run interpreted; the choice is made when Triton's
    decorators run, so set it before anything imports the Triton backend."""
    if device == "cpu" and "ablate.kernels.triton_kernels" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET") == "1"


def cpu_forms() -> str:
    """The CPU C kernels the `cpu` backend computes with on this machine, each loaded first: a cached
    library that does not verify is rebuilt (cpu_cache.py), and one that cannot be built is named
    with why."""
    parts = []
    for what, kernel in (("GELU", cpu_gelu.KERNEL), ("attention", cpu_attention.KERNEL)):
        lib, why = kernel.library()
        parts.append(f"{what} {kernel.best()}" + ("" if lib is not None else f" (the C kernel is not used: {why})"))
    return "the cpu backend's forms: " + ", ".join(parts)


def check(names: list[str], device: str, quick: bool = False, verbose: bool = False) -> int:
    """Run the suite for the backends `names` on `device` and print it; 0 when every case passed."""
    interpreted = interpret_triton_on_cpu(device)
    loaded = parity.load_backends(names, device)
    unavailable = {n: b for n, b in loaded.items() if isinstance(b, str)}
    running = {n: b for n, b in loaded.items() if not isinstance(b, str)}
    notes = []
    if "triton" in running and interpreted:
        notes.append("triton runs in Triton's interpreter on the CPU (TRITON_INTERPRET=1)")
    if device == "cpu":
        notes.append(cpu_forms())
    counts = ", ".join(f"{len(parity.cases(device, quick, parity.ops_for(n)))} for {n}" for n in running)
    print(f"ablate kernels check on {device}: cases {counts or 'none (no backend runnable)'}"
          + (f"; {'; '.join(notes)}" if notes else ""), flush=True)

    def progress(row):
        if verbose:
            state = "ok  " if row.passed else "FAIL"
            detail = row.error or f"fwd {row.fwd_err:.2e} bwd {row.bwd_err:.2e}"
            print(f"  {state} {row.backend:<7} {row.case.id:<44} {detail} ({row.seconds:.2f}s)", flush=True)

    rows = parity.run_suite(running, device, quick=quick, progress=progress)
    print(parity.format_table(rows, unavailable))
    if not running:
        print("no kernel backend can run here", file=sys.stderr)
        return 1
    failed = sum(not r.passed for r in rows)
    print(f"{len(rows) - failed}/{len(rows)} cases passed" + (f", {failed} FAILED" if failed else ""))
    return 1 if failed else 0
