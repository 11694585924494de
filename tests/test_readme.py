"""The README stays short and true: its commands run as written, its links land, and the docs pages it sends
readers to are generated from the code (the parameter table among them)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _hook():
    """docs/hooks/reference.py, the MkDocs hook that writes the reference pages' generated blocks."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_readme_starts_with_the_demo_and_the_test_command():
    text = README.read_text()
    commands = [line for line in text.splitlines() if line.startswith("bash scripts/install.sh && ")]
    assert commands[0].split(" && ", 1)[1].startswith("grpo-magic train --model tiny --rl-env-module envs.letters")
    assert commands[1].endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/install.sh" in ci and "python -m pytest" in ci


def test_the_readme_is_read_in_five_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) < 300, f"the README has {len(lines)} lines: move the detail to a docs page"
    quickstart = next(i for i, line in enumerate(lines) if line.startswith("## In a notebook"))
    assert quickstart < 60  # the notebook quickstart comes before any version pin
    assert quickstart < next(i for i, line in enumerate(lines) if "requirements-oldest.txt" in line)


def test_every_notebook_is_in_the_readme_tutorials_table():
    """A notebook added to notebooks/ gets its row in the README's tutorials table (a link to it)."""
    section = README.read_text().split("## Tutorials: the notebooks", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| [")]
    linked = {target for row in rows for target in re.findall(r"\]\((notebooks/[^)\s]+\.ipynb)\)", row)}
    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks/*.ipynb"
    missing = [n for n in notebooks if n not in linked]
    assert not missing, f"the README's tutorials table has no row for {missing}"


def test_every_readme_link_lands():
    text = README.read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
    assert targets
    for target in targets:
        assert (ROOT / target.split("#", 1)[0]).exists(), f"the README links to {target}, which does not exist"
    for page in re.findall(r"\]\((docs/[^)#\s]+\.md)", text):  # every docs page it names is in the site's nav
        assert page.removeprefix("docs/") in (ROOT / "mkdocs.yml").read_text(), page


def test_the_parameters_page_is_the_table_the_metadata_generates():
    hook = _hook()
    page = (DOCS / "reference" / "parameters.md").read_text()
    assert "<!-- generated: parameter-table -->" in page and "<!-- generated: recipe-table -->" in page
    built = hook.expand(page)
    assert hook.find_module("params_table").markdown_table() in built
    assert hook.find_module("recipes").markdown_table() in built
    from grpo_magic import GRPOParams

    for field in GRPOParams.fields():  # every declared parameter is on the page, by its flag
        assert f"| `{field.name}` | `{GRPOParams.flag(field.name)}` |" in built, field.name


def test_every_generated_block_of_the_docs_has_a_generator():
    hook = _hook()
    asked = {name for page in DOCS.rglob("*.md") for _, name in hook.MARKER.findall(page.read_text())}
    assert asked and asked <= set(hook.GENERATORS), sorted(asked - set(hook.GENERATORS))


def test_the_event_reference_lists_every_event_type():
    from grpo_magic import events

    built = _hook().generate("event-types")
    for type_name in events.EVENT_TYPES_BY_CLASS.values():
        assert f"### `{type_name}`" in built


def test_the_adapters_guide_has_a_section_for_every_adapter():
    """A new ``grpo_magic.adapters.from_*`` gets its how-to section (its reference entry is generated)."""
    import grpo_magic.adapters as adapters

    headings = re.findall(r"^## .*$", (DOCS / "how-to" / "adapters.md").read_text(), flags=re.MULTILINE)
    for name in (n for n in vars(adapters) if n.startswith("from_") and callable(getattr(adapters, n))):
        assert any(f"`{name}(" in h for h in headings), f"docs/how-to/adapters.md has no section on {name}"


def test_the_docs_recipe_table_is_the_one_recipes_generates():
    from grpo_magic.config.recipes import markdown_table as recipe_table

    assert recipe_table() in (ROOT / "docs" / "architecture.md").read_text()


def test_the_readme_terminal_command_is_a_valid_plan(monkeypatch, capsys):
    """The README's `grpo-magic train` example with a hub model: its flags parse into a plan (--dry-run)."""
    import importlib
    import shlex

    import tomllib

    section = README.read_text().split("## From Python and the terminal", 1)[1].split("\n## ", 1)[0]
    (line,) = [c for block in _blocks(section, "bash") for c in block.splitlines() if c.startswith("grpo-magic ")]
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["grpo-magic"]
    module, _, function = entry.partition(":")
    main = getattr(importlib.import_module(module), function)
    monkeypatch.chdir(ROOT)  # the module of --rl-env-module is imported from the current folder
    assert main([*shlex.split(line)[1:], "--dry-run"]) == 0, capsys.readouterr().err
    assert "grpo-magic train --model Qwen/Qwen2.5-0.5B-Instruct" in capsys.readouterr().out


@pytest.mark.train
def test_the_readme_notebook_cells_and_python_run_as_written(shell, monkeypatch):
    """The three notebook cells, then the Python example, on the offline tiny model: only the steps are fewer."""
    text = README.read_text()
    cells = _blocks(text.split("## In a notebook", 1)[1].split("\n## ", 1)[0], "python")
    assert len(cells) == 3
    for cell in cells:
        cell = cell.replace("--max-steps 30", "--max-steps 2")
        result = shell.run_cell(cell)
        assert result.success, result.error_in_exec or result.error_before_exec
    assert shell.user_ns["report"].verdict  # the check's report, displayed before training
    run = shell.user_ns["run"]
    run.wait()
    assert run.status == "completed", run.reason

    python = _blocks(text.split("## From Python", 1)[1], "python")[0].replace("max_steps=40", "max_steps=2")
    monkeypatch.syspath_prepend(str(ROOT))  # envs/ sits at the repository root
    namespace: dict = {}
    exec(compile(python, "README.md", "exec"), namespace)
    assert namespace["run"].status == "completed"
