"""ablate/grid/progress.py: a finished cell's line and the bar's counts, in the run-status words
ablate/core/rundir.py declares."""
from ablate.core.rundir import CELL_BUSY, CELL_SKIPPED, COMPLETED, DIVERGED, FAILED
from ablate.grid.progress import Progress, describe_result


class _Bar:
    text = ""

    def set_postfix_str(self, text, refresh=True):
        self.text = text


def test_the_bar_counts_completed_and_diverged_cells_as_done():
    progress = Progress("g", 5, 1, quiet=True)
    progress.bar = _Bar()
    progress.counts.update({COMPLETED: 2, DIVERGED: 1, FAILED: 1, CELL_BUSY: 1})
    progress._postfix()
    assert progress.bar.text == "done=3 running=0 failed=1 busy=1"


def test_a_finished_line_names_the_status_and_a_busy_or_skipped_cell():
    assert describe_result(CELL_BUSY, None) == (CELL_BUSY, "running in another process")
    status, detail = describe_result(CELL_SKIPPED, {"status": DIVERGED, "diverged_at_step": 7})
    assert status == DIVERGED and detail == "already finished: diverged at step 7"
