"""binder/: the Binder (repo2docker) environment in which the CPU notebooks run.

With a ``binder/`` folder, repo2docker reads only that folder (pyproject.toml is ignored), so
``binder/requirements.txt`` must install the repository itself (``.``) and pin everything the
notebooks need. These tests check, without Docker: its form (the repository, a CPU build of
torch, pins equal to CI's), that the whole set resolves with pip (``--dry-run``), and that every
import in the notebooks is covered by it, the standard library or this repository.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
REQUIREMENTS = BINDER / "requirements.txt"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: Importable packages of this repository: the installed one (".") and the example envs at its root.
REPO_PACKAGES = {"grpo_magic", "envs"}
#: Cell magics whose body is Python that runs in the kernel (its imports count).
PYTHON_CELL_MAGICS = {"grpo_env", "time", "timeit", "capture", "prun"}
#: pip failures that mean "no network here", not "these versions do not go together".
NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "Max retries exceeded",
)


def parse_requirements(path: Path) -> tuple[list[str], list[str]]:
    """(option lines such as --extra-index-url, requirement lines), without comments and blanks."""
    options, requirements = [], []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        (options if line.startswith("-") else requirements).append(line)
    return options, requirements


def pins(requirements: list[str]) -> dict[str, Version]:
    """name -> pinned version of every ``name==version`` line."""
    found = {}
    for line in requirements:
        if line == ".":
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"binder/requirements.txt: pin {line!r} exactly (==)"
        found[canonicalize_name(req.name)] = Version(specs[0].version)
    return found


def test_binder_installs_the_repository_and_a_cpu_torch():
    options, requirements = parse_requirements(REQUIREMENTS)
    assert "." in requirements, "binder/requirements.txt must list '.' (repo2docker ignores pyproject.toml)"
    assert f"--extra-index-url {PYTORCH_CPU_INDEX}" in options, "torch must come from PyTorch's CPU index"
    torch = pins(requirements).get("torch")
    assert torch is not None and torch.local == "cpu", "pin the CPU build of torch: torch==X.Y.Z+cpu"
    for other in ("environment.yml", "Pipfile", "setup.py", "Dockerfile"):
        assert not (BINDER / other).exists(), f"binder/{other} would change how repo2docker builds"


def test_binder_pins_are_the_versions_ci_tests():
    _, binder = parse_requirements(REQUIREMENTS)
    binder_pins = pins(binder)
    _, ci = parse_requirements(ROOT / "requirements-ci.txt")
    ci_pins = pins(ci)
    install = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    ci_torch = re.search(r"torch==([\w.]+)", install)
    assert ci_torch, "scripts/install.sh no longer pins torch; update this test"
    ci_pins["torch"] = Version(ci_torch.group(1))
    for name, version in binder_pins.items():
        if name in ci_pins:
            assert version.public == ci_pins[name].public, (
                f"binder pins {name}=={version}, CI tests {ci_pins[name]}; keep them equal"
            )
    # Every runtime dependency of the package is pinned for Binder, within the package's range.
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for line in project["dependencies"]:
        dep = Requirement(line)
        name = canonicalize_name(dep.name)
        assert name in binder_pins, f"binder/requirements.txt does not pin {dep.name} (a dependency of the package)"
        assert dep.specifier.contains(binder_pins[name], prereleases=True), (
            f"binder pins {name}=={binder_pins[name]}, outside the package's range {dep.specifier}"
        )


def binder_python() -> tuple[int, int] | None:
    runtime = BINDER / "runtime.txt"
    if not runtime.exists():
        return None
    match = re.fullmatch(r"python-(\d+)\.(\d+)", runtime.read_text(encoding="utf-8").strip())
    assert match, "binder/runtime.txt must read like python-3.11"
    return int(match.group(1)), int(match.group(2))


@pytest.mark.process
def test_binder_requirements_resolve_together(tmp_path):
    """``pip install --dry-run --ignore-installed`` of binder/requirements.txt, from the repository root.

    Two changes make it runnable here, without changing what is checked: this machine cannot
    reach PyTorch's index, so the ``--extra-index-url`` line is dropped and ``torch==X+cpu`` becomes
    ``torch==X`` (PEP 440: ``==X`` also matches the local version ``X+cpu``; on these machines pip
    finds a CPU build of torch X on local disk, elsewhere it takes PyPI's). Everything else resolves
    as on Binder: pip runs from the repository root, like repo2docker, so that ``.`` is the repo.
    """
    python = binder_python()
    if python is not None and python != sys.version_info[:2]:
        pytest.skip(f"binder/runtime.txt asks for Python {python[0]}.{python[1]}; this is {sys.version.split()[0]}")
    options, requirements = parse_requirements(REQUIREMENTS)
    mapped = [o for o in options if PYTORCH_CPU_INDEX not in o]
    for line in requirements:
        if line != "." and canonicalize_name(Requirement(line).name) == "torch":
            line = re.sub(r"\+cpu\b", "", line)
        mapped.append(line)
    req_file = tmp_path / "requirements.txt"
    req_file.write_text("\n".join(mapped) + "\n", encoding="utf-8")
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "-r", str(req_file)]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("pip did not finish resolving within 300 s (slow or no network)")
    if done.returncode != 0:
        if any(marker in done.stderr for marker in NETWORK_ERRORS):
            pytest.skip(f"no package index reachable: {done.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"binder/requirements.txt does not resolve:\n{done.stderr[-4000:]}", pytrace=False)
    installed = {canonicalize_name(item["metadata"]["name"]): Version(item["metadata"]["version"])
                 for item in json.loads(report.read_text(encoding="utf-8"))["install"]}
    assert "grpo-magic" in installed, "'.' did not install the grpo-magic package"
    for name, version in pins(requirements).items():
        assert name in installed and installed[name].public == version.public, (
            f"{name}: pinned {version}, resolved {installed.get(name)}"
        )


# ---------------------------------------------------------------- notebook imports


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    """A try whose except catches ImportError: its imports are optional (e.g. google.colab)."""
    for handler in handlers:
        names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if handler.type is None or any(isinstance(n, ast.Name) and n.id in
                                       ("ImportError", "ModuleNotFoundError", "Exception") for n in names):
            return True
    return False


def _imports(tree: ast.AST) -> set[str]:
    """Top-level module names imported by this code, except those inside ImportError guards."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Try) and _guarded(node.handlers):
            for child in node.orelse + node.finalbody:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def cell_imports(source: str) -> set[str]:
    """Imports of one code cell. Magics and shell lines (``%pip``, ``!git``) are turned into plain
    calls by IPython's own input transformer first; the body of a Python cell magic such as
    ``%%grpo_env`` is Python too, and is parsed as such."""
    from IPython.core.inputtransformer2 import TransformerManager

    first, _, body = source.lstrip().partition("\n")
    if first.startswith("%%"):
        name = first[2:].split(maxsplit=1)[0] if first[2:].strip() else ""
        return cell_imports(body) if name in PYTHON_CELL_MAGICS else set()
    code = TransformerManager().transform_cell(source)
    return _imports(ast.parse(code))


def notebook_imports(path: Path) -> set[str]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            found |= cell_imports(source)
    return found


def import_names_of(distributions: set[str]) -> set[str]:
    """The top-level modules these distributions provide (as installed here), plus their own names."""
    from importlib.metadata import packages_distributions

    names = {d.replace("-", "_") for d in distributions}
    for module, dists in packages_distributions().items():
        if any(canonicalize_name(d) in distributions for d in dists):
            names.add(module)
    return names


def test_cell_imports_reads_magics_guards_and_cell_magic_bodies():
    source = ("import os\n!pip list\n%pip install x\ntry:\n    from google.colab import output\n"
              "except ImportError:\n    pass\nif True:\n    !git status\nfrom a.b import c\n")
    assert cell_imports(source) == {"os", "a"}
    assert cell_imports('%%grpo_env E --config {"a": 1}\nfrom datasets import Dataset\n') == {"datasets"}
    assert cell_imports("%%bash\nimport nothing\n") == set()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_imports_are_covered_by_binder(path: Path):
    _, requirements = parse_requirements(REQUIREMENTS)
    covered = import_names_of(set(pins(requirements))) | REPO_PACKAGES | set(sys.stdlib_module_names)
    missing = sorted(notebook_imports(path) - covered)
    assert not missing, (
        f"{path.name} imports {', '.join(missing)}, which binder/requirements.txt does not install; "
        "pin the package there (and in requirements-ci.txt), or guard an optional import with try/except ImportError."
    )
