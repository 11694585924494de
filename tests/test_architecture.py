"""docs/architecture.md holds: the layer rules (import-linter), no cycles, TRL in one room, no outside docs."""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "grpo_magic"
DOC = REPO / "docs" / "architecture.md"


def _modules() -> dict[str, Path]:
    """Dotted name below grpo_magic (``training.run``, ``dashboard.state``, ``models``) -> file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts != ("__main__",):
            found[".".join(parts)] = path
    return found


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's contracts of ``root``'s pyproject.toml over the package in ``root`` (a fresh process: the
    import graph is built from the files there, not from what this process imported)."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})


def _layers() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return next(c["layers"] for c in config["contracts"] if c["type"] == "layers")


def test_the_layer_rules_hold() -> None:
    """docs/architecture.md, "Layers": import-linter's contracts in pyproject.toml are kept."""
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_a_planted_import_against_the_flow_breaks_the_layer_rules(tmp_path: Path) -> None:
    """The check can fail: an environment module importing the magics (a layer above it) is named."""
    shutil.copytree(PACKAGE, tmp_path / "grpo_magic", ignore=shutil.ignore_patterns("__pycache__", "weights"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "grpo_magic" / "environment" / "planted.py").write_text("from grpo_magic.frontends import magics\n")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    assert "grpo_magic.environment.planted -> grpo_magic.frontends.magics" in done.stdout


def test_every_package_folder_is_a_layer_and_the_docs_list_them() -> None:
    """Each folder of the package and each top-level module is in one layer, and docs/architecture.md's
    "Layers" section names each."""
    layers = [name.strip() for row in _layers() for name in row.split("|")]
    tops = {name.split(".")[0] for name in _modules()}
    assert tops - set(layers) == set(), f"not in any layer of pyproject.toml: {sorted(tops - set(layers))}"
    section = DOC.read_text(encoding="utf-8").split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    assert [n for n in layers if f"`{n}`" not in section] == []


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: {t for t in _imports(name, path, modules) if not t.startswith(name + ".")}
             for name, path in modules.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend([*trail[trail.index(nxt):], nxt] if nxt in trail else [node, nxt])
                return True
            if nxt not in state and visit(nxt, [*trail, nxt]):
                return True
        state[node] = 2
        return False

    for name in sorted(graph):
        if name not in state and visit(name, [name]):
            break
    assert not cycle, " -> ".join(cycle)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at the top or inside functions."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                module = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and node.module.startswith("grpo_magic"):
                module = node.module.removeprefix("grpo_magic").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}" if module else alias.name
                targets.append(sub if sub in modules else module)
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("grpo_magic.") for a in node.names if a.name.startswith("grpo_magic.")]
        out.update(t for t in targets if t in modules and t != name)
    return out


def test_code_cites_only_documents_of_the_repository() -> None:
    """A cited document with a folder (``docs/architecture.md``) is at that path from the repository's root; a bare
    name (``MODEL_CARD.md``) is somewhere in it."""
    missing = set()
    for folder in ("grpo_magic", "envs", "bench", "scripts", "tests", "research"):
        for path in (REPO / folder).rglob("*.py"):
            for cited in re.findall(r"\b([\w/.-]+\.md)\b", path.read_text(encoding="utf-8")):
                there = (REPO / cited).exists() if "/" in cited else any(REPO.rglob(cited))
                if not there:
                    missing.add(f"{path.relative_to(REPO)}: {cited}")
    assert not missing, f"code cites documents that are not in the repository: {sorted(missing)}"


def test_section_names_cited_in_code_exist() -> None:
    headings = set(re.findall(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE))
    cited = set()
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "envs").rglob("*.py")]:
        cited.update(re.findall(r'docs/architecture\.md,? \(?"([^"]+)"', path.read_text(encoding="utf-8")))
    assert cited and cited <= headings, sorted(cited - headings)


def test_readme_how_it_works_is_the_flow_of_the_architecture() -> None:
    def block(text: str, heading: str) -> str:
        return text.split(heading, 1)[1].split("```", 2)[1].strip()

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert block(readme, "## How it works") == block(DOC.read_text(encoding="utf-8"), "## The flow")


def _trl_touches(tree: ast.AST) -> list[str]:
    """What a module does with TRL or accelerate beyond their public API: imports of TRL's modules (``trl.x``) or
    of names ``trl`` does not export, a private attribute of anything imported from ``trl`` or ``accelerate``,
    attributes and strings naming a private TRL member or one TRL attribute we touch, the reward keyword list."""
    import trl

    from grpo_magic import trl_compat

    private = {name for _, name, _, _ in trl_compat.TRL_INTERNALS if name.startswith("_") and not name.endswith("__")}
    private |= {name for _, name, _ in trl_compat.ACCELERATE_INTERNALS}
    attributes = private | set(trl_compat.TRL_ATTRIBUTES)
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level
                and node.module and node.module.split(".")[0] in ("trl", "accelerate") for a in node.names}
    imported |= {(a.asname or a.name).split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names if a.name.split(".")[0] in ("trl", "accelerate")}
    theirs = _their_private_names()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and node.module.split(".")[0] == "trl":
            if node.module != "trl":
                found.append(f"imports from {node.module}")
            found += [f"imports trl.{a.name}, which trl does not export" for a in node.names if a.name not in trl.__all__]
        elif isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name.startswith("trl.")]
        elif isinstance(node, ast.Attribute) and node.attr in attributes:
            found.append(f"reads .{node.attr}")
        elif (isinstance(node, ast.Attribute) and _root_name(node.value) in imported
              and node.attr.startswith("_") and not node.attr.endswith("__")):
            found.append(f"reads the private {_root_name(node.value)}...{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in theirs:
            found.append(f"reads .{node.attr}, a private attribute of TRL's, transformers' or accelerate's trainer "
                         "and state classes")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in attributes:
            found.append(f"names {node.value!r}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "filterwarnings"
              and any(k.arg == "message" for k in node.keywords)):
            found.append("filters a library warning by its wording (trl_compat.SETTING_WARNINGS)")
        elif (isinstance(node, ast.Call) and any(k.arg in ("trainer_state", "log_metric") for k in node.keywords)):
            found.append("calls a reward function as TRL does (trl_compat.call_reward)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getmembers"
              and any(isinstance(a, ast.Attribute) and a.attr == "isfunction" for a in [*node.args, *(k.value for k in node.keywords)])):
            found.append("lists an env's methods as TRL does (trl_compat.environment_tool_names)")
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and node.slice.value in trl_compat.BATCH_KEYS and node.slice.value != "completion_ids"):
            found.append(f"reads TRL's batch key {node.slice.value!r}")
    return found


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


@functools.cache
def _their_private_names() -> frozenset[str]:
    """The private attributes of TRL's trainer and config, transformers' Trainer and its state, and accelerate's
    Accelerator and process state (their classes' members and what their modules set on ``self``), less the
    private names grpo_magic defines itself (its own classes' attributes of the same name)."""
    import inspect

    import accelerate
    import transformers
    import trl
    from accelerate.state import AcceleratorState, PartialState

    classes = (trl.GRPOTrainer, trl.GRPOConfig, transformers.Trainer, transformers.TrainingArguments,
               transformers.TrainerState, transformers.TrainerControl, accelerate.Accelerator, PartialState,
               AcceleratorState)
    theirs = {n for c in classes for n in dir(c) if n.startswith("_") and not n.endswith("__")}
    for cls in (trl.GRPOTrainer, transformers.Trainer, accelerate.Accelerator):
        for node in ast.walk(ast.parse(inspect.getsource(inspect.getmodule(cls)))):
            if isinstance(node, ast.Attribute) and _root_name(node) == "self" and node.attr.startswith("_"):
                theirs.add(node.attr)
    ours = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                ours.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                ours.add(node.attr)
    return frozenset(n for n in theirs - ours if not n.endswith("__"))


def test_trl_internals_are_touched_in_trl_compat_only() -> None:
    """docs/architecture.md, "TRL": one module touches TRL beyond its public API; every other module uses it."""
    modules = _modules()
    wrong = [f"{name} {touch}" for name, path in modules.items() if name != "trl_compat"
             for touch in _trl_touches(ast.parse(path.read_text(encoding="utf-8")))]
    assert not wrong, wrong
    assert _trl_touches(ast.parse(modules["trl_compat"].read_text(encoding="utf-8")))  # the test sees touches


@pytest.mark.parametrize("planted", [
    "from accelerate.state import PartialState\nready = bool(PartialState._shared_state)\n",
    "from trl import GRPOTrainer\nGRPOTrainer._generate_and_score_completions(None, [])\n",
    "def done(trainer):\n    trainer.store_flos = lambda: None\n",
    "import warnings\nwarnings.filterwarnings('ignore', message='.*pin_memory.*')\n",
    "def check(reward):\n    return reward.score(prompts=[], completions=[], trainer_state=None, log_metric=None)\n",
    "import inspect\ntools = [n for n, _ in inspect.getmembers(object, predicate=inspect.isfunction)]\n",
    "from trl.trainer.grpo_trainer import GRPOTrainer\n",
    "def logs(trainer):\n    return trainer._logs, trainer._metrics\n",
    "import trl\nrewards = trl.GRPOTrainer._calculate_rewards\n",
    "import accelerate.state as s\nstate = s.PartialState._shared_state\n",
])
def test_a_planted_touch_of_trl_outside_the_room_is_found(planted: str) -> None:
    assert _trl_touches(ast.parse(planted))


def test_the_architecture_lists_every_trl_touch() -> None:
    from grpo_magic import trl_compat

    section = DOC.read_text(encoding="utf-8").split("\n## TRL\n", 1)[1].split("\n## ", 1)[0]
    named = [*(f"{owner}.{name}" for owner, name, _, _ in trl_compat.TRL_INTERNALS), *trl_compat.BATCH_KEYS,
             *trl_compat.REWARD_KWARGS, *trl_compat.LIBRARY_LOGGERS, *trl_compat.TRL_MODULES,
             *trl_compat.TRL_ATTRIBUTES]
    missing = [n for n in named if f"`{n}`" not in section and f"{n}`" not in section]
    assert not missing, f"docs/architecture.md's TRL section does not name {missing}"
