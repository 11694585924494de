"""The README stays true: its parameter table is the one the metadata generates."""

from __future__ import annotations

from pathlib import Path

from grpo_magic.config.params_table import markdown_table

ROOT = Path(__file__).resolve().parents[1]


def test_readme_parameter_table_matches_the_metadata():
    assert markdown_table() in (ROOT / "README.md").read_text()


def test_readme_starts_with_the_demo_and_the_test_command():
    text = (ROOT / "README.md").read_text()
    commands = [line for line in text.splitlines() if line.startswith("bash scripts/install.sh && ")]
    assert commands[0].split(" && ", 1)[1].startswith("grpo-magic train --model tiny --rl-env-module envs.letters")
    assert commands[1].endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/install.sh" in ci and "python -m pytest" in ci


def test_the_docs_recipe_table_is_the_one_recipes_generates():
    from grpo_magic.config.recipes import markdown_table as recipe_table

    assert recipe_table() in (ROOT / "docs" / "architecture.md").read_text()
