"""`python tests/helpers/holding_reproduce.py FD ARGS...` is `ablate ARGS...` (with the reference
time estimates, as reproduce_process.py) whose first cell, instead of training, writes a line to
the inherited file descriptor FD and waits until the process is killed: a reproduce run that
holds its claim folder's lock (ablate/claims/lock.py) as long as a test needs, and says when it
does. Run it with `--workers 0`, so the cell is called in this process."""
import os
import signal
import sys

from ablate.backends import base
from ablate.bench import estimate
from ablate.cli import main


def holding(fd: int):
    def run_cell(cell, out_root, *args, **kwargs):
        os.write(fd, f"holding {cell.id}\n".encode())
        while True:
            signal.pause()
    return run_cell


if __name__ == "__main__":
    estimate.machine_speed = lambda threads=1, quiet=False: estimate.reference(threads)
    base.run_cell = holding(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
