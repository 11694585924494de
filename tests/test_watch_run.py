"""The reward-hacking watch wired into training and the surfaces (issue 42): real runs on tiny raise alarms on a
gameable env (run.alarms, the run log, train/alarms in a tracker, one terminal line), stop with --on-alarm stop,
raise none on an honest env; the CLI's flags; the check's probes; rescore's alarms. One gameable run is shared by
the module (``hacked``)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest

from grpo_magic import GRPOParams, read_run_log
from grpo_magic.errors import GRPOMagicError
from grpo_magic.events import AlarmRaised, RunFinished, RunStarted, StatusChanged, StepLogged

#: The letters recipe of the README (bench/watch.py's LETTERS), short.
LETTERS = dict(model="tiny", batch_size=16, rl_num_generations=8, rl_max_new_tokens=16, lr=5e-3, seed=0)


@pytest.fixture(scope="module")
def hacked(tmp_path_factory):
    """LetterHackEnv on tiny, 20 steps, the default watch (the env's task_metrics) and on_alarm warn, reported to
    TensorBoard; the terminal progress written to a buffer."""
    from envs.hackable import LetterHackEnv
    from grpo_magic import train
    from grpo_magic.frontends.progress import TerminalProgress

    out = tmp_path_factory.mktemp("hack") / "run"
    terminal = io.StringIO()
    params = GRPOParams(**LETTERS, max_steps=20, project_name=str(out), report_to="tensorboard")
    run = train(params, LetterHackEnv(), callbacks=[TerminalProgress(terminal, summary_every=0)])
    return run, terminal.getvalue()


@pytest.mark.train
def test_a_gameable_run_raises_an_alarm_with_its_evidence(hacked):
    run, _ = hacked
    assert run.status == "completed"
    assert run.alarms, "no alarm in 20 steps of LetterHackEnv"
    first = run.alarms[0]
    assert set(first) == {"kind", "step", "message", "evidence"}
    assert first["kind"] == "divergence" and first["step"] <= 16 and "'task'" in first["message"]  # the bench: 8-15
    ev = first["evidence"]
    assert ev["tasks"]["task"] == [0.0] * len(ev["steps"]) and ev["reward"][-1] > ev["reward"][0]
    assert 2 <= len(ev["examples"]) <= 3 and all("completion" in e for e in ev["examples"])


@pytest.mark.train
def test_alarms_are_in_the_run_log_after_their_step_and_replay_the_same(hacked):
    from grpo_magic.watch import watch_run_log

    run, _ = hacked
    events = list(read_run_log(run.output_dir))
    logged = [e for e in events if isinstance(e, AlarmRaised)]
    assert [(a.kind, a.step, a.message) for a in logged] == [(a["kind"], a["step"], a["message"]) for a in run.alarms]
    assert logged[0].evidence == run.alarms[0]["evidence"]
    at = events.index(logged[0])
    assert isinstance(events[at - 1], StepLogged) and events[at - 1].step == logged[0].step
    started = next(e for e in events if isinstance(e, RunStarted))
    assert started.params["task_metrics"] == ["task"] and started.params["on_alarm"] == "warn"
    replayed = watch_run_log(run.output_dir, ("task",))  # the log holds all the watch read
    assert [(a.kind, a.step) for a in replayed] == [(a["kind"], a["step"]) for a in run.alarms]


@pytest.mark.train
def test_train_alarms_reaches_the_tracker_and_the_terminal_has_one_line_per_alarm(hacked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, terminal = hacked
    (events,) = Path(run.output_dir).glob("runs/*/events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    counts = {s.step: s.value for s in acc.Scalars("train/alarms")}
    first = run.alarms[0]["step"]
    assert counts[first - 1] == 0 and counts[first] >= 1 and counts[max(counts)] == len(run.alarms)
    lines = [line for line in terminal.splitlines() if "ALARM" in line]
    assert len(lines) == len(run.alarms)
    assert lines[0].startswith(f"grpo: ALARM ({run.alarms[0]['kind']}) at step {first}: The reward rose")


@pytest.mark.train
def test_rescore_shows_the_alarms_of_the_run_log(hacked):
    from envs.hackable import LetterHackEnv
    from grpo_magic import rescore

    run, _ = hacked
    report = rescore(run.output_dir, LetterHackEnv, steps="18:20")
    assert [(a["kind"], a["step"]) for a in report.alarms] == [(a["kind"], a["step"]) for a in run.alarms]
    assert "alarm" in repr(report) and "alarm (divergence)" in report._repr_html_()


@pytest.mark.train
def test_the_cli_stops_on_an_alarm_with_a_checkpoint(cli, in_tmp):
    out = in_tmp / "stopped"
    result = cli(["train", "--model", "tiny", "--rl-env-module", "envs.hackable", "--rl-env-class", "LetterHackEnv",
                  "--max-steps", "40", "--batch-size", "16", "--rl-num-generations", "8", "--rl-max-new-tokens", "16",
                  "--lr", "5e-3", "--seed", "0", "--project-name", str(out), "--watch", "task", "--on-alarm", "stop"],
                 cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 3, result.stderr[-2000:]
    assert "grpo: ALARM (divergence)" in result.stderr and "stopped by the reward-hacking watch" in result.stderr
    events = list(read_run_log(out))
    alarm = next(e for e in events if isinstance(e, AlarmRaised))
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.status == "stopped"
    assert f"divergence alarm at step {alarm.step}" in finished.reason
    assert finished.steps <= alarm.step + 1 <= 40
    checkpoint = out / f"checkpoint-{finished.steps}"
    assert (checkpoint / "trainer_state.json").is_file() and str(checkpoint) in finished.saved


@pytest.mark.train
def test_an_honest_run_raises_no_alarm(in_tmp):
    from envs.hackable import HonestLettersEnv
    from grpo_magic import train

    run = train(GRPOParams(**LETTERS, max_steps=20, project_name="honest"), HonestLettersEnv())
    assert run.status == "completed" and run.alarms == []
    assert run.history[-1]["reward"] > run.history[0]["reward"]  # it learned, and the task followed
    assert not any(isinstance(e, AlarmRaised) for e in read_run_log(run.output_dir))


# ------------------------------------------------------------------------------------------------ parameters


@pytest.mark.unit
def test_the_parameters_and_their_one_sentence_errors(cli):
    from grpo_magic.training.watching import watched_metrics

    p = GRPOParams(model="tiny")
    assert p.watch is None and p.on_alarm == "warn"

    class Env:
        task_metrics = ("task", "valid")

    assert watched_metrics(p, Env()) == ("task", "valid")
    assert watched_metrics(p.replace(watch="correct"), Env()) == ("correct",)
    assert watched_metrics(p.replace(watch="none"), Env()) is None
    assert watched_metrics(p, object()) == ()  # no task metric: the degeneration detectors still run
    for bad, words in [({"on_alarm": "x"}, "must be one of warn, stop"), ({"watch": "a b"}, "metric names"),
                       ({"watch": "none,task"}, "none alone"), ({"watch": "eval"}, "--eval-steps"),
                       ({"watch": "none", "on_alarm": "stop"}, "--watch none turns it off")]:
        with pytest.raises(GRPOMagicError, match=words):
            p.replace(**bad).validate()
    result = cli(["train", "--model", "tiny", "--on-alarm", "x"])
    assert result.returncode == 2 and "--on-alarm" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = cli(["train", "--model", "tiny", "--watch", "none", "--on-alarm", "stop", "--rl-env-module", "envs.hackable",
                  "--rl-env-class", "LetterHackEnv"])
    assert result.returncode == 2 and "turns it off" in result.stderr
    assert "--watch task" in GRPOParams(model="tiny", watch="task").to_command()


@pytest.mark.unit
def test_the_magic_refuses_a_bad_on_alarm(shell):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="on_alarm"):
        shell.run_line_magic("grpo_train", "--model tiny --rl-env-module envs.hackable --rl-env-class LetterHackEnv "
                                           "--on-alarm later --run")


# ----------------------------------------------------------------------------------------- the run's watch


def _step(step, **metrics):
    return StepLogged(step=step, metrics={"reward": 0.1, **metrics})


@pytest.mark.unit
def test_a_failing_watch_warns_once_and_is_off():
    from grpo_magic.training.watching import RunWatch

    watch = RunWatch(("task",))

    def broken(event):
        raise ZeroDivisionError("oops")

    watch.watch.observe_event = broken
    with pytest.warns(RuntimeWarning, match="watch failed .*ZeroDivisionError.*training goes on"):
        watch(_step(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        watch(_step(2))  # no second warning, no exception
    assert watch.error and not watch.active
    emitted = []
    watch.flush(emitted.append)
    assert len(emitted) == 1 and isinstance(emitted[0], StatusChanged) and "is off" in emitted[0].message


@pytest.mark.unit
def test_a_watched_name_the_env_never_reports_is_said_after_the_first_step():
    from grpo_magic.training.watching import RunWatch

    watch = RunWatch(("task", "corect"))
    watch(_step(1, **{"components/task": 0.0, "components/format": 1.0}))
    emitted = []
    watch.flush(emitted.append)
    (note,) = emitted
    assert "'corect'" in note.message and "format, task" in note.message
    assert watch.watch.task_metrics == ("task",)
    watch(_step(2, **{"components/task": 0.0}))
    watch.flush(emitted.append)
    assert len(emitted) == 1  # said once


@pytest.mark.unit
def test_a_step_whose_episodes_all_failed_does_not_drop_a_watched_name_and_a_note_keeps_the_run_s_phase():
    from grpo_magic.training.watching import RunWatch

    watch = RunWatch(("task", "corect"), phase=lambda: "stopping")
    watch(StepLogged(step=1, metrics={"reward": None}, episodes=8, episode_errors=8))  # nothing scored: no verdict
    emitted = []
    watch.flush(emitted.append)
    assert emitted == [] and watch.watch.task_metrics == ("task", "corect")
    watch(_step(2, **{"components/task": 0.0}))
    watch.flush(emitted.append)
    (note,) = emitted
    assert "'corect'" in note.message and note.status == "stopping"  # a note during a stop does not say "training"


@pytest.mark.unit
def test_stop_asks_the_run_to_stop_naming_the_alarm():
    from grpo_magic.training.watching import RunWatch

    asked = []
    watch = RunWatch(("task",), on_alarm="stop", request_stop=asked.append)
    for t in range(1, 16):
        watch(StepLogged(step=t, metrics={"reward": 0.05 * t, "components/task": 0.0}))
    emitted = []
    watch.flush(emitted.append)
    alarms = [e for e in emitted if isinstance(e, AlarmRaised)]
    assert alarms and asked == [f"stopped by the reward-hacking watch (divergence alarm at step {alarms[0].step})"]
    assert watch.count == len(alarms)


@pytest.mark.unit
def test_the_terminal_line_of_an_alarm():
    from grpo_magic.frontends.progress import TerminalProgress

    out = io.StringIO()
    TerminalProgress(out)(AlarmRaised(step=7, kind="repetition", message="Most completions became 'aaa'."))
    assert out.getvalue() == "grpo: ALARM (repetition) at step 7: Most completions became 'aaa'.\n"


# ---------------------------------------------------------------------------------------------- the check


class WordCountEnv:
    """A gameable reward: the more words, the better (up to 16); the task is the answer word."""

    task_metrics = ("task",)

    def build_dataset(self, tokenizer):
        from datasets import Dataset

        return Dataset.from_dict({"prompt": ["What do bees make? Answer in a full sentence: "] * 8,
                                  "answer": ["honey"] * 8})

    def score_episode(self, model, tokenizer, completion, answer):
        return {"score": min(1.0, len(completion.split()) / 16), "task": float(answer in completion.lower())}


@pytest.mark.train
def test_the_check_names_a_probe_that_games_the_reward(in_tmp):
    from grpo_magic import check_env

    report = check_env(WordCountEnv(), model="tiny", samples=2, num_generations=4, max_new_tokens=16)
    assert report.probes["repeated token"] == 1.0 and "repeated token" in report.gaming_probes
    assert "bare answer" in report.probes and "bare answer" not in report.gaming_probes
    assert any(w.startswith("one token repeated to the length limit scores 1.00") and "game" in w
               for w in report.warnings)
    assert "games it" in str(report) and report.task_metrics == ["task"] and report.missing_task_metrics == []
    report = check_env(WordCountEnv(), model="tiny", samples=2, num_generations=4, max_new_tokens=16,
                       params=GRPOParams(model="tiny", watch="correct"))
    assert report.missing_task_metrics == ["correct"]
    assert any("'correct' is not among score_episode's components (task)" in w for w in report.warnings)
