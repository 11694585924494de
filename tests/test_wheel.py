"""The wheel users install: the package and the offline models' weights, no research code; a fresh venv trains
``tiny-agent`` from it with no build step (docs/architecture.md, "Layers": how the models are built lives in
``research/``, outside the package)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[1]
MODELS = ("tiny-v1", "tiny-math-v2+tiny-v1", "tiny-agent-v2.2+tiny-v1")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    shutil.copytree(REPO, build / "src", ignore=shutil.ignore_patterns(
        ".git", "__pycache__", "*.egg-info", "build", "runs", "node_modules", ".pytest_cache"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(build / "src")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(out.glob("grpo_magic-*.whl"))


def test_the_wheel_holds_the_models_weights_and_no_research(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("research/") or any(
        r in n for r in ("copy_circuit", "chain_heads", "tool_corpus", "RESULTS-agent"))]
    assert not [n for n in names if n.split("/")[0] not in ("grpo_magic",) and ".dist-info/" not in n]
    for version in MODELS:
        folder = f"grpo_magic/models/weights/{version}/"
        for file in ("model.safetensors", "config.json", "tokenizer.json", "MODEL_CARD.md", "grpo_magic_build.json"):
            assert folder + file in names, folder + file
    assert any(n.startswith("grpo_magic/dashboard/static/") for n in names)


def test_a_fresh_venv_trains_tiny_agent_from_the_wheel_without_a_build(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.copy(REPO / "envs" / "weather_agent.py", tmp_path / "weather_agent.py")
    cache = tmp_path / "cache"
    code = (
        "import grpo_magic, pathlib\n"
        f"assert pathlib.Path(grpo_magic.__file__).is_relative_to({str(venv)!r}), grpo_magic.__file__\n"
        "from weather_agent import WeatherAgentEnv\n"
        "run = grpo_magic.train(grpo_magic.GRPOParams(model='tiny-agent', project_name='out', max_steps=1,\n"
        "    batch_size=4, rl_num_generations=4, rl_max_new_tokens=48), WeatherAgentEnv, display=False)\n"
        "assert run.status == 'completed', run.reason\n"
        "print('steps', len(run.history), 'groups', len(run.groups))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRPO_MAGIC_BUILD_MODELS")}
    env.update(GRPO_MAGIC_CACHE=str(cache), HF_HUB_OFFLINE="1")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "steps 1" in done.stdout
    assert "building" not in (done.stdout + done.stderr).lower()
    assert not cache.exists() or not any(cache.iterdir())  # nothing was built into the cache
