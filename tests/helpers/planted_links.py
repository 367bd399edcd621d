"""Links planted where a command will write, each to a victim file of its own: the tests that
outputs are written without following links share this set-up."""
from __future__ import annotations

from pathlib import Path

KEPT = "keep me\n"


def plant_links(victim_dir: Path, paths: list[Path]) -> dict[Path, Path]:
    """A link at each output path, to a victim file of its own; returns link -> victim."""
    links = {}
    for i, path in enumerate(paths):
        victim = victim_dir / f"victim-{i}"
        victim.write_text(KEPT)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.symlink_to(victim)
        links[path] = victim
    return links


def victims_untouched(links: dict[Path, Path]) -> bool:
    return all(victim.read_text() == KEPT for victim in links.values())
