"""An agent episode's card in a real browser: JupyterLab in headless Chromium opens it into its turns.

A notebook trains an agent env (tools as methods, TRL's tool loop) on ``tiny-agent`` for one step;
the dashboard's completion card of an episode that called a tool is folded, and clicking it shows
every turn: the tool call with its arguments and the tool's result.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from browser_support import (
    JupyterServer,
    open_notebook,
    page_of_a_test,
    start_cells,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]

TRAIN_CELL = """import grpo_magic
from envs.weather_agent import WeatherAgentEnv

params = grpo_magic.GRPOParams(model="tiny-agent", max_steps=1, batch_size=16, rl_num_generations=8,
                               rl_max_new_tokens=48, project_name="agent-run")
run = grpo_magic.train(params, WeatherAgentEnv(), blocking=True)
"""


def test_an_agent_card_opens_into_its_turns_with_the_tool_result(jupyter: JupyterServer, browser: Any,
                                                                 tmp_path: Path) -> None:
    from playwright.sync_api import expect

    write_notebook(jupyter.root_dir / "agent.ipynb", ["%load_ext grpo_magic", TRAIN_CELL])
    with page_of_a_test(browser.new_page(), jupyter, tmp_path, "agent-page-failure.png") as page:
        open_notebook(page, jupyter.url("lab", "agent.ipynb"))
        start_cells(page)
        status = page.locator(".grpo-dashboard .grpo-status").first
        expect(status).to_have_text(re.compile("completed"), timeout=300_000)
        card = page.locator("details.grpo-turns").filter(has=page.locator(".grpo-turn-tool")).first
        expect(card).to_be_attached(timeout=30_000)
        result = card.locator(".grpo-turn-tool pre").first
        call = card.locator(".grpo-tool-call").first
        expect(result).not_to_be_visible()  # folded: the card shows its summary line only
        expect(card.locator("summary")).to_contain_text(re.compile(r"\d+ tool calls?"))
        card.locator("summary").click()
        expect(result).to_be_visible()
        expect(result).to_contain_text(re.compile(r" in (Paris|Madrid|London|Rome|Berlin|Tokyo|Lima|Oslo)"))
        expect(call).to_be_visible()
        expect(call).to_contain_text(re.compile(r"call get_(weather|time)\(city="))
        card.screenshot(path=str(tmp_path / "agent-card-open.png"))
