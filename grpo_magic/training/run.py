"""The runner and the Python API: ``train(params, env)`` gives a ``GRPORun``.

Everything a user can get wrong is checked in the caller's thread before the model loads
(params, env, dataset, tools, model path); then training runs in the caller's thread or a
background one. The run learns what happens only from the event stream, like every other
subscriber, so ``run.history``/``run.groups`` and the run log always agree.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.env import EnvSpec, PreparedEnv
from grpo_magic.environment.reward import BatchRecord, EnvErrorRateExceeded, EnvReward
from grpo_magic.environment.swap import prepare_swap, source_hash, swap_spec
from grpo_magic.errors import GRPOMagicError
from grpo_magic.events import (
    RUN_LOG_NAME,
    AlarmRaised,
    EnvSwapped,
    EpisodeError,
    EvalScored,
    Event,
    EventStream,
    GroupScored,
    RecentList,
    RunFinished,
    RunLog,
    RunStarted,
    StatusChanged,
    StepLogged,
    read_run_log,
)
from grpo_magic.redaction import redact, redact_library_logs
from grpo_magic.runtime.distributed import (
    distributed_initialized,
    distributed_overrides,
    end_distributed,
    environment_snapshot,
    inside_launch,
    is_main_process,
    lost_other_processes,
    lost_processes_reason,
    restore_environment,
    start_process_group,
    world_size,
)
from grpo_magic.runtime.locking import ProcessLock, folder_lock, process_kind, take_over_note
from grpo_magic.runtime.release import forget_frames, free_gpu_memory, oom_hint
from grpo_magic.runtime.signals import StopSignals
from grpo_magic.trl_compat import LIBRARY_LOGGERS, ignore_setting_warnings

from .folders import describe_resume, new_run_folder, resume_folder, set_aside_old_log
from .preflight import prepare
from .resume import checkpoint_step, checkpoint_to_resume, complete_checkpoint, run_before
from .run_evals import eval_dict, eval_event, evals_before
from .watching import RunWatch, alarm_dict, watched_metrics

FINAL_STATUSES = ("completed", "stopped", "failed")
#: Why a run stopped, by what asked for it: run.stop() (button, %grpo_stop) or a signal (``signals``).
STOP_REASONS = {"request": "stopped on request", "SIGINT": "stopped by Ctrl-C (SIGINT)", "SIGTERM": "stopped by SIGTERM"}
MAX_GROUPS_IN_MEMORY = 256
MAX_ERRORS_IN_MEMORY = 1000

_ACTIVE: GRPORun | None = None
_LAST: GRPORun | None = None
_ACTIVE_LOCK = threading.Lock()


def in_colab() -> bool:
    return "google.colab" in sys.modules


def _execution_count() -> int | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets can be displayed)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class GRPORun:
    """A training run: its status, metrics, scored groups and errors, built from its events."""

    def __init__(self, params: GRPOParams, env_name: str, output_dir: Path) -> None:
        self.params = params
        self.env_name = env_name
        self.output_dir = output_dir
        self.status = "pending"
        self.phase = "starting"
        self.reason = ""
        self.step = 0
        self.max_steps: int | None = params.max_steps
        self.history: list[dict[str, Any]] = []
        self.groups: RecentList = RecentList(maxlen=MAX_GROUPS_IN_MEMORY)  # dicts, the newest last
        self.errors: RecentList = RecentList(maxlen=MAX_ERRORS_IN_MEMORY)
        self.error_count = 0
        self.saved: list[str] = []
        self.events = EventStream()
        self.events.subscribe(self._on_event)
        self.dashboard: Any = None
        self._shown_in_cell: int | None = None
        self.exception: BaseException | None = None
        #: What asked the run to stop: "request", "SIGINT" or "SIGTERM" (None: nothing yet).
        self.stop_reason: str | None = None
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        #: Env swaps applied so far: step, env name, class, source hash (from ``EnvSwapped`` events).
        self.swaps: list[dict[str, Any]] = []
        #: Evaluations on the held-out prompts (``--eval-steps``), from ``EvalScored`` events: ``step``,
        #: ``greedy_mean``, ``sampled_mean``, ``pass_at_k``, ``baseline``, ``rows``... (docs/architecture.md, "Evaluation").
        self.evals: list[dict[str, Any]] = []
        #: The reward-hacking watch's alarms (``AlarmRaised`` events): ``kind``, ``step``, ``message``, ``evidence``
        #: (docs/explanation/watch.md).
        self.alarms: list[dict[str, Any]] = []
        #: The watch subscribed to this run's events (None: ``--watch none``, or another process of a launch).
        self.watch: RunWatch | None = None
        # What swap_env checks a new env against, and the reward adapter it hands it to.
        self._prepared: PreparedEnv | None = None
        self._tokenizer: Any = None
        self._env_hash = ""
        self._reward: EnvReward | None = None
        self._pending_swap: tuple[Any, Callable[[int], None], Callable[[], Any] | None] | None = None
        self._swap_lock = threading.Lock()
        #: The output folder's lock (main process only), released when the run has ended.
        self._folder_lock: ProcessLock | None = None

    def __repr__(self) -> str:
        total = f"/{self.max_steps}" if self.max_steps else ""
        return f"<GRPORun {self.env_name} on {self.params.model}: {self.status}, step {self.step}{total}, {self.output_dir}>"

    def show_dashboard(self, display: Callable[[Any], None] | None = None) -> None:
        """Display the live dashboard (once per notebook cell: see ``_ipython_display_``)."""
        from IPython.display import display as ipy_display

        self._shown_in_cell = _execution_count()
        (display or ipy_display)(self.dashboard)

    def _ipython_display_(self) -> None:
        # `%grpo_train --run` as a cell's last line both shows the dashboard and returns the run;
        # showing the same dashboard twice in one cell helps nobody.
        if self.dashboard is None:
            print(repr(self))
        elif self._shown_in_cell is None or self._shown_in_cell != _execution_count():
            self.show_dashboard()

    @property
    def run_log(self) -> Path:
        return self.output_dir / RUN_LOG_NAME

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def stop(self) -> None:
        """Ask the run to finish its current step, save a complete checkpoint and its weights, and end as ``stopped``.

        ``resume=True`` (``--resume``) then continues from that step.
        """
        if not self.done:
            self.request_stop("request")
            self.events.emit(StatusChanged(status="stopping", message="finishing the current step"))

    def request_stop(self, reason: str) -> bool:
        """Stop at the end of the step, for ``reason``; only sets a flag, so a signal handler may call it."""
        if self.stop_reason is None:
            self.stop_reason = reason
        return True

    @property
    def stop_requested(self) -> bool:
        return self.stop_reason is not None

    def swap_env(self, env: Any, *, config: dict[str, Any] | None = None) -> EnvSpec:
        """Score with ``env`` (a registered name, a class or an instance) from the next step on.

        Checked here, in the caller's thread, as ``train`` checks an env (and it must build the
        same dataset columns and tools); applied by the training thread between two steps, and
        recorded as an ``EnvSwapped`` event. ``config`` defaults to the running env's. A refused
        swap raises ``GRPOMagicError`` and leaves the run untouched.
        """
        if self.done or self.stop_requested or self._prepared is None:
            state = "is stopping" if self.stop_requested and not self.done else f"is {self.status}"
            raise GRPOMagicError(f"Swap refused: the run {state}, so it scores nothing more; train a new run with "
                                 "the new env instead.")
        spec = swap_spec(env, self._prepared.spec, config)
        prepared = prepare_swap(spec, self._prepared, self._tokenizer)
        new_hash = source_hash(spec)
        class_name = type(prepared.env).__name__

        def applied(step: int) -> None:  # in the training thread, between two reward calls
            previous, self._env_hash = self._env_hash, new_hash
            self.events.emit(EnvSwapped(step=step, env_name=spec.name, class_name=class_name, source_hash=new_hash,
                                        previous_hash=previous, config=spec.config))

        make_env = prepared.agent.make_env if prepared.agent is not None else None
        with self._swap_lock:
            if self._reward is None:  # still loading the model: the reward adapter takes it when it exists
                self._pending_swap = (prepared.env, applied, make_env)
            else:
                self._reward.request_swap(prepared.env, applied, make_env)
        return spec

    def _detach_reward(self) -> None:
        """The run is over: it no longer reaches the reward adapter (nor, through it, the policy)."""
        with self._swap_lock:
            self._reward, self._pending_swap = None, None

    def _attach_reward(self, reward: EnvReward) -> None:
        with self._swap_lock:
            self._reward, pending, self._pending_swap = reward, self._pending_swap, None
        if pending is not None:
            reward.request_swap(*pending)

    def wait(self, timeout: float | None = None) -> GRPORun:
        """Wait for the end of the run; re-raise a training failure as ``GRPOMagicError``."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the run is still {self.status} after {timeout} s")
        if self._thread is not None and self._thread is not threading.current_thread():
            # The thread has only its return left. Joining it matters when the process exits next (the
            # CLI): a daemon thread still inside torch at interpreter shutdown can abort the process.
            self._thread.join(timeout=30)
        if self.status == "failed":
            raise GRPOMagicError(f"Training failed: {self.reason}") from self.exception
        return self

    # ------------------------------------------------------------ state from events

    def _on_event(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.status = "running"
        elif isinstance(event, StatusChanged):
            self.phase = event.status
        elif isinstance(event, StepLogged):
            self.step = event.step
            self.max_steps = event.max_steps or self.max_steps
            self.history.append({"step": event.step, **event.metrics})
        elif isinstance(event, GroupScored):
            self.groups.append({
                "step": event.step, "group": event.group, "prompt": event.prompt,
                "completions": event.completions, "scores": event.scores, "advantages": event.advantages,
                "errors": event.errors, "clipped": event.clipped, "components": event.components,
                "warnings": event.warnings, "transcripts": event.transcripts,
            })
        elif isinstance(event, EnvSwapped):
            self.swaps.append({"step": event.step, "env_name": event.env_name, "class_name": event.class_name,
                               "source_hash": event.source_hash})
        elif isinstance(event, EvalScored):
            self.evals.append(eval_dict(event))
        elif isinstance(event, AlarmRaised):
            self.alarms.append(alarm_dict(event))
        elif isinstance(event, EpisodeError):
            self.error_count += 1
            self.errors.append({"step": event.step, "index": event.index, "kind": event.kind,
                                "message": event.message, "traceback": event.traceback})
        elif isinstance(event, RunFinished):
            self.status = event.status
            self.phase = event.status
            self.reason = event.reason
            self.saved = list(event.saved)


# ---------------------------------------------------------------- the run itself


def _emit_scored(run: GRPORun, payloads: list[tuple[BatchRecord, list[float]]], num_generations: int) -> None:
    """Turn each process's batch record and TRL's advantages into error and group events."""
    prompts: list[str] = []
    completions: list[str] = []
    outcomes = []
    advantages: list[float] = []
    transcripts: list[list[dict[str, Any]]] = []
    columns: list[dict[str, Any]] = []
    step = payloads[0][0].step if payloads else run.step + 1
    for record, adv in payloads:
        prompts += record.prompts
        completions += record.completions
        outcomes += record.outcomes
        advantages += adv[: len(record.outcomes)]
        transcripts += record.transcripts or [[] for _ in record.outcomes]
        columns += record.columns or [{} for _ in record.outcomes]
    if not any(transcripts):
        transcripts = []
    for index, outcome in enumerate(outcomes):
        if outcome.error is not None:
            run.events.emit(EpisodeError(step=step, index=index, kind=outcome.error["kind"],
                                         message=outcome.error["message"], traceback=outcome.error["traceback"]))
    for g in range(len(outcomes) // num_generations):
        sl = slice(g * num_generations, (g + 1) * num_generations)
        group = outcomes[sl]
        run.events.emit(GroupScored(
            step=step, group=g, prompt=prompts[sl.start], completions=completions[sl],
            scores=[o.score for o in group], advantages=advantages[sl], errors=[o.error for o in group],
            clipped=[o.clipped for o in group], raw_scores=[o.raw for o in group],
            latency_s=[round(o.latency_s, 6) for o in group],
            components=[o.components for o in group] if any(o.components for o in group) else [],
            warnings=[o.warnings for o in group] if any(o.warnings for o in group) else [],
            columns=columns[sl.start] if sl.start < len(columns) else {},
            transcripts=transcripts[sl] if transcripts else [],
        ))


def _quiet_libraries() -> None:
    """Our event stream is the progress display: silence library progress bars and deprecation noise.

    Without this, tqdm bars ("Loading weights", "Writing model shards") and transformers'
    FutureWarnings print under the dashboard and between the CLI's progress lines.
    """

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    redact_library_logs(LIBRARY_LOGGERS)  # TRL's warnings quote whole rows of reward arguments: prompts, columns
    ignore_setting_warnings()


def run_config_overrides(params: GRPOParams, prepared: PreparedEnv, tokenizer: Any, model_path: str) -> dict[str, Any]:
    """What a run adds to its params' ``GRPOConfig`` here: the process's distributed settings and, with vLLM,
    the context vLLM reserves KV cache for (``preflight.vllm_context_length``)."""
    overrides = distributed_overrides()
    if params.use_vllm:
        from .preflight import vllm_context_length

        overrides["vllm_max_model_length"] = vllm_context_length(params, prepared.dataset, tokenizer, model_path,
                                                                 prepared.tools, env=prepared.env)
    return overrides


def _execute(run: GRPORun, params: GRPOParams, prepared: PreparedEnv, model_path: str, tokenizer: Any,
             trainer_callbacks: list[Any], checkpoint: str | None) -> None:
    from grpo_magic.models import load_model, lora_config
    from grpo_magic.runtime.device import load_dtype
    from grpo_magic.trl_compat import release_trainer

    from .trainer import build_trainer, events_callback, save_abandoned, save_alone

    trainer = None
    reward: EnvReward | None = None
    status, reason = "completed", ""
    callback: Any = None
    checkpoint_saved: str | None = None
    totals_at_log = {"episodes": 0, "errors": 0}
    scored = {"episodes": 0, "errors": 0, "abandoned": 0}  # of every process: counted from the gathered batches

    def on_scored(payloads: list[tuple[BatchRecord, list[float]]], num_generations: int) -> None:
        for record, _ in payloads:
            scored["episodes"] += len(record.outcomes)
            scored["errors"] += sum(o.error is not None for o in record.outcomes)
        scored["abandoned"] = sum(record.abandoned_running for record, _ in payloads)
        _emit_scored(run, payloads, num_generations)

    eval_cost = {"seconds": 0.0}

    def on_eval(step: int, metrics: dict[str, Any], records: list[BatchRecord], seconds: float) -> None:
        assert reward is not None
        event = eval_event(prepared, params, reward, step, metrics, records, seconds, baseline=not run.evals)
        eval_cost["seconds"] += event.seconds
        run.events.emit(event)
        if run.watch is not None:  # its alarms follow the evaluation they judge
            run.watch.flush(run.events.emit)

    def on_log(step: int, logs: dict[str, Any], max_steps: int, epoch: float | None,
               elapsed: float) -> dict[str, Any] | None:
        if eval_cost["seconds"]:  # the evaluations' cost, next to TRL's step_time
            logs["eval/seconds"], eval_cost["seconds"] = round(eval_cost["seconds"], 4), 0.0
        episodes = scored["episodes"] - totals_at_log["episodes"]
        errors = scored["errors"] - totals_at_log["errors"]
        totals_at_log.update(scored)
        run.events.emit(StepLogged(step=step, metrics=logs, max_steps=max_steps, epoch=epoch, elapsed_s=elapsed,
                                   episode_errors=errors, episodes=episodes, episodes_abandoned=scored["abandoned"]))
        if run.watch is None:
            return None
        run.watch.flush(run.events.emit)  # the step's alarms, after the step (every subscriber saw it first)
        return {"alarms": run.watch.count}  # the trackers' train/alarms: the count so far

    def should_stop() -> str | None:  # at each step's end, in the training thread: events are safe here
        if run.stop_reason is not None and run.phase != "stopping":
            run.events.emit(StatusChanged(status="stopping", message=f"{STOP_REASONS.get(run.stop_reason, run.stop_reason)}: "
                                                                     "saving a checkpoint of this step"))
        return run.stop_reason

    def on_train_begin(max_steps: int) -> None:
        run.max_steps = max_steps
        run.events.emit(StatusChanged(status="training", message=f"{max_steps} steps"))

    # What the run must leave as it found it: TRL's environment variables, and no process group of its own.
    environment, launched, had_process_group = environment_snapshot(), inside_launch(), distributed_initialized()
    model: Any = None
    try:
        _quiet_libraries()
        run.events.emit(StatusChanged(status="loading model", message=params.model or ""))
        # The one precision decision (device.choose_precision) for the weights here and GRPOConfig's bf16/fp16.
        dtype = load_dtype(params.precision(), peft=params.peft)  # type: ignore[arg-type]
        model = load_model(model_path, tokenizer=tokenizer, dtype=dtype, load_in_4bit=params.load_in_4bit,
                           model_init_kwargs=params.model_init_kwargs,
                           use_cpu=bool(params.trl_settings.get("use_cpu")))  # resizes embeddings for an added pad
        start_process_group(params.ddp_timeout)
        resumed = {"eval_on_start": False} if checkpoint is not None and params.eval_steps is not None else {}
        config = params.to_grpo_config(str(run.output_dir),
                                       **run_config_overrides(params, prepared, tokenizer, model_path), **resumed)
        # Failures are deferred: the trainer raises them once the step's episodes are events (trainer.StepObserver).
        reward = EnvReward(prepared.env, workers=params.rl_env_workers, timeout=params.rl_episode_timeout,
                           max_error_rate=params.rl_max_error_rate, agent=prepared.agent, defer_failure=True)
        run._attach_reward(reward)  # a swap asked for while the model loaded is taken now
        callback = events_callback(on_log=on_log, on_train_begin=on_train_begin, should_stop=should_stop)
        trainer = build_trainer(
            model=model, tokenizer=tokenizer, reward=reward, config=config, dataset=prepared.dataset,
            peft_config=lora_config(params.lora_r, params.lora_alpha) if params.peft else None,
            callbacks=[callback, *trainer_callbacks], on_scored=on_scored,
            eval_dataset=prepared.eval_dataset if params.eval_steps is not None else None,
            on_eval=on_eval if params.eval_steps is not None else None,
        )
        trainer.train(resume_from_checkpoint=checkpoint)
        if callback.stop_reason:  # this process's request, or another process's (they agree at each step)
            run.stop_reason = run.stop_reason or callback.stop_reason
            status, reason = "stopped", STOP_REASONS.get(callback.stop_reason, callback.stop_reason)
            folder = run.output_dir / f"checkpoint-{trainer.state.global_step}"
            checkpoint_saved = str(folder) if complete_checkpoint(folder) else None
    except KeyboardInterrupt:
        status, reason = "stopped", "interrupted (KeyboardInterrupt)"
        if trainer is not None and callback is not None:  # the step was abandoned: checkpoint the last one
            try:
                checkpoint_saved = save_abandoned(trainer, callback)
            except Exception as exc:  # noqa: BLE001 - report, never hide the stop
                reason += f"; saving a checkpoint failed: {type(exc).__name__}: {exc}"
    except EnvErrorRateExceeded as exc:
        status, reason, run.exception = "failed", str(exc), exc
    except Exception as exc:  # noqa: BLE001 - any failure ends the run cleanly, with its reason kept
        status, reason, run.exception = "failed", oom_hint(exc), exc
        if lost_other_processes(exc):  # a machine is gone: what this process holds is the last finished step
            reason = lost_processes_reason(exc, run.step + 1)
            checkpoint_saved, why_not = save_alone(trainer, callback)
            if checkpoint_saved:  # a step whose end-of-step call the loss cut short is trained and saved all the same
                run.step = max(run.step, checkpoint_step(checkpoint_saved))
            reason += (f"; a checkpoint of step {checkpoint_step(checkpoint_saved)} is in {checkpoint_saved} "
                       "(--resume continues from there)" if checkpoint_saved else f"; no checkpoint was saved{why_not}")
    except BaseException as exc:  # noqa: BLE001 - SystemExit from an env's sys.exit(): a failure, not "completed"
        status, reason, run.exception = "failed", f"{type(exc).__name__}: {exc}", exc
    finally:
        saved: list[str] = []
        if trainer is not None:
            try:
                run.events.emit(StatusChanged(status="saving", message=str(run.output_dir)))
                trainer.save_model(str(run.output_dir))
                if is_main_process():
                    tokenizer.save_pretrained(str(run.output_dir))
                saved = [str(run.output_dir), *([checkpoint_saved] if checkpoint_saved else [])]
            except BaseException as exc:  # noqa: BLE001 - report, never hide the original failure
                reason = f"{reason}; saving the weights failed too: {type(exc).__name__}: {exc}".lstrip("; ")
                if status == "completed":
                    status = "failed"
        # Release the run's GPU objects before saying it finished: the next run may start at once.
        try:
            if reward is not None:
                reward.release()
            run._detach_reward()
            if trainer is not None:
                release_trainer(trainer, end_vllm_distributed=not launched)
            forget_frames(run.exception)
            if not launched and not had_process_group:
                end_distributed()  # one this run made (vLLM's colocated engine): the next run is not distributed
        except Exception as exc:  # noqa: BLE001 - report it; the run must still say how it ended
            reason = f"{reason}; releasing its GPU memory failed: {type(exc).__name__}: {exc}".lstrip("; ")
        finally:
            trainer = model = reward = callback = None
            restore_environment(environment)
            free_gpu_memory()
        try:
            run.events.emit(RunFinished(status=status, reason=redact(reason), output_dir=str(run.output_dir),
                                        steps=run.step, saved=saved))
        finally:
            _release_folder(run)
            run._finished.set()


def _attach_watch(run: GRPORun, params: GRPOParams, prepared: PreparedEnv, checkpoint: str | None) -> None:
    """The reward-hacking watch, subscribed last (docs/explanation/watch.md); a resumed run's watch continues
    from the steps before the checkpoint, and its alarms so far are the run's."""
    names = watched_metrics(params, prepared.env)
    if names is None:
        return
    run.watch = RunWatch(names, on_alarm=params.on_alarm, request_stop=run.request_stop, phase=lambda: run.phase)
    if checkpoint is not None:
        last = checkpoint_step(checkpoint)
        before = [e for e in read_run_log(run.output_dir, skipped=[])
                  if getattr(e, "step", None) is None or e.step <= last]
        run.watch.prime(before)
        run.alarms = [alarm_dict(e) for e in before if isinstance(e, AlarmRaised)]
    run.events.subscribe(run.watch)


def _release_folder(run: GRPORun) -> None:
    """The run is over, however it ended (completed, Stop, a signal, a failure): the folder is free again."""
    lock, run._folder_lock = run._folder_lock, None
    if lock is not None:
        lock.release()


def _refuse_if_training() -> None:
    """One run at a time in a process (call with ``_ACTIVE_LOCK`` held)."""
    if _ACTIVE is not None and not _ACTIVE.done:
        raise GRPOMagicError(
            f"A run is already training ({_ACTIVE.env_name}, step {_ACTIVE.step}); stop it first with "
            "run.stop() or %grpo_stop, then start the new one."
        )


def train(
    params: GRPOParams | None = None,
    env: Any = None,
    *,
    blocking: bool = True,
    callbacks: Iterable[Any] | None = None,
    display: bool | Callable[[Any], None] | None = None,
    resume: bool = False,
    raise_on_failure: bool = True,
    **overrides: Any,
) -> GRPORun:
    """Train with GRPO on an environment; returns the run.

    ``env`` is a registered env's name, an env class or instance (or None to use the params'
    ``rl_env_module``/``rl_env_class``). ``callbacks`` are event subscribers (callables taking an
    event) or transformers ``TrainerCallback`` objects. ``display`` shows the live dashboard
    (default: inside a notebook; a callable displays it where it likes). Keyword ``overrides``
    replace fields of ``params``. A blocking run that fails raises ``GRPOMagicError`` after saving
    what it can (unless ``raise_on_failure`` is False); a background run raises from ``run.wait()``.
    """
    global _ACTIVE, _LAST
    params = (params or GRPOParams()).replace(**overrides) if overrides else (params or GRPOParams())
    if not isinstance(params, GRPOParams):
        raise GRPOMagicError(f"train() expects GRPOParams, got {type(params).__name__}.")
    with _ACTIVE_LOCK:
        _refuse_if_training()  # before the slow checks; again below, where the new run takes the slot
    params, prepared, model_path, tokenizer = prepare(params, env)
    if params.project_name is None:  # a folder of its own (folders): runs side by side never share one
        if resume:
            folder = resume_folder(prepared.spec.name)
            if is_main_process():
                print(f"grpo-magic: {describe_resume(folder)}", file=sys.stderr, flush=True)
        else:
            folder = new_run_folder(prepared.spec.name, processes=world_size(), create=is_main_process())
        params = params.replace(project_name=str(folder))
    output_dir = Path(params.project_name).expanduser().resolve()
    checkpoint = checkpoint_to_resume(output_dir, params, processes=world_size()) if resume else None

    run = GRPORun(params, prepared.spec.name, output_dir)
    run._prepared, run._tokenizer, run._env_hash = prepared, tokenizer, source_hash(prepared.spec)
    if checkpoint is not None:  # the steps before the checkpoint are part of this run: metrics and episode errors
        run.history, errors = run_before(output_dir, checkpoint_step(checkpoint))
        run.errors.extend(errors)
        run.error_count = len(errors)
        run.step = run.history[-1]["step"] if run.history else 0
        run.evals = evals_before(output_dir, checkpoint_step(checkpoint))  # and its baseline stays the first
    subscribers: list[Callable[[Event], None]] = []
    trainer_callbacks: list[Any] = []
    for cb in callbacks or ():
        (trainer_callbacks if hasattr(cb, "on_step_end") else subscribers).append(cb)
    if is_main_process():
        # One run per folder, between processes too: the lock comes before anything in the folder is touched.
        output_dir.mkdir(parents=True, exist_ok=True)
        run._folder_lock = folder_lock(output_dir, f"{process_kind()}, training {prepared.spec.name} on {params.model}")
    try:
        note = take_over_note(output_dir, run._folder_lock) if run._folder_lock is not None else None
        if note:
            print(f"grpo-magic: note: {note}", file=sys.stderr, flush=True)
        if is_main_process():
            if not resume:
                set_aside_old_log(output_dir)  # no other run holds the folder: its log is nobody's any more
            log = RunLog(output_dir)
            run.events.subscribe(log)
            run.events.subscribe(lambda e: log.close() if isinstance(e, RunFinished) else None)
            if display if display is not None else in_notebook():
                from grpo_magic.dashboard import Dashboard

                run.dashboard = Dashboard(on_stop=run.stop, run_log=str(run.run_log))
                if checkpoint is not None:  # the dashboard continues the run: its steps so far, from the run log
                    run.dashboard.feed(read_run_log(output_dir, skipped=run.dashboard.view.notes))
                run.events.subscribe(run.dashboard)
                run.show_dashboard(display if callable(display) else None)
            for subscriber in subscribers:
                run.events.subscribe(subscriber)
            _attach_watch(run, params, prepared, checkpoint)

        with _ACTIVE_LOCK:
            _refuse_if_training()
            _ACTIVE = _LAST = run
        # the watched task metrics as resolved (--watch, else the env's task_metrics): what the curves draw
        logged_params = {**params.to_dict(), "task_metrics": list(run.watch.watch.task_metrics if run.watch else ())}
        run.events.emit(RunStarted(params=logged_params, env_name=prepared.spec.name, model=params.model or "",
                                   output_dir=str(output_dir), max_steps=params.max_steps,
                                   trl_config=params.trl_differences()))
        if note:
            run.events.emit(StatusChanged(status="starting", message=note))
    except BaseException:
        _release_folder(run)
        raise
    args = (run, params, prepared, model_path, tokenizer, trainer_callbacks, checkpoint)
    if blocking:
        # In the main thread (a script, Colab, a launched process), Ctrl-C and SIGTERM are Stop (signals).
        with StopSignals(run.request_stop, escalate=world_size() == 1):
            _execute(*args)
        return run.wait() if raise_on_failure else run
    run._thread = threading.Thread(target=_execute, args=args, name="grpo-magic-train", daemon=True)
    run._thread.start()
    return run


def last_run() -> GRPORun | None:
    """The most recent run started in this process (also reachable after ``%grpo_train``)."""
    return _LAST


def active_run() -> GRPORun | None:
    run = _ACTIVE
    return run if run is not None and not run.done else None
