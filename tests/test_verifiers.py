"""verifiers v1 tasksets through ``from_verifiers`` (issue 43): its tasks as prompts, its rubric as the score.

Runs where the ``verifiers`` extra is installed (its own venv in CI: ``scripts/ci_shared_envs.sh``; its mcp
cannot share one with openenv's). Tasksets written here with verifiers' own classes (``vf.Taskset``,
``vf.Task``, ``@vf.reward``, ``@vf.metric``, a ``vf.Toolset`` with ``@vf.tool``) are checked and trained on
the offline models, single- and multi-turn. Tests without a tier marker are ``train`` (tests/conftest.py).
"""

from __future__ import annotations

import sys

import pytest

vf = pytest.importorskip("verifiers.v1")

from grpo_magic import GRPOMagicError, GRPOParams, check_env, read_run_log, rescore, train  # noqa: E402
from grpo_magic.adapters import from_verifiers  # noqa: E402
from grpo_magic.events import GroupScored  # noqa: E402

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)
LETTERS = "abcd"


class LetterData(vf.TaskData):
    letter: str = "a"


class LetterTask(vf.Task[LetterData]):
    """The letters lesson as a verifiers task: the share of the asked letter, and brevity at a lower weight."""

    @vf.reward(weight=0.75)
    async def share(self, trace: vf.Trace) -> float:
        chars = [c for c in trace.last_reply.lower() if not c.isspace()]
        return sum(c == self.data.letter for c in chars) / len(chars) if chars else 0.0

    @vf.reward(weight=0.25)
    async def brief(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 12)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class LettersConfig(vf.TasksetConfig):
    num_tasks: int = 16


class LettersTaskset(vf.Taskset[LetterTask, LettersConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            letter = LETTERS[i % len(LETTERS)]
            yield LetterTask(LetterData(prompt=f"Write the letter {letter} many times: ", letter=letter,
                                        system_prompt="Answer with letters only."), self.config.task)


# ---------------------------------------------------------------- refused in one sentence


class EndlessTaskset(LettersTaskset):
    INFINITE = True


class SyncTask(LetterTask):
    @vf.reward
    def share(self, trace):  # verifiers awaits rewards
        return 1.0


class RuntimeTask(LetterTask):
    @vf.reward
    async def share(self, trace, runtime):
        return 1.0


class ContainerTask(LetterTask):
    NEEDS_CONTAINER = True


class GpuTask(LetterTask):
    pass


def _taskset_of(task_cls, config=None, **data):
    class OneTaskset(vf.Taskset[task_cls, vf.TasksetConfig]):
        def load(self):
            yield task_cls(LetterData(prompt="Write a: ", **data), config or self.config.task)

    return OneTaskset(vf.TasksetConfig())


@pytest.mark.unit
@pytest.mark.parametrize(("taskset", "kwargs", "words"), [
    ("reverse-text", {}, ["got a str (a taskset id", "not a verifiers v1 Taskset"]),
    (object(), {}, ["got a object", "pass a vf.Taskset"]),
    (EndlessTaskset(LettersConfig()), {}, ["is infinite; pass limit="]),
    (LettersTaskset(LettersConfig()), {"limit": 0}, ["limit must be a whole number"]),
    (LettersTaskset(LettersConfig(num_tasks=0)), {}, ["yielded no tasks"]),
    (_taskset_of(SyncTask), {}, ["SyncTask.share is not async def", "verifiers awaits"]),
    (_taskset_of(RuntimeTask), {}, ["RuntimeTask.share needs a sandbox runtime"]),
    (_taskset_of(ContainerTask), {}, ["ContainerTask needs a container"]),
    (_taskset_of(GpuTask, resources=vf.TaskResources(gpu="A100")), {}, ["asks for a GPU (A100)"]),
    (_taskset_of(LetterTask, vf.TaskConfig(judges=[{"id": "reference"}])), {},
     ["scored by an LLM judge", "over the network"]),
])
def test_what_cannot_be_mapped_is_one_sentence(taskset, kwargs, words):
    with pytest.raises(GRPOMagicError) as info:
        from_verifiers(taskset, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


@pytest.mark.unit
def test_without_verifiers_the_adapter_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(GRPOMagicError, match=r'needs the verifiers package.*pip install "grpo-magic\[verifiers\]"'):
        from_verifiers(LettersTaskset)


@pytest.mark.unit
def test_the_tasks_are_the_prompts_and_the_rubric_scores_the_trace():
    env = from_verifiers(LettersTaskset, limit=4)()  # a class is built with its default config
    data = env.build_dataset(None)
    assert data["task_index"] == [0, 1, 2, 3]
    assert data["prompt"][1] == [{"role": "system", "content": "Answer with letters only."},
                                 {"role": "user", "content": "Write the letter b many times: "}]
    out = env.score_episode(None, None, "bbbb a", task_index=1)
    assert out == {"score": pytest.approx(0.75 * 0.8 + 0.25), "share": 0.8, "brief": 1.0, "turns": 1.0}
    assert env.score_episode(None, None, "a" * 20, task_index=0)["score"] == pytest.approx(0.75)


# ---------------------------------------------------------------- single-turn: trained, checked, rescored


def test_a_taskset_trains_with_its_rubric_as_components_and_checks(tmp_path):
    Env = from_verifiers(LettersTaskset(LettersConfig()))
    run = train(GRPOParams(**FAST, max_steps=2, project_name=str(tmp_path / "run")), Env, display=False)
    assert run.status == "completed", run.reason
    assert {"components/share", "components/brief", "components/turns"} <= set(run.history[-1])
    logged = [e for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)]
    assert logged and all("task_index" in e.columns for e in logged)
    for e in logged:
        for score, parts in zip(e.scores, e.components, strict=True):
            assert score == pytest.approx(min(1.0, 0.75 * parts["share"] + 0.25 * parts["brief"]))
    again = rescore(run, Env)
    assert [g["new_scores"] for g in again.groups] == [g["old_scores"] for g in again.groups]
    report = check_env(Env, samples=2, max_new_tokens=4)
    assert report.episodes == 8 and report.error_count == 0


def test_a_taskset_assigned_in_a_grpo_env_cell_checks_trains_rescores_and_evaluates(shell):
    shell.user_ns["LettersTaskset"] = LettersTaskset
    spec = shell.run_cell_magic("grpo_env", "", "from grpo_magic.adapters.verifiers import from_verifiers\n"
                                                "Letters = from_verifiers(LettersTaskset, limit=8)\n")
    assert spec.name == "Letters" and spec.cls is shell.user_ns["Letters"]
    report = shell.run_line_magic("grpo_check", "Letters --samples 2 --rl-max-new-tokens 4")
    assert report.episodes == 8 and report.error_count == 0
    run = shell.run_line_magic("grpo_train", "--env Letters --model tiny --max-steps 1 --batch-size 8 "
                                             "--rl-num-generations 4 --rl-max-new-tokens 8 --run --blocking "
                                             "--project-name vf-run")
    assert run.status == "completed", run.reason
    again = shell.run_line_magic("grpo_rescore", "--env Letters")
    assert [g["new_scores"] for g in again.groups] == [g["old_scores"] for g in again.groups]
    evaluated = shell.run_line_magic("grpo_eval", f"Letters {run.output_dir} --greedy --baseline none")
    assert evaluated.summary["prompts"] > 0 and 0.0 <= evaluated.summary["greedy_mean"] <= 1.0


# ---------------------------------------------------------------- multi-turn: a toolset's tools, TRL's tool loop


class VaultToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "vault"

    @vf.tool
    def open_box(self, code: int) -> str:
        """Open the box with a code.

        Args:
            code: The box's code, a number.
        """
        return "opened" if code == 7 else "wrong code"


class VaultTask(vf.Task[vf.TaskData]):
    @classmethod
    def toolsets(cls, config):
        return [VaultToolset(vf.ToolsetConfig())]

    @vf.reward
    async def opened(self, trace: vf.Trace) -> float:
        return float(any(vf.types.content_text(m.content) == "opened" for m in trace.tool_messages))

    @vf.metric
    async def calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class VaultTaskset(vf.Taskset[VaultTask, vf.TasksetConfig]):
    def load(self):
        for _ in range(4):
            yield VaultTask(vf.TaskData(prompt='Use the "vault_open_box" tool with code 7'), self.config.task)


@pytest.mark.unit
def test_a_taskset_with_a_toolset_is_an_agent_env_whose_episode_is_the_trace():
    from grpo_magic.environment.agent import agent_spec

    Env = from_verifiers(VaultTaskset)
    env = Env()
    spec = agent_spec(env, Env, env.get_tools())
    assert spec.tool_names == ["vault_open_box"]
    schema = spec.schemas[0]["function"]
    assert schema["parameters"]["properties"]["code"] == {"type": "integer", "description": "The box's code, a number."}
    episode = spec.factory()
    episode.reset(task_index=0)
    assert episode.vault_open_box(code=3) == "wrong code" and episode.vault_open_box(code=7) == "opened"
    messages = [{"role": "user", "content": 'Use the "vault_open_box" tool with code 7'},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "vault_open_box", "arguments": {"code": 7}}}]},
                {"role": "tool", "name": "vault_open_box", "content": "opened"},
                {"role": "assistant", "content": "It is open."}]
    out = episode._env.score_episode(None, None, "It is open.", task_index=0, messages=messages)
    assert out == {"score": 1.0, "opened": 1.0, "calls": 1.0}
    assert env.score_episode(None, None, "no tools", task_index=0)["score"] == 0.0


@pytest.mark.long
def test_a_multi_turn_taskset_trains_on_tiny_agent_with_tool_turns_in_the_transcripts(tmp_path):
    Env = from_verifiers(VaultTaskset)  # tiny-agent's call takes about 40 of its tokens: room for the second turn
    run = train(GRPOParams(model="tiny-agent", batch_size=4, rl_num_generations=4, rl_max_new_tokens=128,
                           max_steps=1, seed=0, project_name=str(tmp_path / "run")), Env, display=False)
    assert run.status == "completed", run.reason
    assert "components/opened" in run.history[-1]
    logged = [e for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)]
    turns = [t for e in logged for transcript in e.transcripts for t in transcript]
    assert any(t["role"] == "tool" and t["content"] in ("opened", "wrong code") for t in turns)
    report = check_env(Env, model="tiny-agent", samples=1, max_new_tokens=128)
    assert report.episodes == 4 and report.error_count == 0
