"""OpenEnv environments through ``from_openenv`` (issue 43): the env's reset/step loop as the episode.

Runs where the ``openenv`` extra is installed (its own venv in CI: ``scripts/ci_shared_envs.sh``; its mcp
cannot share one with verifiers'). An env written here with OpenEnv's own base classes, the echo env that
ships with ``openenv`` (the template ``openenv init`` writes), an MCP tool env and the local server that
OpenEnv serves an env from are each checked and trained on the offline models; GRPO raises the reward on one.
Tests without a tier marker are ``train`` (tests/conftest.py).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv.core")

from openenv.core import Action, Environment, MCPEnvironment, Observation, State  # noqa: E402

from grpo_magic import GRPOMagicError, GRPOParams, check_env, read_run_log, train  # noqa: E402
from grpo_magic.adapters import from_openenv  # noqa: E402
from grpo_magic.events import GroupScored  # noqa: E402

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)
LETTERS = "abcd"


class LetterAction(Action):
    message: str


class LetterObservation(Observation):
    instruction: str = ""
    share: float = 0.0


class LettersEnvironment(Environment[LetterAction, LetterObservation, State]):
    """OpenEnv's interface, the letters lesson: reset asks for a letter, the step's reward is its share."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, letters: str = "a"):
        super().__init__()
        self.letters = letters
        self.letter = letters[0]
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.letter = self.letters[(seed or 0) % len(self.letters)]
        self._state = State(episode_id=episode_id, step_count=0)
        return LetterObservation(instruction=f"Write the letter {self.letter} many times: ")

    def step(self, action: LetterAction, timeout_s=None, **kwargs):
        self._state.step_count += 1
        chars = [c for c in action.message.lower() if not c.isspace()]
        share = sum(c == self.letter for c in chars) / len(chars) if chars else 0.0
        return LetterObservation(instruction="", share=share, reward=share, done=True)

    @property
    def state(self):
        return self._state


# ---------------------------------------------------------------- what is refused, in one sentence


class PixelAction(Action):
    pixels: list[float]


class PixelEnvironment(LettersEnvironment):
    def step(self, action: PixelAction, timeout_s=None, **kwargs):
        return LetterObservation(reward=0.0, done=True)


class TwoTextAction(Action):
    message: str
    note: str


class TwoTextEnvironment(LettersEnvironment):
    def step(self, action: TwoTextAction, timeout_s=None, **kwargs):
        return LetterObservation(reward=float(len(action.message) > 3), done=True)


@pytest.mark.unit
@pytest.mark.parametrize(("env", "kwargs", "words"), [
    ("openenv/echo-env", {}, ["hub-hosted", "needs the network", "local server"]),
    ("https://openenv-echo-env.hf.space", {"action_field": "message"}, ["not on this machine", "127.0.0.1"]),
    (LettersEnvironment(), {}, ["got an instance", "pass the class"]),
    (dict, {}, ["got type", "not an OpenEnv Environment class"]),
    (PixelEnvironment, {}, ["PixelAction has no text field (fields: pixels)", "only text actions and MCP tool envs"]),
    (TwoTextEnvironment, {}, ["several text fields (message, note)", "action_field="]),
    (TwoTextEnvironment, {"action_field": "text"}, ["has no field 'text'"]),
    (LettersEnvironment, {"letterz": "a"}, ["could not be built", "letterz"]),
    (LettersEnvironment, {"n_prompts": 0}, ["n_prompts must be a whole number"]),
    (LettersEnvironment, {"prompts": ["x"]}, ["prompts= is only for MCP tool envs"]),
])
def test_what_cannot_be_mapped_is_one_sentence(env, kwargs, words):
    with pytest.raises(GRPOMagicError) as info:
        from_openenv(env, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


@pytest.mark.unit
def test_without_openenv_the_adapter_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core", None)
    with pytest.raises(GRPOMagicError, match=r'needs the openenv package.*pip install "grpo-magic\[openenv\]"'):
        from_openenv(LettersEnvironment)


@pytest.mark.unit
def test_reset_observations_are_the_prompts_and_the_step_reward_is_the_score():
    env = from_openenv(LettersEnvironment, letters="ab", n_prompts=4, seed=2)()
    data = env.build_dataset(None)
    assert data["prompt"] == ["Write the letter a many times: ", "Write the letter b many times: "] * 2
    assert data["seed"] == [2, 3, 4, 5]
    assert env.score_episode(None, None, "aab a", seed=2) == {"score": 0.75, "share": 0.75}
    assert env.score_episode(None, None, "aab a", seed=3)["score"] == 0.25
    chat = from_openenv(LettersEnvironment, n_prompts=1, system_prompt="Be brief.")().build_dataset(None)
    assert chat["prompt"][0] == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Write the letter a many times: "}]


# ---------------------------------------------------------------- trained, checked


def test_an_env_on_openenvs_base_classes_trains_with_scores_in_the_run_log_and_checks(tmp_path):
    Env = from_openenv(LettersEnvironment, letters=LETTERS, n_prompts=16)
    run = train(GRPOParams(**FAST, max_steps=2, project_name=str(tmp_path / "run")), Env, display=False)
    assert run.status == "completed", run.reason
    assert "components/share" in run.history[-1]
    logged = [e for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)]
    assert logged and all("seed" in e.columns and e.prompt.startswith("Write the letter") for e in logged)
    assert all(s == p["share"] for e in logged for s, p in zip(e.scores, e.components, strict=True))
    report = check_env(Env, samples=2, max_new_tokens=4)
    assert report.episodes == 8 and report.error_count == 0


def test_an_openenv_env_assigned_in_a_grpo_env_cell_checks_trains_rescores_and_evaluates(shell):
    shell.user_ns["LettersEnvironment"] = LettersEnvironment
    spec = shell.run_cell_magic("grpo_env", "", "from grpo_magic.adapters.openenv import from_openenv\n"
                                                "Letters = from_openenv(LettersEnvironment, letters='ab', n_prompts=8)\n")
    assert spec.name == "Letters" and spec.cls is shell.user_ns["Letters"]
    report = shell.run_line_magic("grpo_check", "Letters --samples 2 --rl-max-new-tokens 4")
    assert report.episodes == 8 and report.error_count == 0
    run = shell.run_line_magic("grpo_train", "--env Letters --model tiny --max-steps 1 --batch-size 8 "
                                             "--rl-num-generations 4 --rl-max-new-tokens 8 --run --blocking "
                                             "--project-name openenv-run")
    assert run.status == "completed", run.reason
    again = shell.run_line_magic("grpo_rescore", "--env Letters")  # each episode replayed from its logged seed
    assert [g["new_scores"] for g in again.groups] == [g["old_scores"] for g in again.groups]
    # %grpo_eval: the run folder's saved weights on held-out prompts (greedy episodes, scored by the OpenEnv env)
    evaluated = shell.run_line_magic("grpo_eval", f"Letters {run.output_dir} --greedy --baseline none")
    assert evaluated.summary["prompts"] > 0 and 0.0 <= evaluated.summary["greedy_mean"] <= 1.0


def _echo_template(tmp_path: Path) -> type:
    """The echo env that ships with openenv (``openenv init``'s template), rendered as ``openenv init`` does."""
    import openenv.cli.templates as templates

    root = Path(templates.__file__).parent / "openenv_env"
    package = tmp_path / "shipped_echo"
    (package / "server").mkdir(parents=True)
    names = {"__ENV_CLASS_NAME__": "ShippedEcho", "__ENV_TITLE_NAME__": "Shipped Echo", "__ENV_NAME__": "shipped_echo"}
    for source, target in [("__init__.py", "__init__.py"), ("models.py", "models.py"),
                           ("server/__init__.py", "server/__init__.py"),
                           ("server/__ENV_NAME___environment.py", "server/shipped_echo_environment.py")]:
        text = (root / source).read_text()
        for key, value in names.items():
            text = text.replace(key, value)
        if source == "__init__.py":
            text = ""  # the package's client needs a server; the env itself is what is trained here
        (package / target).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        from shipped_echo.server.shipped_echo_environment import ShippedEchoEnvironment
    finally:
        sys.path.remove(str(tmp_path))
    return ShippedEchoEnvironment


def test_the_echo_env_openenv_ships_trains_and_checks(tmp_path):
    echo = _echo_template(tmp_path)
    Env = from_openenv(echo, n_prompts=8)
    env = Env()
    assert env.build_dataset(None)["prompt"][0] == "Shipped Echo environment ready!"
    assert env.score_episode(None, None, "hello", seed=0) == {"score": 0.5, "message_length": 5.0}
    run = train(GRPOParams(**FAST, max_steps=2, project_name=str(tmp_path / "run")), Env, display=False)
    assert run.status == "completed", run.reason
    assert "components/message_length" in run.history[-1]
    report = check_env(Env, samples=2, max_new_tokens=4)
    assert report.episodes == 8 and report.error_count == 0


# ---------------------------------------------------------------- an MCP tool env: an agent env


class CounterMCPEnvironment(MCPEnvironment):
    """Tools on a FastMCP server; the reward is set by the episode's tool calls (the count reaching 3)."""

    def __init__(self):
        from fastmcp import FastMCP

        mcp = FastMCP("counter")
        self.count = 0

        @mcp.tool()
        def add(amount: int) -> str:
            """Add to the counter.

            Args:
                amount: How much to add.
            """
            self.count += amount
            return f"count is {self.count}"

        super().__init__(mcp)
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.count = 0
        return Observation(reward=0.0, metadata={"ready": True})

    def step(self, action, timeout_s=None, **kwargs):
        observation = super().step(action, timeout_s=timeout_s, **kwargs)
        if getattr(observation, "tool_name", None):
            observation.reward = float(self.count == 3)
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(reward=0.0, done=True)

    @property
    def state(self):
        return self._state


@pytest.mark.unit
def test_an_mcp_env_is_an_agent_env_whose_tools_step_it():
    from grpo_magic.environment.agent import agent_spec

    with pytest.raises(GRPOMagicError, match="is an MCP tool env: pass prompts="):
        from_openenv(CounterMCPEnvironment)
    Env = from_openenv(CounterMCPEnvironment, prompts=['Use the "add" tool with amount 3'])
    env = Env()
    spec = agent_spec(env, Env, env.get_tools())
    assert spec.tool_names == ["add"]
    assert spec.schemas[0]["function"]["parameters"]["properties"]["amount"]["type"] == "integer"
    episode = spec.factory()
    episode.reset(seed=0)
    assert episode.add(amount=1) == "count is 1" and episode.add(amount=2) == "count is 3"
    assert episode._env.score_episode(None, None, "done") == {"score": 1.0, "steps": 2.0}
    with pytest.raises(GRPOMagicError, match="gave no reward in this episode"):
        Env().score_episode(None, None, "no call")  # no reset, no call: no observation carried a reward


@pytest.mark.long
def test_an_mcp_env_trains_on_tiny_agent_with_observations_in_the_transcripts(tmp_path):
    Env = from_openenv(CounterMCPEnvironment, prompts=[f'Use the "add" tool with amount {n}' for n in (1, 2, 3, 3)])
    run = train(GRPOParams(model="tiny-agent", batch_size=4, rl_num_generations=4, rl_max_new_tokens=48,
                           max_steps=1, seed=0, project_name=str(tmp_path / "run")), Env, display=False,
                raise_on_failure=False)
    assert run.status == "completed", run.reason
    logged = [e for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)]
    turns = [t for e in logged for transcript in e.transcripts for t in transcript]
    assert any(t["role"] == "tool" and t["content"].startswith("count is") for t in turns)
    report = check_env(Env, model="tiny-agent", samples=1, max_new_tokens=48)
    assert report.episodes == 4


# ---------------------------------------------------------------- the local server OpenEnv serves


@pytest.fixture
def letters_server():
    import uvicorn
    from openenv.core import create_app

    app = create_app(lambda: LettersEnvironment(letters="ab"), LetterAction, LetterObservation, env_name="letters",
                     max_concurrent_envs=4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_the_local_server_is_an_env_too(letters_server, tmp_path):
    with pytest.raises(GRPOMagicError, match="needs action_field="):
        from_openenv(letters_server)
    Env = from_openenv(letters_server, action_field="message", n_prompts=8)
    env = Env()
    assert env.build_dataset(None)["prompt"][:2] == ["Write the letter a many times: ", "Write the letter b many times: "]
    assert env.score_episode(None, None, "bbba", seed=1)["score"] == 0.75
    run = train(GRPOParams(**FAST, max_steps=1, project_name=str(tmp_path / "run")), Env, display=False)
    assert run.status == "completed", run.reason
    with pytest.raises(GRPOMagicError, match="could not reach the OpenEnv server at http://127.0.0.1:1"):
        from_openenv("http://127.0.0.1:1", action_field="message")


# ---------------------------------------------------------------- GRPO raises the reward


@pytest.mark.lesson
def test_grpo_raises_the_reward_of_an_openenv_env(tmp_path):
    Env = from_openenv(LettersEnvironment, letters="a", n_prompts=64)
    params = GRPOParams(model="tiny", max_steps=30, batch_size=16, rl_num_generations=8, rl_max_new_tokens=16,
                        lr=5e-3, rl_kl_coef=0.0, seed=0, project_name=str(tmp_path / "run"))
    run = train(params, Env, display=False)
    rewards = [h["reward"] for h in run.history]
    assert run.status == "completed" and len(rewards) == 30
    start, end = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    print(f"OpenEnv letters: mean reward first 3 steps {start:.3f}, last 5 steps {end:.3f}")
    assert start < 0.2 and end > start + 0.15
