"""The Triton kernels compile for the GPU (sm_90), not only run in the interpreter.

The parity suite runs the Triton kernels under TRITON_INTERPRET=1 on a CPU, which never invokes
Triton's compiler; ablate.kernels.triton_aot compiles every specialization the launchers
produce to a cubin with Triton's real compiler and ptxas, with no GPU needed.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.repo import REPO

# Every test compiles with Triton's real compiler and ptxas: minutes on a CPU, so all are slow.
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
              pytest.mark.slow]

KERNELS_PY = REPO / "ablate" / "kernels" / "triton_kernels.py"


@pytest.fixture(scope="module")
def aot_run(tmp_path_factory):
    """`python -m ablate.kernels.triton_aot -v` in a fresh process, with an empty Triton cache
    (so every kernel is really compiled) and TRITON_INTERPRET unset."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    p = subprocess.run([sys.executable, "-m", "ablate.kernels.triton_aot", "--arch", "90", "-v"],
                       capture_output=True, text=True, env=env, timeout=600)
    return p.returncode, p.stdout + p.stderr


def test_every_specialization_compiles_for_sm90(aot_run):
    rc, out = aot_run
    summary = re.search(r"triton kernels for sm_90: (\d+)/(\d+) specializations compiled", out)
    assert summary, out
    ok, total = map(int, summary.groups())
    assert rc == 0 and ok == total, out
    # five activations x two dtypes x four elementwise kernels at least, and every norm flavour
    assert total >= 5 * 2 * 4 + 2 * 3 * 2 * 2, out


def test_every_kernel_in_the_module_is_driven(aot_run):
    """A kernel no launcher call reaches would never be compile-checked."""
    _, out = aot_run
    defined = set(re.findall(r"@triton\.jit\ndef (\w+_kernel)\(", KERNELS_PY.read_text()))
    compiled = set(re.findall(r"^\s+ok\s+(\w+)\[", out, flags=re.M))
    assert defined and compiled == defined, out


def test_both_dtypes_and_the_widest_norm_block_are_compiled(aot_run):
    _, out = aot_run
    assert re.search(r"ok\s+_act_fwd_kernel\[bf16;", out) and re.search(r"ok\s+_act_fwd_kernel\[fp32;", out), out
    # the pointer types: bfloat16 data, float32 weights and partial sums, the int32 counter
    assert re.search(r"ok\s+_norm_bwd_kernel\[bf16/fp32/i32;.*BLOCK=16384; warps=16\]", out), out


BROKEN = """
import json, sys
import triton
import triton.language as tl
from ablate.kernels.triton_aot import Launch, compile_launch

@triton.jit
def fill(X, BLOCK: tl.constexpr):
    tl.store(X + tl.arange(0, BLOCK), 1.0)

sig = {"X": "*fp32", "BLOCK": "constexpr"}
print(json.dumps({b: compile_launch(Launch(fill, sig, {"BLOCK": b}, {}), 90).error for b in (64, 48)}))
"""


def test_a_kernel_that_does_not_compile_is_reported_not_raised(tmp_path):
    """The failure path: a compile error becomes a FAIL row with the compiler's message.
    (In a fresh process: the interpreter of Triton < 3.8 patches triton.language in place.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    script = tmp_path / "broken_kernel.py"  # Triton reads a kernel's source from its file
    script.write_text(BROKEN)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    errors = json.loads(p.stdout.strip().splitlines()[-1])
    assert errors["64"] is None, errors
    assert errors["48"] and "power of 2" in errors["48"].lower(), errors
