"""The one reader of JSON and TOML files: whatever a file holds, it returns the value its caller
asked for or raises UnreadableFile with one line naming the file; it never blocks on a FIFO,
never reads a device, and lets no RecursionError, OverflowError or MemoryError out."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ablate.core.bounded_read import (INPUT_BYTES, LINE_BYTES, MAX_DEPTH, STATE_BYTES, UnreadableFile, bounded_lines,
                                      open_bounded, read_json, read_toml)
from ablate.core.errors import ConfigError

DAMAGED_JSON = {
    "nested lists": "[" * 5000 + "]" * 5000,
    "nested objects": '{"a":' * 3000 + "1" + "}" * 3000,
    "just past the depth": "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "1e999": '{"seconds": 1e999}',
    "-1e999": '{"seconds": -1e999}',
    "Infinity": '{"seconds": Infinity}',
    "NaN": '{"seconds": NaN}',
    "400 digits": '{"seconds": ' + "9" * 400 + "}",
    "5000 digits": '{"seconds": ' + "9" * 5000 + "}",
    "not JSON": '{"seconds": ',
    "empty": "",
}


def one_line(e: Exception) -> str:
    text = str(e)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("name", sorted(DAMAGED_JSON))
def test_damaged_json_is_refused_in_one_line_naming_the_file(name, tmp_path):
    path = tmp_path / "state.json"
    path.write_text(DAMAGED_JSON[name])
    with pytest.raises(UnreadableFile) as e:
        read_json(path)
    assert one_line(e.value).startswith(f"{path} cannot be read (")
    assert isinstance(e.value, ConfigError)  # the CLI's one line, exit 2


def test_bytes_that_are_not_text_are_refused(tmp_path):
    path = tmp_path / "state.json"
    path.write_bytes(b'{"a": "\xff\xfe"}')
    with pytest.raises(UnreadableFile, match="cannot be read"):
        read_json(path)


@pytest.mark.parametrize("text, top, kind", [("[1]", dict, "list"), ('"s"', dict, "string"), ("3", dict, "number"),
                                             ("null", dict, "null"), ("{}", list, "object")])
def test_the_top_level_type_is_the_callers(text, top, kind, tmp_path):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(UnreadableFile, match=f"holds a JSON {kind}, where an? "):
        read_json(path, top=top)


def test_good_json_reads_as_json_does(tmp_path):
    value = {"a": [1, 2.5, -3, None, True, "é"], "b": {"c": [[[]]]}, "big": 2 ** 1000, "tiny": 1e-300}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(value, indent=2))
    assert read_json(path) == value
    assert read_json(path, top=None) == value
    path.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert read_json(path, top=list)


def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    # In a child under a timeout: a reader that blocks fails the test instead of hanging it.
    code = ("import sys; from ablate.core.bounded_read import read_json, read_toml, UnreadableFile\n"
            "for read in (read_json, read_toml):\n"
            "    try: read(sys.argv[1])\n"
            "    except UnreadableFile as e: print(e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{fifo} cannot be read (a FIFO, not a regular file)"] * 2


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_never_read(device, tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(device)
    for path in (Path(device), link):
        with pytest.raises(UnreadableFile, match=r"cannot be read \(a device, not a regular file\)"):
            read_json(path)
        with pytest.raises(UnreadableFile, match="a device, not a regular file"):
            read_toml(path)


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(UnreadableFile, match="a folder, not a regular file"):
        read_json(tmp_path)


def test_a_link_is_refused_where_the_caller_follows_none(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert read_json(tmp_path / "link.json") == {}
    with pytest.raises(UnreadableFile, match="a symbolic link, not a regular file"):
        read_json(tmp_path / "link.json", follow_links=False)


def test_a_missing_file_is_not_a_damaged_one(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "none.json")
    with pytest.raises(FileNotFoundError):
        open_bounded(tmp_path / "none.json")


def test_a_file_over_its_cap_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(STATE_BYTES + 1)
    with pytest.raises(UnreadableFile, match=r"larger than the 4 MiB such a file may hold"):
        read_json(path)
    path.write_text('"' + "x" * 100 + '"')
    assert read_json(path, top=str, limit=102) == "x" * 100
    with pytest.raises(UnreadableFile, match="larger than the 101 bytes"):
        read_json(path, top=str, limit=101)


GOOD_TOML = 'name = "g"\n[base]\nlr = 0.001\nsteps = 2\n[axes]\nseed = [0, 1]\n'


def test_good_toml_reads_as_tomllib_does(tmp_path):
    import tomllib

    path = tmp_path / "g.toml"
    path.write_text(GOOD_TOML)
    assert read_toml(path) == tomllib.loads(GOOD_TOML)


@pytest.mark.parametrize("text", ["a = " + "[" * 3000 + "]" * 3000, "a = inf", "a = nan", "a = 1e999",
                                  "a = " + "9" * 400, "a = " + "9" * 5000, "a = [", "[base\n"])
def test_damaged_toml_is_refused_in_one_line(text, tmp_path):
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(UnreadableFile) as e:
        read_toml(path)
    assert one_line(e.value).startswith(f"{path} cannot be read (")


def test_toml_that_is_not_utf8_or_too_large_is_refused(tmp_path):
    path = tmp_path / "g.toml"
    path.write_bytes(b'name = "\xff"\n')
    with pytest.raises(UnreadableFile, match="not UTF-8"):
        read_toml(path)
    with open(path, "wb") as f:
        f.truncate(INPUT_BYTES + 1)
    with pytest.raises(UnreadableFile, match="larger than the 1 MiB"):
        read_toml(path)


def test_lines_longer_than_the_cap_are_passed_over_in_pieces(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 0}\n' + b"x" * 50 + b"\n" + b"y" * 10 + b"\n" + b"z" * 11 + b'\n{"step": 1}')
    with open(path, "rb") as f:
        assert list(bounded_lines(f, limit=11)) == [b'{"step": 0}\n', None, b"y" * 10 + b"\n", b"z" * 11 + b"\n",
                                                    b'{"step": 1}']
    assert LINE_BYTES >= 1 << 16  # a harness row is far below it


def test_line_lengths_are_kept_across_pieces_and_long_lines(tmp_path):
    from ablate.core.bounded_read import sized_lines

    long_row, huge = b'{"k": "' + b"x" * 200_000 + b'"}\n', b"y" * 300_000 + b"\n"
    path = tmp_path / "m.jsonl"
    path.write_bytes(long_row + huge + b"tail")
    with open(path, "rb") as f:
        assert list(sized_lines(f, limit=250_000)) == [(long_row, len(long_row)), (None, len(huge)), (b"tail", 4)]


def test_a_small_file_is_read_without_setting_its_cap_aside(tmp_path):
    """read(limit) would allocate the whole cap (64 MiB for grid.json) for a file of a few bytes."""
    import tracemalloc

    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    tracemalloc.start()
    try:
        assert read_json(path, limit=64 << 20) == {"a": 1}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


@pytest.mark.parametrize("text, said", [('{"a": {"lr": NaN}}', "a.lr = nan, which is no finite number"),
                                        ('{"a": [1, 2, 1e999]}', "a[2] = inf, which is no finite number"),
                                        ("-Infinity", "the value = -inf"),
                                        ('{"n": ' + "9" * 400 + "}", "n is an integer too large for a number")])
def test_a_number_that_is_not_finite_is_named_where_it_sits(text, said, tmp_path):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(UnreadableFile) as e:
        read_json(path, top=None)
    assert said in str(e.value)


def test_metrics_rows_may_hold_nan_where_the_caller_allows_it():
    from ablate.core.bounded_read import parse_json

    assert parse_json(b'{"step": 1, "loss": NaN}', finite=False)["step"] == 1
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json("[" * 5000 + "]" * 5000, top=None, finite=False)
