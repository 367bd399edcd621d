"""Packs' speed and the captured step's parity, for the device check (docs/performance.md).

    python -m ablate.bench.packs --widths 64,256 --members 1,8,32 --steps 50 [--captured]

For each width and pack size: one pack of that many seeds (12 blocks by default, `tiny`'s batch and
context, every step logged, `reference` kernels) trained into a temporary folder, and its
tokens/s per member (whole wall time, build and first steps included, so a short run
understates a pack) beside one cell trained alone. With --captured, each pack is trained twice,
eager and with its steps captured in CUDA graphs (ablate/engine/pack_graphs.py), and the largest
difference of their losses is printed: 0 means a replayed step is the eager step, bit for bit.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from ablate.core.counts import count, shown
from ablate.core.errors import ConfigError

MAX_MEMBERS = 1024  # `--members`: pack sizes past any device's memory at these widths; more is a typo
BASE = {"model": "tiny", "eval_every": 10**6, "eval_batches": 1, "final_eval_batches": 1,
        "kernels": "reference", "checkpoint_every": 10**6}


def cells(width: int, members: int, steps: int, device: str, layers: int) -> list:
    from ablate.engine.cell import Cell  # lazy: torch only when used

    return [Cell.from_options({**BASE, "width": width, "layers": layers, "steps": steps, "device": device, "seed": s})
            for s in range(members)]


def train_pack(group: list, out: Path, captured: bool) -> tuple[float, list[list[float]]]:
    """(seconds, each member's logged losses) of one pack trained into `out`."""
    import ablate.engine.pack_train as packs  # lazy: torch only when used
    from ablate.engine.train import plan_run

    saved, packs.CAPTURE_ON_CUDA = packs.CAPTURE_ON_CUDA, captured
    try:
        t0 = time.perf_counter()
        packs.train_pack(group, [plan_run(c, None, out / c.id) for c in group])
        seconds = time.perf_counter() - t0
    finally:
        packs.CAPTURE_ON_CUDA = saved
    losses = [[json.loads(line)["loss"] for line in (out / c.id / "metrics.jsonl").read_text().splitlines()]
              for c in group]
    return seconds, losses


def train_alone(cell, out: Path) -> float:
    from ablate.engine.train import train  # lazy: torch only when used

    t0 = time.perf_counter()
    train(cell, out / cell.id)
    return time.perf_counter() - t0


def largest_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max((abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if x is not None and y is not None),
               default=0.0)


def run(widths: list[int], sizes: list[int], steps: int, captured: bool, device: str, layers: int = 12) -> list[str]:
    lines = []
    with tempfile.TemporaryDirectory(prefix="ablate-packs-") as tmp:
        root = Path(tmp)
        for width in widths:
            lone = cells(width, 1, steps, device, layers)[0]
            tokens = lone.config.batch_size * lone.config.context * steps
            alone = train_alone(lone, root / f"alone-{width}")
            lines.append(f"width {width}: one cell alone {tokens / alone:,.0f} tokens/s")
            print(lines[-1], flush=True)
            for k in sizes:
                group = cells(width, k, steps, device, layers)
                seconds, eager = train_pack(group, root / f"eager-{width}-{k}", False)
                line = (f"width {width}, pack of {k}: {tokens / seconds:,.0f} tokens/s a member, "
                        f"{k * tokens / seconds:,.0f} in all ({k * alone / seconds:.2f}x cells alone)")
                if captured:
                    seconds, replayed = train_pack(group, root / f"captured-{width}-{k}", True)
                    line += (f"; captured {k * tokens / seconds:,.0f} in all, losses within "
                             f"{largest_difference(eager, replayed):.3g} of eager")
                lines.append(line)
                print(line, flush=True)
    return lines


def whole_numbers(low: int, ceiling: int, single: bool = False):
    """`type=` for a comma-separated list of whole numbers in low..ceiling (`single`: one number,
    returned as it is); one line otherwise."""
    one = count(low, ceiling)

    def parse(text: str) -> list[int]:
        values = [one(part) for part in str(text).split(",")]
        if min(values) < low or (single and len(values) > 1):
            raise argparse.ArgumentTypeError(f"{shown(text)} is not {'a whole number' if single else 'whole numbers'}"
                                             f" in {low}..{ceiling}; valid: {'one number' if single else 'comma-separated'}"
                                             f" in {low}..{ceiling}")
        return values[0] if single else values
    return parse


def main(argv: list[str] | None = None) -> int:
    from ablate.engine.config import MAX_LAYERS, MAX_STEPS, MAX_WIDTH  # lazy: torch only when used

    p = argparse.ArgumentParser(prog="python -m ablate.bench.packs", description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", type=whole_numbers(1, MAX_WIDTH), default="64,256", help="model widths (default 64,256)")
    p.add_argument("--members", type=whole_numbers(1, MAX_MEMBERS), default="1,8,32",
                   help="pack sizes (default 1,8,32)")
    p.add_argument("--steps", type=whole_numbers(1, MAX_STEPS, True), default=50, help="steps a run (default 50)")
    p.add_argument("--captured", action="store_true", help="also train each pack with its steps captured (CUDA)")
    p.add_argument("--device", default="auto", help="auto (default), cuda or cpu")
    p.add_argument("--layers", type=whole_numbers(1, MAX_LAYERS, True), default=12,
                   help="blocks (default 12, as the claims' cells)")
    args = p.parse_args(argv)
    steps, layers = args.steps, args.layers
    try:  # every width's cell checked (device, sizes) before the first is trained
        for width in args.widths:
            cells(width, 1, steps, args.device, layers)
    except ConfigError as e:
        p.error(str(e))
    run(args.widths, args.members, steps, args.captured, args.device, layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
