"""Training one cell: its options (config.py, checked in ablate/core/checks.py), the model and
its probes, the data, the training loop (train.py), a cell (cell.py), and packs of cells that
differ only in seed trained as one stacked model (pack*.py)."""
