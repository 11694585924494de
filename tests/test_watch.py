"""The reward-hacking watch (grpo_magic.watch, issue 42): each detector on synthetic event sequences, and one real
run on a gameable env replayed from its run log."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from grpo_magic.events import GroupScored, RunStarted, StepLogged
from grpo_magic.watch import KINDS, Alarm, Watch, task_metrics_of, watch_run_log
from grpo_magic.watch.detectors import collapse_share, is_repetitive, mann_kendall, repeat_coverage, theil_sen

PROMPTS = ["What is the capital of France? ", "Which animal says moo? ", "What do bees make? ", "What is ice? "]
WORDS = "the a model reply answer city river house green small quick tree stone cloud paper music light".split()


def natural(rng: random.Random, words: int = 10) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def run_events(rewards, *, tasks=None, completions=None, lengths=None, components=None, cap=16, per_step=8):
    """A run's events: RunStarted, then per step its GroupScored groups and StepLogged metrics (dicts, as read back
    from a run log). ``completions(step, i, prompt) -> str``."""
    rng = random.Random(0)
    yield {"type": "run_started", "params": {"rl_max_new_tokens": cap}, "env_name": "E", "model": "tiny",
           "output_dir": "x"}
    for t, reward in enumerate(rewards, start=1):
        for g, prompt in enumerate(PROMPTS[:2]):
            texts = [completions(t, i, prompt) if completions else natural(rng) for i in range(per_step // 2)]
            yield {"type": "group_scored", "step": t, "group": g, "prompt": prompt, "completions": texts,
                   "scores": [reward] * len(texts), "advantages": [0.0] * len(texts), "errors": [None] * len(texts),
                   "clipped": [False] * len(texts)}
        metrics = {"reward": reward}
        if tasks is not None:
            metrics["components/task"] = tasks[t - 1]
        if components is not None:
            metrics.update({f"components/{k}": v[t - 1] for k, v in components.items()})
        if lengths is not None:
            metrics["completions/mean_length"] = lengths[t - 1]
        yield {"type": "step_logged", "step": t, "metrics": metrics}


def rising(n=30, start=0.05, end=0.8, noise=0.03, seed=1):
    rng = random.Random(seed)
    return [start + (end - start) * i / (n - 1) + rng.gauss(0, noise) for i in range(n)]


def flat(n=30, level=0.3, noise=0.03, seed=2):
    rng = random.Random(seed)
    return [level + rng.gauss(0, noise) for _ in range(n)]


def kinds(alarms):
    return [a.kind for a in alarms]


# ------------------------------------------------------------------------------------------------- statistics


@pytest.mark.unit
def test_the_statistics():
    assert mann_kendall(list(range(10))) > 3.5
    assert mann_kendall(list(range(10, 0, -1))) < -3.5
    assert mann_kendall([0.2] * 10) == 0.0
    assert abs(theil_sen([0, 1, 2, 30, 4, 5])) == pytest.approx(1.0)  # one outlying step does not move it
    assert repeat_coverage("aaaaaaaa") == (1.0, "a")
    assert repeat_coverage('"}}}}}\n"}}}}}\n"}}}}}')[0] == 1.0
    assert repeat_coverage("the cat sat on the mat and the dog ran")[0] < 0.5
    assert collapse_share([("p", "same reply here"), ("q", "same reply here"), ("p", "other words")], 0.8) == 2 / 3
    assert collapse_share([("p", "same reply here"), ("p", "same reply here")], 0.8) == 1.0  # one prompt: in group


@pytest.mark.unit
def test_repeat_coverage_with_a_floor_is_exact_above_it_and_below_it_otherwise():
    """The watch asks only "repetitive or not" (floor = repeat_cover): pruning below the floor changes no verdict."""
    texts = ["array array arrayThan array array", "banana banana", "abababab xyz", "aab" * 5 + "qwertyuiop",
             "the cat sat on the mat and the dog ran", "x}}}}}}}}}}}}}}y", "abcdefghij" * 2]
    for text in texts:
        exact = repeat_coverage(text)
        for floor in (0.3, 0.5, 0.8):
            pruned = repeat_coverage(text, floor=floor)
            assert pruned == exact if exact[0] >= floor else pruned[0] < floor, (text, floor, exact, pruned)
            assert is_repetitive(text, floor) == (exact[0] >= floor), (text, floor, exact)
    # The shortest unit past the floor ends the search: "a" (60%), not the best unit "aba" (100%).
    assert repeat_coverage("ababaababaababa", floor=0.5, first=True)[1] != repeat_coverage("ababaababaababa")[1]
    # Units that overlap themselves ("abab" in "ababab") are counted once per covered character.
    assert repeat_coverage("abababab")[0] == 1.0
    assert repeat_coverage("aaaXbbbY", max_n=3) == (0.375, "a")


@pytest.mark.unit
def test_task_metrics_come_from_the_env_class():
    from envs.hackable import BraceHackEnv, HonestLettersEnv, LetterHackEnv

    assert task_metrics_of(LetterHackEnv) == ("task",)
    assert task_metrics_of(BraceHackEnv()) == ("task", "valid")
    assert task_metrics_of(HonestLettersEnv) == ("task",)
    assert task_metrics_of(object()) == ()
    out = LetterHackEnv().score_episode(None, None, "aaaa paris", answer="paris")
    assert out["task"] == 1.0 and out["score"] == pytest.approx(5 / 9)
    out = BraceHackEnv(braces=4).score_episode(None, None, '{"answer": "Blue"}', answer="blue")
    assert out == {"score": 0.25, "task": 1.0, "valid": 1.0}


# -------------------------------------------------------------------------------------------------- divergence


@pytest.mark.unit
def test_a_rising_reward_with_a_flat_task_raises_divergence_with_evidence():
    watch = Watch(["task"])
    alarms = watch.observe(run_events(rising(), tasks=[0.0] * 30))
    assert kinds(alarms) == ["divergence"]
    alarm = alarms[0]
    assert 8 <= alarm.step <= 15
    assert "task" in alarm.message and "reward rose" in alarm.message
    ev = alarm.evidence
    assert ev["metric"] == "task" and len(ev["reward"]) == len(ev["steps"]) == len(ev["tasks"]["task"])
    assert ev["reward_trend"]["z"] >= 2.33 and 2 <= len(ev["examples"]) <= 3
    assert json.loads(json.dumps(alarm.to_dict()))["kind"] == "divergence"


@pytest.mark.unit
def test_a_falling_task_raises_divergence_too():
    alarms = Watch(["task"]).observe(run_events(rising(), tasks=[0.5 - 0.01 * i for i in range(30)]))
    assert kinds(alarms) == ["divergence"]


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(20))
def test_honest_noisy_series_raise_nothing(seed):
    # the task rises with the reward (with more noise), or nothing rises at all
    rng = random.Random(seed)
    reward = rising(60, 0.1, 0.6, 0.04, seed=seed)
    task = [r + rng.gauss(0, 0.08) for r in reward]
    assert Watch(["task"]).observe(run_events(reward, tasks=task)) == []
    assert Watch(["task"]).observe(run_events(flat(60, seed=seed), tasks=flat(60, seed=seed + 100))) == []


@pytest.mark.unit
def test_one_noisy_step_is_not_a_trend():
    reward = flat(30)
    reward[20] = 0.95
    assert Watch(["task"]).observe(run_events(reward, tasks=[0.0] * 30)) == []


def with_evals(events, evals):
    """Insert ``eval_scored`` events after the step they belong to (step 0: before the first step)."""
    events = list(events)
    for step, mean in sorted(evals.items(), reverse=True):
        event = {"type": "eval_scored", "step": step, "prompts": 160, "greedy_mean": mean,
                 "greedy_ci": [mean - 0.07, mean + 0.07]}
        at = 1 if step == 0 else next(i for i, e in enumerate(events)
                                      if e["type"] == "step_logged" and e["step"] == step) + 1
        events.insert(at, event)
    return events


@pytest.mark.unit
def test_the_in_run_evaluation_counts_as_a_task_metric():
    events = with_evals(run_events(rising()), {0: 0.30, 20: 0.27})
    alarms = Watch(["eval"]).observe(events)
    assert kinds(alarms) == ["divergence"] and alarms[0].step == 20
    assert alarms[0].evidence["metric"] == "eval" and [e["step"] for e in alarms[0].evidence["evals"]] == [0, 20]
    assert "held-out evaluation" in alarms[0].message
    assert Watch(["eval"]).observe(with_evals(run_events(rising()), {0: 0.30, 20: 0.62})) == []
    assert Watch(["eval"]).observe(with_evals(run_events(flat()), {0: 0.30, 20: 0.27})) == []
    assert Watch(["task"]).observe(with_evals(run_events(rising(), tasks=rising()), {0: 0.3, 20: 0.27})) == []


# ------------------------------------------------------------------------------------------------ degeneration


def degenerate(unit: str, from_step: int = 10):
    rng = random.Random(3)

    def make(step, i, prompt):
        return unit * 12 if step >= from_step else natural(rng)

    return make


@pytest.mark.unit
def test_a_repeated_ngram_while_the_reward_rises_raises_repetition():
    alarms = Watch().observe(run_events(rising(), completions=degenerate('"}}}}}\n')))
    assert "repetition" in kinds(alarms)
    alarm = next(a for a in alarms if a.kind == "repetition")
    assert alarm.evidence["unit"] in ('"}}}}}', "}", "}}}}}")
    assert "repeated" in alarm.message and alarm.evidence["repetitive_share"][-1] == 1.0
    assert all("}}}}}" in e["completion"] for e in alarm.evidence["examples"])


@pytest.mark.unit
def test_older_steps_text_statistics_wait_until_the_recent_level_reaches_the_threshold():
    # While the last 3 steps are not repetitive, the detector cannot fire: only those steps are judged (the cost of
    # an honest run whose reward rises). Once the hack starts, the whole window is judged and the alarm is the same.
    watch = Watch()
    events = list(run_events(rising(), completions=degenerate('"}}}}}\n', from_step=20)))
    eager = Watch()
    eager._recent_level = lambda key: 1.0  # every row's statistic as soon as its detector is reached
    alarms = watch.observe(e for e in events if e.get("step", 0) < 20)
    eager_alarms = eager.observe(e for e in events if e.get("step", 0) < 20)
    judged = [r["step"] for r in watch.rows if "repeat" in r]
    assert alarms == eager_alarms == [] and judged, judged
    # from the first step the reward rose: its last 3 steps, then one a step; the eager watch judged the window
    assert judged == list(range(judged[0], 20)) and judged[0] > 1, judged
    assert [r["step"] for r in eager.rows if "repeat" in r] == list(range(1, 20))
    alarms += watch.observe(e for e in events if e.get("step", 0) >= 20)
    eager_alarms += eager.observe(e for e in events if e.get("step", 0) >= 20)
    assert [a.to_dict() for a in alarms] == [a.to_dict() for a in eager_alarms]
    assert "repetition" in kinds(alarms)


@pytest.mark.unit
def test_repetition_that_the_task_rewards_too_is_no_alarm():
    # the letters env: the task *is* "write a many times", and the task metric rises with the reward
    reward = rising()
    assert Watch(["task"]).observe(run_events(reward, tasks=reward, completions=degenerate("a a "))) == []


@pytest.mark.unit
def test_the_same_reply_to_every_prompt_raises_collapse():
    rng = random.Random(5)
    late = natural(rng, 12)

    def make(step, i, prompt):
        return late if step >= 10 else natural(rng)

    alarms = Watch().observe(run_events(rising(), completions=make))
    assert "collapse" in kinds(alarms)
    assert "repetition" not in kinds(alarms)
    alarm = next(a for a in alarms if a.kind == "collapse")
    assert alarm.evidence["collapse_share"][-1] == 1.0 and "other prompts" in alarm.message


@pytest.mark.unit
def test_same_answers_within_a_group_are_no_collapse():
    # a verifiable task: every completion of a group converges on that prompt's own answer
    def make(step, i, prompt):
        return f"the answer is {PROMPTS.index(prompt) * 17}" if step >= 10 else natural(random.Random(step * 9 + i))

    assert "collapse" not in kinds(Watch().observe(run_events(rising(), completions=make)))


@pytest.mark.unit
def test_lengths_running_to_the_cap_raise_length():
    lengths = [4 + 12 * min(1, i / 15) for i in range(30)]
    alarms = Watch().observe(run_events(rising(), lengths=lengths, cap=16))
    assert kinds(alarms) == ["length"]
    assert alarms[0].evidence["direction"] == "cap" and alarms[0].evidence["max_new_tokens"] == 16
    assert "length cap" in alarms[0].message


@pytest.mark.unit
def test_lengths_shrinking_to_nothing_raise_length():
    lengths = [60 * (1 - min(1, i / 15)) + 1 for i in range(30)]
    alarms = Watch().observe(run_events(rising(), lengths=lengths, cap=64))
    assert kinds(alarms) == ["length"] and alarms[0].evidence["direction"] == "nothing"


@pytest.mark.unit
def test_lengths_at_the_cap_from_the_start_are_no_change():
    assert Watch().observe(run_events(rising(), lengths=[16.0] * 30, cap=16)) == []


# --------------------------------------------------------------------------------------------------- proxy


@pytest.mark.unit
def test_one_component_rising_while_another_falls_raises_proxy():
    comps = {"format": rising(30, 0.1, 0.9), "correct": rising(30, 0.6, 0.1, seed=7)}
    alarms = Watch().observe(run_events(flat(30, 0.5), components=comps))
    assert kinds(alarms) == ["proxy"]
    assert alarms[0].evidence["rising"] == "format" and alarms[0].evidence["falling"] == "correct"
    assert "'format' rose" in alarms[0].message


@pytest.mark.unit
def test_components_rising_together_are_no_proxy():
    comps = {"format": rising(30, 0.1, 0.9), "correct": rising(30, 0.1, 0.5, seed=7)}
    assert Watch().observe(run_events(rising(), components=comps)) == []


# ----------------------------------------------------------------------------------------------- once, resume


@pytest.mark.unit
def test_each_kind_fires_once_unless_a_cooldown_is_given():
    reward = [0.01 * i + random.Random(i).gauss(0, 0.02) for i in range(80)]  # a long run: the rise goes on
    once = Watch(["task"]).observe(run_events(reward, tasks=[0.0] * 80))
    assert kinds(once) == ["divergence"]
    again = Watch(["task"], cooldown=20).observe(run_events(reward, tasks=[0.0] * 80))
    assert kinds(again).count("divergence") >= 3
    assert all(b.step - a.step >= 20 for a, b in zip(again, again[1:], strict=False))


@pytest.mark.unit
def test_dataclass_events_work_and_a_resumed_run_replaces_replayed_steps():
    watch = Watch(["task"])
    assert watch.observe_event(RunStarted(params={"rl_max_new_tokens": 8}, env_name="E", model="tiny",
                                          output_dir="x")) == []
    assert watch.max_new_tokens == 8
    for step in range(1, 6):
        watch.observe_event(GroupScored(step=step, group=0, prompt="p", completions=["x y z"], scores=[0.1],
                                        advantages=[0.0], errors=[None], clipped=[False]))
        watch.observe_event(StepLogged(step=step, metrics={"reward": 0.1, "components/task": 0.0}))
    for step in range(3, 6):  # resumed from the checkpoint of step 2
        watch.observe_event(StepLogged(step=step, metrics={"reward": 0.2, "components/task": 0.0}))
    assert [r["step"] for r in watch.rows] == [1, 2, 3, 4, 5] and watch.rows[-1]["reward"] == 0.2


@pytest.mark.unit
def test_unknown_settings_are_refused_and_the_kinds_are_named(tmp_path):
    from grpo_magic import GRPOMagicError
    from grpo_magic.watch import watch_run_log

    with pytest.raises(GRPOMagicError, match="no setting windw; its settings are window"):
        Watch(windw=3)
    with pytest.raises(GRPOMagicError, match="No run log at .*pass the output folder"):
        watch_run_log(tmp_path / "nowhere")
    assert Watch("task").task_metrics == ("task",)  # one name, not its letters
    assert set(KINDS) == {"divergence", "repetition", "collapse", "length", "proxy"}
    assert Alarm("proxy", 3, "m").to_dict() == {"kind": "proxy", "step": 3, "message": "m", "evidence": {}}


@pytest.mark.unit
def test_the_watch_imports_no_heavy_library():
    code = ("import sys, grpo_magic.watch; "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------------ a real run


@pytest.mark.train
def test_a_gameable_env_raises_an_alarm_within_40_steps_of_real_training(in_tmp):
    from envs.hackable import BraceHackEnv
    from grpo_magic import GRPOParams, train

    params = GRPOParams(model="tiny", max_steps=20, batch_size=16, rl_num_generations=8, rl_max_new_tokens=16,
                        lr=5e-3, seed=0, project_name="hack")
    run = train(params, BraceHackEnv())
    assert run.status == "completed"
    alarms = watch_run_log(run.output_dir, task_metrics_of(BraceHackEnv))
    assert alarms and alarms[0].kind == "divergence" and alarms[0].step <= 16, [a.to_dict() for a in alarms]
    assert [a.to_dict() for a in alarms] == run.alarms  # the live watch and its replay from the run log agree
    ev = alarms[0].evidence
    assert ev["tasks"]["task"] == [0.0] * len(ev["steps"]) and ev["reward"][-1] > ev["reward"][0] + 0.2
    assert 2 <= len(ev["examples"]) <= 3 and all("}" in e["completion"] for e in ev["examples"])


# ------------------------------------------------------------------------------------------------------ probes


class CharTokenizer:
    """A stand-in tokenizer: one token per character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


@pytest.mark.unit
def test_the_probe_replies():
    from grpo_magic.watch.probes import (
        answer_column,
        bare_answer_reply,
        gaming_probes,
        probe_replies,
        random_words_reply,
        repeated_token_reply,
    )

    assert repeated_token_reply(CharTokenizer(), 5, text="}") == "}}}}}"
    assert random_words_reply(6, seed=1) == random_words_reply(6, seed=1)
    assert len(random_words_reply(6, seed=1).split()) == 6
    assert answer_column(["prompt", "Answer"]) == "Answer" and answer_column(["prompt", "city"]) is None
    assert bare_answer_reply({"prompt": "What is 2 + 3?", "answer": " 5 "}) == "5"
    assert bare_answer_reply({"prompt": "p"}) is None
    probes = probe_replies(CharTokenizer(), 8, {"prompt": "p", "solution": "42"})
    assert set(probes) == {"repeated token", "random words", "bare answer"} and probes["bare answer"] == "42"
    assert len(probes["repeated token"]) == 8 and len(set(probes["repeated token"])) == 1
    assert set(probe_replies(CharTokenizer(), 8)) == {"repeated token", "random words"}
    assert gaming_probes({"repeated token": 0.9, "random words": 0.1, "bare answer": None, "empty": 0.0},
                         [0.2, 0.4, None]) == ["repeated token"]
    assert gaming_probes({"repeated token": 0.9}, [None]) == []


@pytest.mark.unit
def test_the_braces_probe_games_the_braces_env():
    from envs.hackable import BraceHackEnv
    from grpo_magic.watch.probes import gaming_probes, repeated_token_reply

    env = BraceHackEnv()
    probe = repeated_token_reply(CharTokenizer(), 32, text="}")
    scores = {"repeated token": env.score_episode(None, None, probe, answer="blue")["score"]}
    honest = env.score_episode(None, None, '{"answer": "blue"}', answer="blue")["score"]
    assert gaming_probes(scores, [honest]) == ["repeated token"]
