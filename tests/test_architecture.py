"""The rooms of docs/architecture.md hold: who imports whom, no cycles, small modules, no outside docs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "grpo_magic"
DOC = REPO / "docs" / "architecture.md"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    """Dotted name below grpo_magic (``run``, ``dashboard.state``, ``models``) -> file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts != ("__main__",):
            found[".".join(parts)] = path
    return found


def _room(name: str, rooms: dict[str, set[str]]) -> str:
    """The room a module belongs to: itself, or its package's (``models.tiny`` is in ``models``)."""
    while name not in rooms and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


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


def _rooms_table() -> dict[str, set[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    rooms: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            allowed = {a.strip() for a in cells[2].split(",") if a.strip() not in ("", "–")}
            rooms[cells[0].strip("`")] = allowed
    return rooms


def _allowed(importer_room: str, target: str, rooms: dict[str, set[str]]) -> bool:
    target_room = _room(target, rooms)
    if target_room == importer_room or target.startswith(importer_room + "."):
        return True  # a package's own modules
    allowed = rooms[importer_room]
    return any(target_room == a or (a.endswith(".*") and target_room.startswith(a[:-1])) for a in allowed)


def test_every_module_is_a_room_of_the_architecture() -> None:
    rooms = _rooms_table()
    missing = sorted({_room(m, rooms) for m in _modules()} - set(rooms))
    assert not missing, f"modules not in docs/architecture.md's Rooms table: {missing}"


def test_modules_import_only_what_their_room_allows() -> None:
    rooms = _rooms_table()
    modules = _modules()
    wrong = [
        f"{name} imports {target}"
        for name, path in modules.items()
        for target in sorted(_imports(name, path, modules))
        if not _allowed(_room(name, rooms), target, rooms)
    ]
    assert not wrong, wrong


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


@pytest.mark.parametrize("name", sorted(_modules()))
def test_modules_stay_small(name: str) -> None:
    lines = len(_modules()[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by job (docs/architecture.md, Rooms)"


def test_code_cites_only_documents_of_the_repository() -> None:
    cited: set[str] = set()
    for folder in ("grpo_magic", "envs", "bench", "scripts", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            cited.update(re.findall(r"\b([\w/.-]+\.md)\b", path.read_text(encoding="utf-8")))
    missing = sorted(c for c in cited if not (REPO / c).exists() and not any(REPO.rglob(Path(c).name)))
    assert not missing, f"code cites documents that are not in the repository: {missing}"


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
    """What a module does with TRL beyond its public API: imports of TRL's modules (``trl.x``) or of names
    ``trl`` does not export, attributes and strings naming a private TRL member, the reward keyword list."""
    import trl

    from grpo_magic import trl_compat

    private = {name for _, name, _, _ in trl_compat.TRL_INTERNALS if name.startswith("_") and not name.endswith("__")}
    attributes = private | set(trl_compat.TRL_ATTRIBUTES)
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
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in attributes:
            found.append(f"names {node.value!r}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = {e.value for e in node.elts if isinstance(e, ast.Constant)} & set(trl_compat.REWARD_KWARGS)
            if len(names) > 1:
                found.append(f"lists TRL's reward keyword arguments {sorted(names)} (use trl_compat.REWARD_KWARGS)")
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and node.slice.value in trl_compat.BATCH_KEYS and node.slice.value != "completion_ids"):
            found.append(f"reads TRL's batch key {node.slice.value!r}")
    return found


def test_trl_internals_are_touched_in_trl_compat_only() -> None:
    """docs/architecture.md, "TRL": one module touches TRL beyond its public API; every other module uses it."""
    modules = _modules()
    wrong = [f"{name} {touch}" for name, path in modules.items() if name != "trl_compat"
             for touch in _trl_touches(ast.parse(path.read_text(encoding="utf-8")))]
    assert not wrong, wrong
    assert _trl_touches(ast.parse(modules["trl_compat"].read_text(encoding="utf-8")))  # the test sees touches


def test_the_architecture_lists_every_trl_touch() -> None:
    from grpo_magic import trl_compat

    section = DOC.read_text(encoding="utf-8").split("\n## TRL\n", 1)[1].split("\n## ", 1)[0]
    named = [*(f"{owner}.{name}" for owner, name, _, _ in trl_compat.TRL_INTERNALS), *trl_compat.BATCH_KEYS,
             *trl_compat.REWARD_KWARGS, *trl_compat.LIBRARY_LOGGERS, *trl_compat.TRL_MODULES,
             *trl_compat.TRL_ATTRIBUTES]
    missing = [n for n in named if f"`{n}`" not in section and f"{n}`" not in section]
    assert not missing, f"docs/architecture.md's TRL section does not name {missing}"
