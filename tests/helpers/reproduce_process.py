"""`python tests/helpers/reproduce_process.py ARGS...` is `ablate ARGS...` with the time estimates from
ablate.bench.estimate.reference, as tests/conftest.py sets for in-process tests: a test's own
process never calibrates this machine's speed (minutes under load) for a line it prints."""
import sys

from ablate.bench import estimate
from ablate.cli import main

if __name__ == "__main__":
    estimate.machine_speed = lambda threads=1, quiet=False: estimate.reference(threads)
    sys.exit(main(sys.argv[1:]))
