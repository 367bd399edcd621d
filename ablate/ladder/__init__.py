"""A claim at a ladder of model sizes: the rungs and how rates transfer (rungs.py), running them
(run.py), the effects across sizes with a trend (report.py, scaling.py, plots.py), and the
backtest of a held-out rung against a plan frozen before it trains (backtest.py)."""
