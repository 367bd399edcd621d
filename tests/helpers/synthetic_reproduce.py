"""`python tests/helpers/synthetic_reproduce.py ARGS...` is reproduce_process.py's `ablate ARGS...`
(reference time estimates) with every cell trained by a synthetic trainer: the real run_cell
(plan, lock, skip, resume) around a stand-in for ablate.engine.train.train that writes the run
folder the real one would (config.json, metrics.jsonl, summary.json) in a fraction of a second.

Each seed of each arm (the variant's norm) has its own edge of stability, `edge(norm, seed)`
(log10 of a rate, deterministic): a cell trains when log10(lr) lies below its edge, sits on the
unigram plateau a little above it and diverges far above it, so `largest_stable_lr` reads the
edge to the ladder's rung and varies from seed to seed. Run it with `--workers 0`, so the cells
train in this process (where the stand-in is installed) and a kill lands on them."""
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import ablate.engine.train
from ablate.bench import estimate
from ablate.cli import main
from ablate.core.rundir import COMPLETED, CONFIG, DIVERGED, METRICS, SUMMARY, run_summary, write_json_atomic
from ablate.engine.lr import lr_at
from ablate.engine.train import plan_run, run_config

# log10 of each arm's edge of stability, by the variant's norm, and how far a seed's edge strays
# from it (either way): on a 1e-3, 3e-3, 1e-2 ladder post-norm trains at 1e-3 in most seeds and at
# none in some, pre-norm at 3e-3 in most seeds and at every rate in some (seeds 0-5: pre-norm's
# largest stable rate lies a rung or more above post-norm's in each).
EDGES = {"post": -2.8, "pre": -2.2}
SPREAD = 0.3
PLATEAU_DECADES = 0.4  # above the edge by at most this: the run ends on the plateau, else it diverges
SECONDS = 0.2  # a cell's "training": long enough for a kill to land in a look
PLATEAU = 3.2  # nats: the unigram entropy where the data records none (token shards)


def edge(norm: str, seed: int) -> float:
    """log10 of the seed's edge of stability for an arm: EDGES[norm] moved by up to SPREAD."""
    u = int(hashlib.sha256(f"{norm}-{seed}".encode()).hexdigest()[:8], 16) / 16 ** 8
    return EDGES[norm] + SPREAD * (2 * u - 1)


def losses(cfg, entropy: float) -> tuple[list[float], float | None, int | None]:
    """(training loss per step, final validation loss, diverged at step) of the cell `cfg`."""
    above = math.log10(cfg.lr) - edge(cfg.spec.norm, cfg.seed)
    start = math.log(cfg.size.vocab_size)  # a model at initialisation: uniform over the vocabulary
    if above > PLATEAU_DECADES:  # blows up: the loss passes twice the first on the third step
        curve = [start, start + 1.0, 2.5 * start]
        return curve, None, len(curve) - 1
    end = entropy + 0.05 if above >= 0 else entropy - 0.6 - 0.1 * (cfg.seed % 3)  # plateau, or trained
    curve = [end + (start - end) * 0.5 ** step for step in range(cfg.steps)]
    return curve, end + 0.02, None


def synthetic_train(cell, run_dir, quiet=True, plan=None, after_step=None) -> dict:
    """ablate.engine.train.train's stand-in: config.json first (as the real trainer writes it
    before its first step), SECONDS of "training", then the metrics and the summary."""
    run_dir = Path(run_dir)
    plan = plan if plan is not None else plan_run(cell, run_dir=run_dir)
    cfg, data = plan.cfg, plan.data
    # params=0: no model is built
    config = run_config(cell, cfg, plan.size, data, plan.device, plan.ops.name, params=0, threads=plan.threads,
                        flush_denormal=plan.flush)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / CONFIG, config)
    time.sleep(SECONDS)
    curve, val, diverged_at = losses(cfg, data.unigram_entropy or PLATEAU)
    tokens = cfg.batch_size * cfg.context
    rows = []
    for step, loss in enumerate(curve):
        row = {"step": step, "tokens": (step + 1) * tokens, "loss": loss, "lr": lr_at(step, cfg),
               "time_s": SECONDS * (step + 1) / len(curve), "tokens_per_s": tokens / 0.01}
        if diverged_at is None and (step == len(curve) - 1 or (step + 1) % cfg.eval_every == 0):
            row["val_loss"] = val if step == len(curve) - 1 else loss + 0.02
        rows.append(row)
    (run_dir / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = run_summary(DIVERGED if diverged_at is not None else COMPLETED,
                          final_loss=sum(curve[-10:]) / len(curve[-10:]) if diverged_at is None else None,
                          final_val_loss=val, diverged_at_step=diverged_at, steps=len(curve), wall_time_s=SECONDS)
    write_json_atomic(run_dir / SUMMARY, summary)
    return summary


if __name__ == "__main__":
    estimate.machine_speed = lambda threads=1, quiet=False: estimate.reference(threads)
    ablate.engine.train.train = synthetic_train  # run_cell imports it when it runs a cell
    sys.exit(main(sys.argv[1:]))
