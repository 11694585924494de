"""The example notebooks: stored without outputs, each with a what/how-long header, and the CPU ones run.

Running a notebook is what a user does: a fresh ``python3`` kernel executes every cell of a copy
of it in a temporary folder (so the runs' output folders land there, not in the repository). Each
notebook asserts what it teaches in its own cells (the quickstart: the reward rises), so a cell
error fails the test. A notebook whose metadata says ``"grpo_magic": {"requires_gpu": true}``
(a real model, vLLM) is checked for form but not run.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
#: Executed copies are kept here (git-ignored) so that a failure can be looked at cell by cell.
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
#: A cell's limit: every shipped notebook runs top to bottom in under 5 minutes on 2 cores, so a cell past this is
#: stuck, not slow.
CELL_TIMEOUT_S = 600


def read(path: Path):
    return nbformat.read(path, as_version=4)


def requires_gpu(notebook) -> bool:
    return bool(notebook.metadata.get("grpo_magic", {}).get("requires_gpu", False))


CPU_NOTEBOOKS = [p for p in NOTEBOOKS if not requires_gpu(read(p))]


def names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_the_notebooks_are_there():
    assert {"01_quickstart.ipynb", "02_teaching_grpo.ipynb", "03_hotel_agent.ipynb",
            "04_sft_then_grpo.ipynb", "05_agent_on_cpu.ipynb", "06_reward_hacking.ipynb"} <= set(names(NOTEBOOKS))
    assert "03_hotel_agent.ipynb" not in names(CPU_NOTEBOOKS), "the hotel agent notebook needs a GPU"
    assert {"01_quickstart.ipynb", "02_teaching_grpo.ipynb", "04_sft_then_grpo.ipynb",
            "05_agent_on_cpu.ipynb", "06_reward_hacking.ipynb"} <= set(names(CPU_NOTEBOOKS))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=names(NOTEBOOKS))
def test_notebook_is_stored_without_outputs(path: Path):
    notebook = read(path)
    nbformat.validate(notebook)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [] and cell.execution_count is None, (
            f"{path.name}: cell {index} has outputs or an execution count; clear them before committing "
            f"(jupyter nbconvert --clear-output --inplace notebooks/{path.name})."
        )
    assert "widgets" not in notebook.metadata, f"{path.name}: saved widget state in the metadata; clear it."
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel is not python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=names(NOTEBOOKS))
def test_notebook_says_what_it_teaches_and_how_long_it_takes(path: Path):
    first = read(path).cells[0]
    assert first.cell_type == "markdown", f"{path.name}: the first cell should be the markdown header"
    text = first.source
    assert re.search(r"^# \S", text, re.M), f"{path.name}: the header has no title"
    assert re.search(r"\*\*What you learn:\*\*\s+\S", text), f"{path.name}: the header does not say what it teaches"
    assert re.search(r"\*\*How long:\*\*[^\n]*\d+\s*(minutes?|hours?|seconds?)", text), (
        f"{path.name}: the header does not say how long it takes"
    )


def test_gpu_notebook_is_colab_ready():
    notebook = read(NOTEBOOK_DIR / "03_hotel_agent.ipynb")
    assert requires_gpu(notebook)
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    assert "%pip install" in code
    assert "enable_custom_widget_manager" in code
    for flag in ("--peft", "--use-vllm", "--vllm-mode colocate", "Qwen/Qwen2.5-0.5B-Instruct", "%grpo_check"):
        assert flag in code, f"03_hotel_agent.ipynb does not use {flag}"


def _kernel_manager():
    """A python3 kernel on this interpreter (the one with grpo_magic installed), whatever PATH says."""
    from jupyter_client.kernelspec import NoSuchKernel
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="python3")
    try:
        spec = km.kernel_spec
    except NoSuchKernel:
        pytest.fail("No python3 kernelspec; install one with: python -m ipykernel install --user")
    if spec.argv and Path(spec.argv[0]).name.startswith("python"):
        spec.argv[0] = sys.executable
    return km


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    # envs/ (the example environments) is not an installed package: the repository root must be
    # importable from the copy's temporary folder, as it is from notebooks/ (see the notebooks).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, as in Jupyter
    return env


def _problems_in_outputs(notebook) -> list[str]:
    """Errors that do not fail a cell: tracebacks printed by threads, dashboard subscriber failures."""
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}")
            text = output.get("text", "") if output.get("output_type") == "stream" else ""
            if "Traceback (most recent call last)" in text or "event subscriber" in text:
                found.append(f"cell {index} printed:\n{text[-3000:]}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", CPU_NOTEBOOKS, ids=names(CPU_NOTEBOOKS))
def test_notebook_runs(path: Path, tmp_path: Path):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    copy = tmp_path / path.name
    shutil.copy(path, copy)
    notebook = read(copy)
    client = NotebookClient(
        notebook,
        km=_kernel_manager(),
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working folder
    )
    started = time.monotonic()
    try:
        client.execute(env=_kernel_env())
    except CellExecutionError as exc:
        pytest.fail(f"{path.name} failed after {time.monotonic() - started:.0f} s:\n{exc}", pytrace=False)
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, ARTIFACTS / path.name)
    elapsed = time.monotonic() - started
    problems = _problems_in_outputs(notebook)
    assert not problems, f"{path.name}: " + "\n".join(problems)
    print(f"{path.name}: ran in {elapsed:.0f} s")
