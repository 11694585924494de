"""The parameter table of the docs' reference, generated from ``GRPOParams``' declarations (the docs build writes it)."""

from __future__ import annotations

from .params import GRPOParams


def markdown_table() -> str:
    """The parameter table of docs/reference/parameters.md, generated from the metadata."""
    rows = ["| parameter | CLI flag | default | section | what it does |", "|---|---|---|---|---|"]
    for f in GRPOParams.fields():
        default = "required" if f.metadata.get("required") else ("" if f.default is None else f"`{f.default}`")
        rows.append(f"| `{f.name}` | `{GRPOParams.flag(f.name)}` | {default} | {f.metadata['group']} | "
                    f"{f.metadata['help'].replace('|', '/')} |")
    return "\n".join(rows)
