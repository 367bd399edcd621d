"""Ways to run a grid's cells besides local worker processes (ablate.scheduler).

Every backend calls the same idempotent cell function, `ablate.cell.run_cell`, on a shared
output folder, so skipping finished cells, locking running ones, resuming and grid.json
behave the same everywhere. Ray and submitit are optional extras, imported only when used.
"""
BACKENDS = ("local", "ray", "slurm")
