"""The README's parameter table, generated from ``GRPOParams``' declarations (tests/test_readme.py keeps them equal)."""

from __future__ import annotations

from .params import GRPOParams


def markdown_table() -> str:
    """The parameter table of the README, generated from the metadata (a test keeps them equal)."""
    rows = ["| parameter | CLI flag | default | section | what it does |", "|---|---|---|---|---|"]
    for f in GRPOParams.fields():
        default = "required" if f.metadata.get("required") else ("" if f.default is None else f"`{f.default}`")
        rows.append(f"| `{f.name}` | `{GRPOParams.flag(f.name)}` | {default} | {f.metadata['group']} | "
                    f"{f.metadata['help'].replace('|', '/')} |")
    return "\n".join(rows)
