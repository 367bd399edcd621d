"""Every command README.md and docs/*.md show is one the program accepts.

The commands are the lines of the fenced code blocks: a `$ ` line in any block, every line
of a `sh`/`bash`/`shell` block. Each `ablate ...` (or `python -m ablate ...`) in them is
either run for real, in this process and in a temporary folder, when it is cheap (listing,
`--dry-run`, `status`, `--help`), or parsed by the real command-line parser without running
it (training, reproducing claims, cluster submission, benchmarks), so that a misspelled
command or option in a page fails here. A shown `pip install -e '.[EXTRA]'` must name an
extra of pyproject.toml, and a shown `scripts/...` call a script that takes that subcommand.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.repo import REPO
from tests.helpers.synthetic_runs import write_grid, write_run

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCKS = {"sh", "bash", "shell"}   # every line a command; elsewhere only `$ ` lines are
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
OPERATORS = {"&&", "||", ";", "|", "&"}
ELIDED = "..."


@dataclass(frozen=True)
class Block:
    doc: str      # path relative to the repository
    line: int     # of the opening fence, 1-based
    lang: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Shown:
    """One command as a page shows it, with the output lines printed under it."""
    doc: str
    line: int
    argv: tuple[str, ...]
    output: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.argv)}"


# ------------------------------------------------------------------------------ extraction


def fenced_blocks(text: str, doc: str) -> list[Block]:
    blocks, open_fence, start, lang, body = [], None, 0, "", []
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if open_fence is None and m:
            open_fence, start, lang, body = m.group(1), number, m.group(2).lower(), []
        elif open_fence is not None and line.strip().startswith(open_fence) and not line.strip().strip(open_fence[0]):
            blocks.append(Block(doc, start, lang, tuple(body)))
            open_fence = None
        elif open_fence is not None:
            body.append(line)
    return blocks


def segments(command: str) -> list[list[str]]:
    """`a && b | c # comment` -> [[a], [b], [c]]: the simple commands of a shell line."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in OPERATORS:
            out.append([])
        else:
            out[-1].append(token)
    return [s for s in out if s]


def commands_in(block: Block) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, command text, output lines shown under it) for each command of a block."""
    found: list[tuple[int, str, list[str]]] = []
    pending = ""
    for offset, raw in enumerate(block.lines, 1):
        line = raw.rstrip()
        if pending:
            line, pending = pending + " " + line.lstrip(), ""
        if line.startswith("$ "):
            text = line[2:]
        elif block.lang in SHELL_BLOCKS and line.strip() and not line.lstrip().startswith("#"):
            text = line.strip()
        else:
            if found and line.strip():
                found[-1][2].append(line)
            continue
        if text.endswith("\\"):
            pending = ("$ " if line.startswith("$ ") else "") + text[:-1]
            continue
        found.append((block.line + offset, text, []))
    return [(n, text, tuple(out)) for n, text, out in found]


def ablate_argv(words: list[str]) -> tuple[str, ...] | None:
    if words[0] == "ablate":
        return tuple(words[1:])
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1:3] == ["-m", "ablate"]:
        return tuple(words[3:])
    return None


def shown_commands(docs=DOC_FILES) -> tuple[list[Shown], list[tuple[str, int, list[str]]]]:
    """The ablate commands of every page, and every other simple command (doc, line, words)."""
    ablate, other = [], []
    for path in docs:
        doc = str(path.relative_to(REPO))
        for block in fenced_blocks(path.read_text(), doc):
            for line, text, output in commands_in(block):
                for words in segments(text):
                    argv = ablate_argv(words)
                    if argv is not None:
                        ablate.append(Shown(doc, line, argv, output))
                    else:
                        other.append((doc, line, words))
    return ablate, other


def unfenced_commands(text: str) -> list[str]:
    """Command lines outside any fenced block (an indented code block): the checks would miss them."""
    inside, found = None, []
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and inside is None:
            inside = m.group(1)
        elif inside is not None and line.strip().startswith(inside):
            inside = None
        elif inside is None and re.match(r"^\s{4,}(\$ )?(ablate|python3? -m ablate)\s", line):
            found.append(line.strip())
    return found


def grid_files_shown() -> dict[str, str]:
    """`NAME.toml` -> text, for every TOML block of the pages that is a grid (it has axes)."""
    grids = {}
    for path in DOC_FILES:
        for block in fenced_blocks(path.read_text(), str(path)):
            if block.lang == "toml":
                text = "\n".join(block.lines)
                data = tomllib.loads(text)
                if "axes" in data:
                    grids[f"{data['name']}.toml"] = text
    return grids


# ------------------------------------------------------------------------------ the checks


ABLATE, OTHER = shown_commands()


def runs_for_real(argv: tuple[str, ...]) -> bool:
    """Cheap enough to run here: it lists, plans or reads, and trains nothing."""
    command, rest = argv[0], argv[1:]
    if "--help" in rest or "-h" in rest:
        return True
    if command == "grid":
        return "--list" in rest or "--dry-run" in rest
    return command == "status" and "--watch" not in rest


def parse(argv: tuple[str, ...]) -> None:
    """The real parser, without running the command: argparse's exit (2) on an unknown
    command, option or choice becomes a test failure naming it."""
    from ablate.cli import build_parser

    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
            build_parser(only=argv[0]).parse_args(list(argv))
    except SystemExit as e:
        if e.code not in (0, None):
            pytest.fail(f"the parser refuses `ablate {shlex.join(argv)}` (exit {e.code}): {said.getvalue().strip()}")


def shipped(kind: str) -> set[str]:
    return {p.stem for p in (REPO / "variants" / kind).glob("*.toml")}


def check_names(argv: tuple[str, ...]) -> None:
    """Names the parser takes as any string: a shipped grid, a claim."""
    positional = [a for a in argv[1:2] if not a.startswith("-")]
    if argv[0] == "grid" and positional and not positional[0].endswith(".toml"):
        assert positional[0] in shipped("grids"), f"no shipped grid {positional[0]!r}"
    if argv[0] == "reproduce" and positional:
        assert positional[0] in shipped("claims") | {"all"}, f"no claim {positional[0]!r}"


def prepare(argv: tuple[str, ...], folder: Path) -> None:
    """What a cheap command reads: the grid file a page shows, a grid folder to report on."""
    if argv[0] == "grid" and len(argv) > 1 and argv[1].endswith(".toml"):
        grids = grid_files_shown()
        assert argv[1] in grids, f"{argv[1]} is not a grid file any page shows"
        (folder / argv[1]).write_text(grids[argv[1]])
    if argv[0] == "status":
        target = folder / argv[-1]
        if not target.exists():
            cells = [write_run(target, seed=seed) for seed in (0, 1)]
            write_grid(target, cells, name=target.name, pending=["post.layernorm.gelu.dense.res__seed=0"])


def run(argv: tuple[str, ...], folder: Path, capsys) -> str:
    from ablate.cli import main

    prepare(argv, folder)
    try:
        status = main(list(argv))
    except SystemExit as e:  # --help
        status = e.code or 0
    out, err = capsys.readouterr()
    assert status == 0, f"`ablate {shlex.join(argv)}` exited {status}: {err.strip()}"
    return out


def independent_of_the_folder(argv: tuple[str, ...]) -> bool:
    """Its output is the program's own (a listing), not what this test's folder holds."""
    return argv == ("grid", "--list")


@pytest.mark.parametrize("shown", ABLATE, ids=str)
def test_every_ablate_command_shown_is_accepted(shown: Shown, tmp_path, monkeypatch, capsys):
    check_names(shown.argv)
    if not runs_for_real(shown.argv):
        parse(shown.argv)
        return
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    out = run(shown.argv, tmp_path, capsys)
    if independent_of_the_folder(shown.argv):
        printed = {line.rstrip() for line in out.splitlines()}
        missing = [line for line in shown.output if line.strip() != ELIDED and line.rstrip() not in printed]
        assert not missing, f"{shown}: the page shows lines the command does not print: {missing[:3]}"


def test_the_pages_show_commands_and_the_cheap_ones_run():
    real = [s for s in ABLATE if runs_for_real(s.argv)]
    assert len(ABLATE) >= 30 and len(real) >= 4, (len(ABLATE), len(real))
    readme = [s.argv for s in ABLATE if s.doc == "README.md"]
    assert ("reproduce", "identity-init", "--decide") in readme  # the quick start's main job


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_every_command_line_is_in_a_fenced_block(doc: Path):
    assert unfenced_commands(doc.read_text()) == []


def test_pip_extras_and_scripts_shown_exist():
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    checked = 0
    for doc, line, words in OTHER:
        if words[:2] == ["pip", "install"] and "-e" in words:
            spec = words[words.index("-e") + 1]
            wanted = set(re.findall(r"\[(.*)\]", spec)[0].split(",")) if "[" in spec else set()
            assert wanted <= extras, f"{doc}:{line}: no extra {wanted - extras} in pyproject.toml"
            checked += 1
        script = next((w for w in words if w.startswith("scripts/")), None)
        if script:
            path = REPO / script
            assert path.is_file(), f"{doc}:{line}: {script} does not exist"
            after = words[words.index(script) + 1:]
            if after:
                assert re.search(rf"^\s*{re.escape(after[0])}\)", path.read_text(), re.MULTILINE), \
                    f"{doc}:{line}: {script} has no subcommand {after[0]!r}"
            checked += 1
    assert checked >= 3


# ------------------------------------------------------------------------ the check can fail


def test_a_misspelled_option_or_command_fails_the_check():
    for wrong in (("grid", "mission", "--dry-runn"), ("reproduce", "prenorm-wins", "--quik"), ("trian", "--steps", "1"),
                  ("grid", "mission", "--backend", "slurmm")):
        with pytest.raises(pytest.fail.Exception):
            parse(wrong)
    with pytest.raises(AssertionError):
        check_names(("reproduce", "prenorm-win", "--quick"))


def test_the_extraction_finds_prompts_shell_blocks_chains_and_unfenced_commands(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n```console\n$ ablate grid --list   # a comment\nshipped grids\n"
                    "$ pip install -e . && python -m ablate status runs/x\n```\n\n"
                    "```sh\nablate train --steps 3 \\\n  --lr 1e-3\ntensorboard --logdir x\n```\n\n"
                    "    $ ablate variants\n")
    doc = str(page.relative_to(tmp_path))
    blocks = fenced_blocks(page.read_text(), doc)
    commands = [(text, out) for block in blocks for _, text, out in commands_in(block)]
    assert commands[0] == ("ablate grid --list   # a comment", ("shipped grids",))
    words = [segments(text) for text, _ in commands]
    assert [ablate_argv(s) for group in words for s in group] == [
        ("grid", "--list"), None, ("status", "runs/x"), ("train", "--steps", "3", "--lr", "1e-3"), None]
    assert unfenced_commands(page.read_text()) == ["$ ablate variants"]
