"""The PNG of the curves where there is no live front end: a notebook executed by nbclient (as
nbconvert does), and a replay without widgets.

A real kernel runs a real (short) blocking run of ``tiny``: the dashboard's display is updated at
the end of the run, so the saved notebook holds the PNG of the whole run beside the widget.
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("anywidget")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG"

ENV_CELL = """%%grpo_env Letters
from datasets import Dataset

class Letters:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Write a {i}: " for i in range(16)]})

    def score_episode(self, model, tokenizer, completion):
        return completion.count("a") / max(1, len(completion))
"""


def _pngs(cell: object) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for o in cell.outputs if "image/png" in o.get("data", {})]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_executed_notebook_keeps_the_png_of_the_run_and_of_a_static_replay(tmp_path: Path) -> None:
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(c)
        for c in (
            "%load_ext grpo_magic",
            ENV_CELL,
            "run = %grpo_train --env Letters --model tiny --max-steps 4 --batch-size 4 --rl-max-new-tokens 4 "
            "--project-name png-run --run --blocking",
            "import grpo_magic\ngrpo_magic.replay(run.output_dir, static=True)",
        )
    ]
    km = AsyncKernelManager(kernel_name="python3")
    if km.kernel_spec.argv and Path(km.kernel_spec.argv[0]).name.startswith("python"):
        km.kernel_spec.argv[0] = sys.executable
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    client = NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    nbformat.write(nb, tmp_path / "executed.ipynb")
    live = nb.cells[2]
    widget_outputs = [o for o in live.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widget_outputs, live.outputs  # the dashboard, as a widget for frontends that have them
    pngs = _pngs(live)
    assert pngs and pngs[-1].startswith(PNG), "the run's display was not given the PNG at its end"
    static = _pngs(nb.cells[3])
    assert static and static[0].startswith(PNG)
    assert not [o for o in nb.cells[3].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
