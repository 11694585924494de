"""Agent envs: episodes trained whole through TRL's tool loop, their transcripts, check and dashboard."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from grpo_magic.environment.agent import AgentEpisode, agent_spec, episode_class, tool_calls_of, transcript
from grpo_magic.events import GroupScored, RunLog, RunStarted, StepLogged, read_run_log
from tests.agent_cells import CELLS

WEATHER = {"Paris": "sunny", "Rome": "rainy", "Oslo": "snowy", "Lima": "cloudy"}


class WeatherAgent:
    """Answers weather questions; the right episode calls get_weather with the asked city."""

    def __init__(self, n: int = 16) -> None:
        self.n = n
        self.asked: list[str] = []

    def build_dataset(self, tokenizer):
        from datasets import Dataset

        cities = list(WEATHER)
        return Dataset.from_dict({"prompt": [f"What is the weather in {cities[i % 4]}?" for i in range(self.n)],
                                  "city": [cities[i % 4] for i in range(self.n)]})

    def reset(self, city: str, **row) -> None:
        self.city = city
        self.asked = []

    def get_weather(self, city: str) -> str:
        """Get today's weather in a city.

        Args:
            city: The city name, e.g. Paris.
        """
        self.asked.append(city)
        if city not in WEATHER:
            raise KeyError(f"no weather station in {city}")
        return f"{WEATHER[city]} in {city}"

    def helper_for_tests(self) -> int:  # public but not a tool when get_tools names the tools
        return 1

    def get_tools(self):
        return [{"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {}}}]

    def score_episode(self, model, tokenizer, completion, city, messages=None, tool_calls=None):
        return 1.0 if self.city in self.asked else 0.0


TURNS = [
    {"role": "assistant", "content": "Let me look.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"type": "function", "function": {"name": "get_time", "arguments": {}}}]},
    {"role": "tool", "name": "get_weather", "content": "sunny in Paris"},
    {"role": "tool", "name": "get_time", "content": "{'error': 'Tool get_time not found.'}"},
    {"role": "assistant", "content": "It is sunny in Paris."},
]


# ---------------------------------------------------------------- the class TRL builds


def test_trl_sees_only_reset_and_the_tools_and_each_call_is_recorded() -> None:
    import inspect

    env = WeatherAgent()
    spec = agent_spec(env, WeatherAgent, env.get_tools())
    episode = spec.factory()
    assert isinstance(episode, AgentEpisode) and episode._env is not env  # a fresh env for each rollout
    public = [n for n, _ in inspect.getmembers(type(episode), inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["get_weather", "reset"]  # what TRL turns into tools, reset aside
    assert spec.schemas[0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    episode.reset(city="Rome", prompt=[{"role": "user", "content": "?"}], extra_column=1)
    assert episode.get_weather(city="Rome") == "rainy in Rome"
    with pytest.raises(KeyError):  # re-raised: TRL feeds the error to the model
        episode.get_weather(city="Atlantis")
    assert [(c.name, c.arguments, bool(c.error)) for c in episode._calls] == [
        ("get_weather", {"city": "Rome"}, False), ("get_weather", {"city": "Atlantis"}, True)]
    assert episode._env.asked == ["Rome", "Atlantis"]


def test_without_get_tools_every_public_method_is_a_tool() -> None:
    class NoList(WeatherAgent):
        get_tools = None

    cls = episode_class(NoList, ["get_weather", "helper_for_tests"])
    assert callable(cls.helper_for_tests) and cls.get_weather.__doc__ == WeatherAgent.get_weather.__doc__


def test_transcript_marks_failed_and_unknown_tools() -> None:
    from grpo_magic.environment.agent import ToolCall

    out = transcript(TURNS, [ToolCall("get_weather", {"city": "Paris"})])
    assert [t["role"] for t in out] == ["assistant", "tool", "tool", "assistant"]
    assert out[0]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                    {"name": "get_time", "arguments": {}}]
    assert "error" not in out[1] and out[2]["error"].startswith("{'error'")
    assert tool_calls_of(TURNS) == out[0]["tool_calls"]
    failed = transcript(TURNS[:2], [ToolCall("get_weather", {"city": "Paris"}, error="KeyError: 'x'")])
    assert failed[1]["error"] == "KeyError: 'x'"


# ---------------------------------------------------------------- the run log, replay and the dashboard


def _group(step: int = 1) -> GroupScored:
    turns = transcript(TURNS)
    return GroupScored(step=step, group=0, prompt="user: What is the weather in Paris?",
                       completions=["It is sunny in Paris.", "no idea"], scores=[1.0, 0.0],
                       advantages=[0.7071, -0.7071], errors=[None, None], clipped=[False, False],
                       transcripts=[turns, [{"role": "assistant", "content": "no idea"}]])


def test_transcripts_round_trip_through_the_run_log_and_replay(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    from grpo_magic import replay

    log = RunLog(tmp_path)
    log(RunStarted(params={}, env_name="WeatherAgent", model="tiny-agent", output_dir=str(tmp_path), max_steps=1))
    log(_group())
    log(StepLogged(step=1, metrics={"reward": 0.5, "tools/call_frequency": 1.0}, max_steps=1))
    log.close()
    back = next(e for e in read_run_log(tmp_path) if isinstance(e, GroupScored))
    assert back.transcripts == _group().transcripts
    html = replay(str(tmp_path)).groups_html
    for text in ("get_weather", "city=&#x27;Paris&#x27;", "sunny in Paris", "It is sunny in Paris.",
                 "get_time", "returned an error", "2 tool calls", "1 failed"):
        assert text in html, text
    turns = html.split('class="grpo-turns"', 1)[1].split("</summary>", 1)[1]  # the opened card, in order
    assert turns.index("Let me look.") < turns.index("sunny in Paris") < turns.index("It is sunny in Paris.")
    assert 'class="grpo-turns"' in html and "score 1.00" in html and "A +0.71" in html


def test_terminal_summary_counts_tool_calls() -> None:
    from grpo_magic.frontends.progress import TerminalProgress

    out = io.StringIO()
    progress = TerminalProgress(stream=out, summary_every=1)
    progress(RunStarted(params={}, env_name="WeatherAgent", model="tiny-agent", output_dir="/tmp/x", max_steps=1))
    progress(_group())
    progress(StepLogged(step=1, metrics={"reward": 0.5}, max_steps=1, episodes=2))
    assert "[2 tool calls, 1 failed] It is sunny in Paris." in out.getvalue()
    assert "[0 tool calls] no idea" in out.getvalue()


def test_single_turn_groups_have_no_transcripts_and_render_as_before() -> None:
    pytest.importorskip("ipywidgets")
    from grpo_magic.dashboard.html import group_card_html

    plain = GroupScored(step=1, group=0, prompt="p", completions=["a", "b"], scores=[1.0, 0.0],
                        advantages=[0.7, -0.7], errors=[None, None], clipped=[False, False])
    assert plain.transcripts == [] and "grpo-turns" not in group_card_html(plain)
    assert math.isclose(plain.mean, 0.5)


# ---------------------------------------------------------------- real runs through TRL's tool loop

CELL_ENV = '''
from datasets import Dataset

SEEN = []  # id() of the env instance of every episode, in the order TRL reset them

class CellWeather:
    def build_dataset(self, tokenizer):
        cities = ["Paris", "Rome", "Oslo", "Lima"]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is the weather in {c}?"}]
                                             for c in cities * 4], "city": cities * 4})

    def reset(self, city, **row):
        self.city, self.calls = city, []
        SEEN.append(id(self))

    def get_weather(self, city: str) -> str:
        """Get today's weather in a city.

        Args:
            city: The city name.
        """
        self.calls.append(("get_weather", city))
        return f"sunny in {city}"

    def get_time(self, city: str) -> str:
        """Get the local time in a city.

        Args:
            city: The city name.
        """
        self.calls.append(("get_time", city))
        return f"12:00 in {city}"

    def score_episode(self, model, tokenizer, completion, city, messages, tool_calls):
        assert messages[0] == {"role": "user", "content": f"What is the weather in {city}?"}, messages[0]
        assert [(c["name"], c["arguments"].get("city")) for c in tool_calls] == self.calls[:len(tool_calls)]
        return 1.0 if ("get_weather", self.city) in self.calls else (0.25 if self.calls else 0.0)
'''


def _expected_from_transcript(turns: list[dict], city: str) -> float:
    calls = [(c["name"], c["arguments"].get("city")) for t in turns for c in t.get("tool_calls") or []]
    ran = [t for t in turns if t["role"] == "tool" and not t.get("error")]
    if ("get_weather", city) in calls[:len(ran)] and ran:
        return 1.0
    return 0.25 if ran else 0.0


@pytest.mark.long
def test_a_cell_agent_env_trains_whole_episodes_on_its_own_instances(shell) -> None:
    shell.run_cell_magic("grpo_env", "", CELL_ENV)
    run = shell.run_line_magic(
        "grpo_train", "--env CellWeather --model tiny-agent --max-steps 2 --batch-size 8 --rl-num-generations 4 "
                      "--rl-max-new-tokens 48 --lr 1e-3 --rl-kl-coef 0 --project-name cell-agent --run --blocking")
    assert run.status == "completed", run.reason
    assert not run.errors, run.errors[0]  # score_episode's own checks of messages and tool_calls held
    groups = list(run.groups)
    assert len(groups) == 4 and all(len(g["transcripts"]) == 4 for g in groups)
    turns = [t for g in groups for t in g["transcripts"]]
    with_result = [t for t in turns if any(m["role"] == "tool" for m in t)]
    assert with_result, "no episode got a tool result"
    assert any(t[-1]["role"] == "assistant" and any(m["role"] == "tool" for m in t) for t in turns)
    for g in groups:  # each score is what the episode's own instance saw, as its transcript shows
        for score, t in zip(g["scores"], g["transcripts"], strict=True):
            assert score == _expected_from_transcript(t, g["prompt"].rsplit(" ", 1)[1].rstrip("?")), t
    seen = shell.user_ns["SEEN"]
    assert len(seen) == 16 and len(set(seen[:8])) == 8 and len(set(seen[8:])) == 8  # one instance per rollout
    history = run.history[-1]
    assert "tools/call_frequency" in history and "tools/failure_frequency" in history
    assert (run.output_dir / "events.jsonl").read_text().count('"transcripts": [[{"role": "assistant"') == 4


@pytest.mark.long
def test_tool_results_are_masked_out_of_trls_loss_and_later_turns_are_trained(tmp_path: Path) -> None:
    """On TRL's own batch and loss: no gradient reaches the logits of tool-result tokens, some reaches later turns."""
    import torch

    from envs.weather_agent import WeatherAgentEnv
    from grpo_magic import GRPOParams
    from grpo_magic.environment.env import EnvSpec, prepare_env
    from grpo_magic.environment.reward import EnvReward
    from grpo_magic.models import load_model, load_tokenizer, resolve_model
    from grpo_magic.training.trainer import build_trainer

    path = resolve_model("tiny-agent")
    tokenizer = load_tokenizer(path)
    prepared = prepare_env(EnvSpec(name="WeatherAgentEnv", cls=WeatherAgentEnv), tokenizer)
    params = GRPOParams(model="tiny-agent", batch_size=16, rl_num_generations=8, rl_max_new_tokens=48, rl_kl_coef=0.0)
    reward = EnvReward(prepared.env, agent=prepared.agent)
    torch.manual_seed(0)
    trainer = build_trainer(model=load_model(path, tokenizer=tokenizer), tokenizer=tokenizer, reward=reward,
                            config=params.to_grpo_config(str(tmp_path / "mask-test"), max_steps=1),
                            dataset=prepared.dataset)
    trainer.model.train()
    # TRL's own batch, tool_mask included (what grpo_magic reads of it is trl_compat.BATCH_KEYS)
    batch = trainer._generate_and_score_completions([prepared.dataset[i] for i in range(2) for _ in range(8)])
    mask, ids, completion_mask = batch["tool_mask"], batch["completion_ids"], batch["completion_mask"]
    rows = [b for b in range(len(ids)) if (mask[b][completion_mask[b].bool()] == 0).any()]
    assert rows, "no episode of the batch had a tool result"
    for b in rows:
        real = completion_mask[b].bool()
        tool_text = tokenizer.decode(ids[b][real & (mask[b] == 0)])
        assert "<tool_response>" in tool_text and "</tool_response>" in tool_text, tool_text
        first_tool = int((real & (mask[b] == 0)).nonzero()[0])
        after = real & (mask[b] == 1)
        after[: first_tool] = False
        assert after.any(), "no assistant turn after the tool result"
        assert "<tool_response>" not in tokenizer.decode(ids[b][after])

    # TRL scores tokens with a fused LM head (no logits tensor), so look one step earlier: the final norm's
    # output at position t is used by nothing but the prediction of token t + 1.
    captured = []
    norm = trainer.model.model.norm
    def keep(module, args, out) -> None:  # returns None: the output stays as it is
        out.retain_grad()
        captured.append(out)

    handle = norm.register_forward_hook(keep)
    batch["advantages"] = torch.ones_like(batch["advantages"])  # every token counts: only the mask decides
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets before it calls compute_loss
    try:
        trainer.compute_loss(trainer.model, batch).backward()
    finally:
        handle.remove()
    width = ids.shape[1]
    grad = torch.cat([c.grad[:, -width - 1:-1] for c in captured]).abs().sum(-1)  # predicts completion token j
    loss_mask = (completion_mask * mask).bool()
    assert grad[~loss_mask].max() == 0  # tool-result (and padding) tokens get no gradient
    for b in rows:
        assert (grad[b][loss_mask[b]] > 0).all()  # every model-written token does, after the tool result too


@pytest.mark.long
def test_check_reports_the_tool_use_of_an_agent_env(shell) -> None:
    shell.run_cell_magic("grpo_env", "", CELLS["WeighParcel"])  # a tool named from words tiny-agent never saw
    # 8 prompts, as the must-show's test (test_tool_calls.py): how often a build closes its call depends on the
    # value (v2.1 here: p(</tool_call>) after the call's ``}}`` 0.17 to 1.0 over eight values), and the first
    # four prompts alone ran 6 calls of 16 on one build (research/tiny_agent/RESULTS-agent.md, "v2.1")
    report = shell.run_line_magic("grpo_check", "WeighParcel --model tiny-agent --samples 8 "
                                                "--rl-num-generations 4 --rl-max-new-tokens 64")
    agent = report.agent
    assert agent is not None and agent["episodes"] == 32
    assert agent["tool_call_share"] > 0.5 and agent["tool_calls"] >= 16  # tiny-agent calls tools
    assert 1.0 < agent["turns_mean"] <= 1 + 5  # an answer after the tool result, at most rl_max_tool_turns more
    assert all(len(g["transcripts"]) == 4 for g in report.groups)
    assert "tool use" in str(report) and "tool errors" in report._repr_html_()
    # the first call fits weigh_parcel's schema (grams: an integer) in most episodes, and the check says so
    assert 0.5 < agent["typed_call_share"] <= agent["offered_call_share"]
    assert "typed calls" in report._repr_html_()
    assert report.valid == 32 and not report.errors


@pytest.mark.long
def test_rescore_replays_an_agent_episode_from_its_transcript(tmp_path: Path) -> None:
    """A logged agent run rescored with an edited env: the tool calls are made again on fresh instances."""
    from envs.weather_agent import WeatherAgentEnv
    from grpo_magic import GRPOParams, rescore, train

    class Stricter(WeatherAgentEnv):  # the edit: no credit at all for the wrong tool
        def score_episode(self, model, tokenizer, completion, city, wants):
            return 1.0 if (wants, city) in self.calls else 0.0

    params = GRPOParams(model="tiny-agent", max_steps=1, batch_size=16, rl_num_generations=8, rl_max_new_tokens=48,
                        project_name=str(tmp_path / "run"))
    run = train(params, WeatherAgentEnv(), display=False)
    report = rescore(run, Stricter())
    assert report.summary["completions"] == 16 and report.summary["errors"] == 0
    for g, logged in zip(report.groups, run.groups, strict=True):
        assert g["old_scores"] == logged["scores"]
        assert g["new_scores"] == [1.0 if s == 1.0 else 0.0 for s in logged["scores"]]  # the same episodes, replayed


def test_an_agent_check_is_refused_while_a_run_trains_before_the_model_loads(monkeypatch) -> None:
    from envs.weather_agent import WeatherAgentEnv
    from grpo_magic import GRPOMagicError, check_env
    from grpo_magic import models as models_module
    from grpo_magic.training import run as run_module

    class Busy:  # stands for a run training in this process
        done, env_name, step = False, "OtherEnv", 3

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr(run_module, "_ACTIVE", Busy())
    monkeypatch.setattr(models_module, "load_model", no_model)
    with pytest.raises(GRPOMagicError, match=r"A run is training in this process \(OtherEnv, step 3\).*%grpo_stop"):
        check_env(WeatherAgentEnv(), model="tiny-agent", samples=2, num_generations=2)


def test_the_curves_add_trls_tool_metrics_when_the_run_has_them(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    from grpo_magic import replay

    for name, metrics in (("agent", {"reward": 0.5, "tools/call_frequency": 1.5, "tools/failure_frequency": 0.25}),
                          ("plain", {"reward": 0.5})):
        log = RunLog(tmp_path / name)
        log(RunStarted(params={}, env_name="E", model="tiny", output_dir=str(tmp_path / name), max_steps=2))
        for step in (1, 2):
            log(StepLogged(step=step, metrics=metrics, max_steps=2))
        log.close()
        dash = replay(str(tmp_path / name))
        shows = 'data-panel="tools"' in dash.curves_html
        assert shows == (name == "agent"), name
        if shows:
            assert "tool calls per episode" in dash.curves_html and "calls per episode: 1.5" in dash.curves_html
            assert dash.reward_png[:4] == b"\x89PNG"
