"""What the SLURM backend asks SLURM's own command-line tools: is a request acceptable
(`sbatch --test-only`, the partition's MaxTime), and what state are our jobs in (`squeue`).

No accounting database is assumed (`sacct` needs slurmdbd, which small clusters and
scripts/slurm-local.sh do not run): job states come from `squeue --states=all`, which lists a
finished job for MinJobAge seconds; a job it no longer lists has ended.
"""
from __future__ import annotations

import getpass
import math
import re
import subprocess

from ablate.core.errors import ConfigError

# Job states in which a job may still run (or is running, or is being requeued). Anything else
# squeue prints (COMPLETED, CANCELLED, TIMEOUT, FAILED, NODE_FAIL, OUT_OF_MEMORY, ...) is final.
FINAL_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                          "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"})


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _sbatch_errors(text: str) -> str:
    """sbatch's complaint, one line: 'sbatch: error: X' and 'allocation failure: Y' lines."""
    found = []
    for line in text.splitlines():
        line = re.sub(r"^(sbatch: error:|allocation failure:|sbatch:)\s*", "", line.strip())
        if line and line not in found:
            found.append(line)
    return "; ".join(found)[:300] or "no reason given"


def check_request(sbatch_flags: dict[str, str], shown: str) -> None:
    """Refuse (ConfigError, before anything is written) a request this cluster would not run:
    `sbatch --test-only` with the same resources, plus the partition's MaxTime, which SLURM
    itself only enforces when its admin set EnforcePartLimits (otherwise the array would wait
    forever as PartitionTimeLimit). `shown` names the flags for the message."""
    argv = ["sbatch", "--test-only", *(f"--{k}={v}" for k, v in sbatch_flags.items()), "--wrap", "true"]
    try:
        proc = _run(argv)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"--backend slurm: sbatch does not answer ({e}); valid: a working SLURM "
                          "(sinfo should list its nodes)") from None
    if proc.returncode != 0:
        raise ConfigError(f"SLURM refuses {shown}: {_sbatch_errors(proc.stderr + proc.stdout)}")
    name, limit = partition_max_minutes(sbatch_flags.get("partition"))
    minutes = int(sbatch_flags.get("time", 0))
    if limit is not None and minutes > limit:
        raise ConfigError(f"--time {minutes} exceeds the MaxTime of partition {name} ({limit} min); "
                          f"valid: --time 1 to {limit}, or another --partition")


def parse_seconds(text: str) -> float | None:
    """A SLURM duration ('0:39', '12:00', '2:00:00', '1-00:00:00') in seconds; None otherwise."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        if not d.isdigit():
            return None
        days = int(d)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return float(days * 86400 + seconds)


def parse_minutes(text: str) -> int | None:
    """A SLURM time limit ('30:00', '2:00:00', '1-12:00:00', '45', 'infinite') in whole minutes,
    rounded up; None when unlimited or unreadable. Unlike squeue's durations, a bare number here
    is minutes."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    seconds = parse_seconds(text)
    return None if seconds is None else math.ceil(seconds / 60)


def partition_max_minutes(partition: str | None) -> tuple[str | None, int | None]:
    """(name, MaxTime in minutes) of `partition` (None: the default one, marked * by sinfo);
    MaxTime None when unlimited or unknown."""
    try:
        proc = _run(["sinfo", "-h", "-o", "%P|%l"])
    except (OSError, subprocess.TimeoutExpired):
        return partition, None
    for line in proc.stdout.splitlines():
        name, _, limit = line.strip().partition("|")
        if (partition is None and name.endswith("*")) or name.rstrip("*") == partition:
            return name.rstrip("*"), parse_minutes(limit)
    return partition, None


def job_states() -> dict[str, str] | None:
    """{job id ('123_4' for an array task): state} for this user's jobs that SLURM still knows
    (running, pending, requeued, or finished within MinJobAge). None when squeue fails: the
    caller must not conclude from a failed query that a job has ended."""
    try:
        proc = _run(["squeue", "-h", "-r", "--states=all", "-u", getpass.getuser(), "-o", "%i|%T"], timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    states = {}
    for line in proc.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id:
            states[job_id] = state.split()[0] if state else "UNKNOWN"
    return states


def is_active(state: str | None) -> bool:
    """Whether a job in `state` (None: not listed) may still run its cell."""
    return state is not None and state not in FINAL_STATES
