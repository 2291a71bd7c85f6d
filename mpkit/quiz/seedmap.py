"""Where the lab teaches and drills each claim of the seed note: ``labs/seed_map.yaml`` as a table.

``seedmap.table()`` displays in a notebook as a Markdown table (one row per claim of the seed:
its section, the claim, the notebook and heading that teach it, other places, the O/X items);
``seedmap.claims()`` gives the same rows as dicts. ``tests/test_seed_map.py`` checks the map itself
(every claim mapped once, every heading exists, every item cites its section).
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

_TODO = "TODO"


def map_path(path=None) -> Path:
    """``path``, else ``$MPKIT_SEED_MAP``, else ``<repo>/labs/seed_map.yaml``."""
    if path is None:
        path = os.environ.get("MPKIT_SEED_MAP") or Path(__file__).resolve().parents[2] / "labs" / "seed_map.yaml"
    return Path(path)


def load(path=None) -> dict:
    """The parsed map; ``FileNotFoundError`` says where it was looked for."""
    path = map_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no seed map at {path}; pass path= or set MPKIT_SEED_MAP")
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def claims(path=None) -> list[dict]:
    """One dict per claim: section, source, claim, notebook, heading, also [(notebook, heading)], quiz_items."""
    rows = []
    for section in load(path).get("sections") or []:
        for claim in section.get("claims") or []:
            rows.append({
                "section": section["seed_heading"], "source": section.get("source", ""),
                "claim": claim["claim"], "notebook": claim["notebook"], "heading": claim["heading"],
                "also": [(a["notebook"], a["heading"]) for a in claim.get("also") or []],
                "quiz_items": list(claim.get("quiz_items") or []),
            })
    return rows


def _place(notebook, heading) -> str:
    heading = "(작성 중 / to come)" if heading == _TODO else heading.replace("|", "\\|")
    return f"**{notebook}** · {heading}"


class Table:
    """A Markdown table that Jupyter renders (``_repr_markdown_``); ``str()`` is the Markdown text."""

    def __init__(self, rows):
        self.rows = rows

    def markdown(self) -> str:
        lines = ["| 시드 절 / seed section | 주장 / claim | 배우는 곳 / taught in | 더 보기 / also | O/X |",
                 "|---|---|---|---|---|"]
        for row in self.rows:
            claim = row["claim"].rstrip(":").replace("|", "\\|")
            also = "<br>".join(_place(n, h) for n, h in row["also"]) or "—"
            lines.append(f"| {row['section'].rstrip(':')} | {claim} | {_place(row['notebook'], row['heading'])} "
                         f"| {also} | {', '.join(row['quiz_items']) or '—'} |")
        return "\n".join(lines)

    def _repr_markdown_(self):
        return self.markdown()

    def __str__(self):
        return self.markdown()

    def __repr__(self):
        return f"<seed map table: {len(self.rows)} claims>"


def table(path=None) -> Table:
    """Every claim of the seed and where it is taught and drilled, as a displayable table."""
    return Table(claims(path))


__all__ = ["map_path", "load", "claims", "table", "Table"]
