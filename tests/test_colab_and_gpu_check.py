"""Colab installs that keep the runtime's GPU stack, and the prepared GPU check's CPU dry run.

The install decision (grpo_magic/frontends/colab.py) is fed stand-in ``nvidia-smi`` answers of Colab's runtimes; the dry-run
install test asks pip, against PyPI, what ``pip install "<repo>[notebook]"`` would install into a fresh venv that
already holds torch (tier ``process``: it starts pip and needs the network).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_magic.frontends import colab

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "03_hotel_agent.ipynb"

#: ``nvidia-smi --query-gpu=driver_version,compute_cap --format=csv,noheader`` on the runtimes the README names.
T4_ON_550 = "550.54.15, 7.5\n"
L4_ON_550 = "550.54.15, 8.9\n"
L4_ON_580 = "580.82.07, 8.9\n"
A100_ON_580 = "580.82.07, 8.0\n"
V100_ON_580 = "580.82.07, 7.0\n"


@pytest.mark.parametrize("answer", [T4_ON_550, L4_ON_550])
def test_a_driver_older_than_cuda_13_installs_the_notebook_extra_only(answer: str) -> None:
    plan = colab.plan_install(answer)
    assert plan.extras == ("notebook",) and not plan.use_vllm
    assert "550.54.15" in plan.reason and "580" in plan.reason and "TRL's own generation" in plan.reason
    assert "\n" not in plan.reason  # one printed line
    assert plan.requirement("/content/grpo-magic") == "/content/grpo-magic[notebook]"


@pytest.mark.parametrize("answer", [A100_ON_580, L4_ON_580])
def test_a_cuda_13_driver_on_a_recent_gpu_installs_vllm(answer: str) -> None:
    plan = colab.plan_install(answer)
    assert plan.extras == ("notebook", "vllm") and plan.use_vllm
    assert plan.requirement("/content/grpo-magic") == "/content/grpo-magic[notebook,vllm]"
    assert "580.82.07" in plan.reason


def test_a_gpu_below_compute_capability_7_5_skips_vllm_whatever_the_driver() -> None:
    plan = colab.plan_install(V100_ON_580)
    assert not plan.use_vllm and "compute capability 7.0" in plan.reason


def test_no_nvidia_smi_or_no_gpu_skips_vllm() -> None:
    for answer in (None, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"):
        plan = colab.plan_install(answer)
        assert plan.extras == ("notebook",) and "no NVIDIA GPU" in plan.reason


def test_every_gpu_must_run_vllm() -> None:
    assert not colab.plan_install(A100_ON_580 + V100_ON_580).use_vllm
    assert colab.parse_nvidia_smi(A100_ON_580 + L4_ON_580) == [colab.Gpu("580.82.07", (8, 0)),
                                                               colab.Gpu("580.82.07", (8, 9))]


def test_nvidia_smi_is_read_with_the_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "--query-gpu=driver_version,compute_cap --format=csv,noheader" ] '
                    f'&& printf "{T4_ON_550.strip()}\\n" || exit 9\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert colab.read_nvidia_smi() == T4_ON_550
    fake.unlink()
    assert colab.read_nvidia_smi() is None


def test_kept_stack_holds_the_installed_torch() -> None:
    from importlib.metadata import version

    assert f"torch=={version('torch')}" in colab.kept_stack()


def test_colab_uses_the_standard_library_only() -> None:
    """The notebook loads colab.py by path before the package (or its dependencies) is installed."""
    tree = ast.parse((REPO / "grpo_magic" / "frontends" / "colab.py").read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported


def _code_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def test_notebook_03_installs_what_the_plan_says_and_checks_cuda() -> None:
    install = next(c for c in _code_cells() if "%pip install" in c)
    assert '"colab.py"' in install and "plan_install(colab.read_nvidia_smi())" in install
    assert "print(plan.reason)" in install
    assert "[vllm]" not in install, "the vllm extra is installed only where the plan says so"
    assert '-c "{constraints}"' in install and "kept_stack()" in install
    assert "torch.cuda.is_available()" in install and "assert" in install


def test_notebook_03_trains_with_vllm_only_where_it_was_installed() -> None:
    train = next(c for c in _code_cells() if "grpo_train" in c and "--run" in c)
    branch = train.split("if plan.use_vllm:", 1)
    assert len(branch) == 2 and colab.VLLM_FLAGS in branch[1] and "--use-vllm" not in branch[0]


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_notebook_install_keeps_an_installed_torch(tmp_path: Path) -> None:
    """pip's own report: the notebook extra, into a venv holding torch 2.13.0, installs no torch and no CUDA library."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {**os.environ, "PIP_CONSTRAINT": ""}  # only what the package asks for (no machine-wide cap)
    subprocess.run([python, "-m", "pip", "install", "-q", "torch==2.13.0"], check=True, env=env)
    report = tmp_path / "report.json"
    subprocess.run([python, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report), f"{REPO}[notebook]"],
                   check=True, env=env, capture_output=True)
    names = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    assert "grpo-magic" in names and "trl" in names and "ipykernel" in names
    replaced = sorted(n for n in names if n == "torch" or n.startswith(("nvidia-", "cuda-", "triton")))
    assert not replaced, f"the notebook install would replace the runtime's GPU stack: {replaced}"
    kept = subprocess.run([python, "-c", "import importlib.util, sys; s = importlib.util.spec_from_file_location("
                           f"'c', {str(REPO / 'grpo_magic' / 'frontends' / 'colab.py')!r}); m = sys.modules['c'] = "
                           "importlib.util.module_from_spec(s); s.loader.exec_module(m); print(m.kept_stack())"],
                          check=True, capture_output=True, text=True).stdout
    assert "torch==2.13.0" in kept


@pytest.mark.process
@pytest.mark.timeout(180)
def test_the_gpu_check_dry_run_writes_every_case(tmp_path: Path) -> None:
    """scripts/gpu_check.py --dry-run: the GPU check's code paths on CPU with tiny, the keys the GPU run writes."""
    out = tmp_path / "gpu-check.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["problems"] == [] and report["dry_run"]
    assert set(report["cases"]) == {"full_bf16", "lora_bf16", "t4_fp16_lora", "multi_turn_workers"}
    for case in report["cases"].values():
        assert case["status"] == "completed" and case["loss_finite"], case
        assert {"weights", "gradients", "optimizer", "activations", "logits"} <= set(case["estimate"]["terms"])
        assert {"before", "peak", "after", "measured_with"} <= set(case["memory"])
    assert report["cases"]["multi_turn_workers"]["episode_turns"]["past_turn_1"] > 0
    assert "reference model" in report["cases"]["full_bf16"]["estimate"]["terms"]
    assert {"baseline", "after_all_runs", "back_near_start"} <= set(report["second_run"])


class _Shell:
    """Stands in for IPython in a notebook cell: records the magics' lines, expanded as IPython expands them."""

    def __init__(self, namespace: dict) -> None:
        self.namespace, self.lines = namespace, []
        self.returns = object()

    def run_line_magic(self, name: str, line: str) -> object:
        self.lines.append((name, line.format(**self.namespace) if name == "pip" else line))
        return self.returns


def _run_cell(source: str, namespace: dict) -> _Shell:
    from IPython.core.inputtransformer2 import TransformerManager

    shell = _Shell(namespace)
    namespace["get_ipython"] = lambda: shell
    exec(compile(TransformerManager().transform_cell(source), "<cell>", "exec"), namespace)  # noqa: S102
    return shell


def _stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smi: str, cuda: str) -> None:
    """nvidia-smi answering ``smi``, a fresh Python answering ``cuda``, and nothing installed yet."""
    import importlib.util

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{smi}'\n")
    fake_python = bin_dir / "python"
    fake_python.write_text(f"#!/bin/sh\necho '{cuda}'\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(sys, "executable", str(fake_python))
    monkeypatch.setattr(sys, "path", list(sys.path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("grpo_magic", "vllm") else real(name, *a))
    monkeypatch.chdir(REPO / "notebooks")
    monkeypatch.delitem(sys.modules, "grpo_magic_colab", raising=False)


def _cells() -> tuple[str, str]:
    cells = _code_cells()
    return (next(c for c in cells if "%pip install" in c), next(c for c in cells if "grpo_train" in c and "--run" in c))


@pytest.mark.parametrize(("smi", "vllm"), [(T4_ON_550, False), (L4_ON_550, False), (A100_ON_580, True)],
                         ids=["T4-550", "L4-550", "A100-580"])
def test_notebook_03_install_and_training_cells_on_colab_runtimes(
    smi: str, vllm: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The install cell run as IPython runs it, with stand-ins: what pip is asked, the line it prints, the flags."""
    _stand_ins(tmp_path, monkeypatch, smi.strip(), "2.9.0+cu126 True")
    install, training = _cells()
    namespace: dict = {}
    shell = _run_cell(install, namespace)
    [(name, line)] = shell.lines
    assert name == "pip"
    if vllm:
        assert line == f'install -q "{REPO}[notebook,vllm]"'
    else:
        requirement, constraints = line.split(" -c ")
        assert requirement == f'install -q "{REPO}[notebook]"'
        from importlib.metadata import version

        assert f"torch=={version('torch')}" in Path(constraints.strip('"')).read_text().split()
    printed = capsys.readouterr().out
    assert namespace["plan"].reason in printed and ("vLLM skipped" in printed) is not vllm
    shell = _run_cell(training, namespace)
    [(name, flags)] = shell.lines
    assert name == "grpo_train" and flags.endswith("--use-vllm --vllm-mode colocate --vllm-gpu-memory-utilization 0.3") is vllm
    assert "--use-vllm" in flags if vllm else "--use-vllm" not in flags
    assert namespace["run"] is shell.returns


def test_notebook_03_install_cell_fails_when_cuda_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(tmp_path, monkeypatch, A100_ON_580.strip(), "2.13.0+cu130 False")
    with pytest.raises(AssertionError, match="CUDA is not visible after the install"):
        _run_cell(_cells()[0], {})
