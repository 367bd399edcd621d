"""`python tests/reproduce_process.py ARGS...` is `ablate ARGS...` with the time estimates from
ablate.speed.reference, as tests/conftest.py sets for in-process tests: a test's own process never
calibrates this machine's speed (minutes under load) for a line it prints."""
import sys

import ablate.speed
from ablate.cli import main

if __name__ == "__main__":
    ablate.speed.machine_speed = lambda threads=1, quiet=False, variants=(): ablate.speed.reference(threads)
    sys.exit(main(sys.argv[1:]))
