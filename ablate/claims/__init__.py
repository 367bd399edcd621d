"""A claim, from its file to its verdict: `ablate reproduce NAME` runs this package.

    claim file (variants/claims/NAME.toml)    claim_file.py: clauses, comparisons, rules
      |                                       selectors.py: each selector checked on the grid
      v
    grid (variants/grids/claim-NAME.toml)     design.py: the design's cells and seeds
      |                                       run.py: plan, estimate, run on the grid machinery
      v
    cells -> run folders (ablate.grid)        looks.py: --decide's looks, adding seeds; lock.py
      |
      v
    measures per cell                         claim_measures.py (registered by name)
      |                                       selection.py, rate_choice.py: each arm at its rate
      v
    per-seed values                           claim_checks.py: a clause's comparisons and notes
      |
      v
    tests                                     decide.py: the sign test over seeds, exact counts
      |                                       design_checks.py: could the design show it?
      v
    decision                                  verdict.py (a fixed design), sequential.py (looks)
      |
      v
    report and verdict.json                   claim_report.py, decision_report.py, claim_plots.py

The ladder (ablate.ladder) runs a claim at several model sizes beside this package.
"""
