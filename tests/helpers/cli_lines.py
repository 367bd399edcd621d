"""What the CLI error tests share: a short `ablate train` command line, the cell it trains, and
the check that an error is one line without a traceback."""

BASE = ["train", "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
        "--device", "cpu", "--threads", "1", "--quiet"]

CELL = "pre.layernorm.gelu.dense.res__batch_size=2__seq_len=16__steps=3__seed=0"


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err
