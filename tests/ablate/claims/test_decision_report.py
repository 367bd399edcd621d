"""The decision report's plot (ablate/claims/decision_report.py): one panel a clause, one legend
naming every line any panel drew."""
from dataclasses import replace

import numpy as np

import ablate.claims.decision_report as report
from ablate.claims.claim_file import parse_claim
from ablate.claims.sequential import decide_results
from ablate.claims.spending import LOOKS
from ablate.claims.verdict import Result


def _compare(entry):
    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g",
                        "clause": [{"sentence": "s", "label": "l", "compare": [entry]}]}).clauses[0].compare[0]


def test_the_legend_names_a_line_only_a_later_panel_drew(tmp_path, monkeypatch):
    # (a) a failure share read against its bound: no futility statistic, so its panel draws no
    # "no effect as large" line; (b) a loss with an effect of interest draws one
    share = replace(_compare({"measure": "failed", "a": {"norm": "post"}, "expect": "lower", "than": 0.25,
                              "effect": 0.1}), effect=None)
    loss = _compare({"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher",
                     "effect": 0.5})
    claim = parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
        {"sentence": "s0", "label": "share", "compare": [{"measure": "failed", "a": {"norm": "post"},
                                                          "expect": "lower", "than": 0.25, "effect": 0.1}]},
        {"sentence": "s1", "label": "loss", "compare": [{"measure": "final_val_loss", "a": {"norm": "post"},
                                                         "b": {"norm": "pre"}, "expect": "higher", "effect": 0.5}]}]})
    seeds = tuple(range(LOOKS[-1]))
    shares = tuple([-0.25] * LOOKS[-1])
    losses = tuple(np.random.default_rng(0).normal(0.1, 0.3, LOOKS[-1]))
    decision = decide_results(claim, [[Result(share, "share failed", seed_values=shares, seed_ids=seeds)],
                                      [Result(loss, "nats", seed_values=losses, seed_ids=seeds)]])
    legends = []

    def saved(fig, path, dpi):
        legends.append([text.get_text() for ax in fig.axes if ax.get_legend() for text in ax.get_legend().get_texts()])

    monkeypatch.setattr(report, "save_figure", saved)
    assert report.plot_running_statistic(decision, tmp_path / "p.png") is not None
    assert legends == [["agrees", "boundary", "no effect as large"]]
