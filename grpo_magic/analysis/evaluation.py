"""Did training help? An env's held-out prompts scored before and after (docs/architecture.md, "Evaluation").

``evaluate(env, model_or_run_dir)`` runs, for every held-out prompt, one greedy episode and
``samples`` sampled ones, scores them with the env's own ``score_episode`` through the reward
adapter of training (``reward.EnvReward``: the same keyword arguments, timeouts and errors policy,
an error counted, never fatal), and reports the greedy mean, the sampled mean and pass@k with a
seeded bootstrap interval, the reward components, and, against a baseline (the base model, or
another run), the share of prompts whose greedy episode went from failing to passing and back.

Given a run folder it loads what the run SAVED (the full weights, or base model + PEFT adapter), never
the object in memory, so that a broken save shows. Agent envs run whole episodes through TRL's tool
loop, as ``%grpo_check`` does (``check_agent.run_agent_episodes``). During a run, ``--eval-steps``
uses ``evaluate_rows`` and ``summarize`` on the policy being trained (``run``).

The module is ``evaluation``, not ``evaluate``: importing a submodule sets the package attribute of its
name, which would replace the function ``grpo_magic.evaluate``.
"""

from __future__ import annotations

import html
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.env import PreparedEnv, prepare_env, resolve_env
from grpo_magic.environment.heldout import (
    BOOTSTRAP_RESAMPLES,
    MAX_ROWS_SHOWN,
    PASS_THRESHOLD,
    Progress,
    bootstrap_interval,
    compare,
    evaluate_rows,
    pass_at_k,
    pass_ks,
    summarize,
)
from grpo_magic.environment.reward import EnvReward
from grpo_magic.environment.scores import EpisodeOutcome
from grpo_magic.errors import GRPOMagicError
from grpo_magic.events import RUN_LOG_NAME
from grpo_magic.redaction import redact
from grpo_magic.trl_compat import ignore_setting_warnings

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "PASS_THRESHOLD",
    "EvalReport",
    "bootstrap_interval",
    "compare",
    "evaluate",
    "evaluate_rows",
    "pass_at_k",
    "pass_ks",
    "summarize",
]

# ---------------------------------------------------------------- models and run folders


def agent_episodes(
    prepared: PreparedEnv,
    model: Any,
    tokenizer: Any,
    reward: EnvReward,
    data: list[dict[str, Any]],
    *,
    params: GRPOParams,
    samples: int,
    greedy: bool,
    seed: int,
) -> tuple[list, list]:
    """Whole agent episodes through TRL's tool loop: greedy ones (``do_sample`` off) and sampled ones."""
    from .check_agent import run_agent_episodes

    def episodes(n: int, overrides: dict[str, Any]) -> list[tuple[list[str], list[EpisodeOutcome]]]:
        group = max(2, n)  # TRL's groups hold at least two rollouts: the first n of each are kept
        p = params.replace(rl_num_generations=group, batch_size=group, seed=seed)
        out = run_agent_episodes(p, prepared, model, tokenizer, reward, data, config_overrides=overrides)
        return [(out.texts[g][:n], out.outcomes[g * group : g * group + n]) for g in range(len(data))]

    def greedy_episodes() -> list[tuple[list[str], list[EpisodeOutcome]]]:
        # One greedy episode a prompt, TRL pairing the prompts into its groups of two (its advantages are not
        # read here): half the episodes of two identical ones a prompt. An odd count runs its last prompt twice.
        rows = data + data[-1:] if len(data) % 2 else data
        p = params.replace(rl_num_generations=2, batch_size=2, seed=seed)
        out = run_agent_episodes(p, prepared, model, tokenizer, reward, rows, per_row=1,
                                 config_overrides={"generation_kwargs": {"do_sample": False}})
        return [(out.texts[g], out.outcomes[g : g + 1]) for g in range(len(data))]

    import warnings

    with warnings.catch_warnings():  # transformers' renames (gradient_checkpointing...) say nothing to the user here
        ignore_setting_warnings()
        greedy_groups = greedy_episodes() if greedy else []
        sampled_groups = episodes(samples, {}) if samples else []
    return greedy_groups, sampled_groups


# ---------------------------------------------------------------- models and run folders


@dataclass
class Evaluated:
    """What ``evaluate`` scores: a model (hub id, folder, ``tiny``) or a run folder's saved weights."""

    label: str
    path: str  # what from_pretrained loads (the run folder for a full fine-tune, the base model for an adapter)
    adapter: str | None = None  # a run folder holding a PEFT adapter
    run_dir: Path | None = None
    params: dict[str, Any] = field(default_factory=dict)  # a run's logged params
    tokenizer_path: str = ""


def is_run_dir(path: str | Path) -> bool:
    p = Path(str(path)).expanduser()
    return p.is_dir() and (p / RUN_LOG_NAME).is_file()


def missing_folder_message(name: str, *, folder: bool = False) -> str | None:
    """One sentence when ``name`` is a folder path that does not exist (``runs/does-not-exist``), else None.

    ``folder``: ``name`` was given as a run folder (``grpo-magic eval RUN_DIR``). Else a path is told from a Hub id
    (``org/name``) by its form (``./x``, ``a/b/c``, ``x/``) or by a parent folder that exists here (``runs/`` of
    ``runs/does-not-exist``), so that a typo in a run folder is not answered about the Hub.
    """
    text = str(name).strip()
    path = Path(text).expanduser()
    if not text or path.exists():
        return None
    parent = path.parent
    pathlike = folder or (text.startswith(("/", "./", "../", "~")) or text.count("/") > 1 or text.endswith("/")
                or "\\" in text or (str(parent) not in ("", ".") and parent.is_dir()))
    if not pathlike:
        return None
    runs = sorted(p.name for p in parent.iterdir() if is_run_dir(p))[:3] if parent.is_dir() else []
    there = f" ({parent} holds {', '.join(runs)})" if runs else ""
    return (f"The folder {text} does not exist{there}; pass the output folder of a run (run.output_dir), or a model "
            "with --model (e.g. --model tiny).")


def resolve_evaluated(model_or_run_dir: Any, base_model: str | None = None) -> Evaluated:
    """A run folder (its saved weights or adapter, its logged params) or any model ``resolve_model`` knows."""
    from grpo_magic.models import resolve_model
    from grpo_magic.training.resume import logged_params

    if model_or_run_dir is None or (isinstance(model_or_run_dir, str) and not model_or_run_dir.strip()):
        raise GRPOMagicError(
            "evaluate needs a model or a run folder; pass --model tiny-math, or a run's output folder."
        )
    if hasattr(model_or_run_dir, "output_dir") and hasattr(model_or_run_dir, "params"):  # a GRPORun: its folder
        model_or_run_dir = model_or_run_dir.output_dir
    name = str(model_or_run_dir)
    if not is_run_dir(name):
        missing = missing_folder_message(name)
        if missing:
            raise GRPOMagicError(missing)
        if base_model is not None:
            raise GRPOMagicError(
                f"--model {base_model} names the base model of a run folder's adapter, and {name} is "
                "not a run folder; pass the run's output folder, or the model alone."
            )
        return Evaluated(label=name, path=resolve_model(name), tokenizer_path=resolve_model(name))
    run_dir = Path(name).expanduser().resolve()
    params = logged_params(run_dir) or {}
    if any((run_dir / f).is_file() for f in ADAPTER_FILES) and (run_dir / "adapter_config.json").is_file():
        try:
            config = json.loads((run_dir / "adapter_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = {}
        base = base_model or params.get("model") or config.get("base_model_name_or_path")
        if not base:
            raise GRPOMagicError(f"The adapter in {run_dir} names no base model; pass it with --model MODEL.")
        return Evaluated(
            label=str(run_dir),
            path=resolve_model(str(base)),
            adapter=str(run_dir),
            run_dir=run_dir,
            params=params,
            tokenizer_path=str(run_dir),
        )
    if not any((run_dir / f).is_file() for f in WEIGHT_FILES) or not (run_dir / "config.json").is_file():
        checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: p.name)
        hint = f"; evaluate a checkpoint folder ({checkpoints[-1].name}) as a model, or" if checkpoints else ";"
        raise GRPOMagicError(
            f"The run folder {run_dir} has no saved weights (no model.safetensors, nor adapter_model.safetensors with "
            f"adapter_config.json){hint} let the run finish (it saves at the end), then evaluate it again."
        )
    if base_model is not None:
        raise GRPOMagicError(f"{run_dir} holds full weights, which need no base model; drop --model {base_model}.")
    return Evaluated(label=str(run_dir), path=str(run_dir), run_dir=run_dir, params=params, tokenizer_path=str(run_dir))


def load_evaluated(evaluated: Evaluated, tokenizer: Any) -> Any:
    """The model as saved on disk: full weights, or the base model with the run's PEFT adapter on it."""
    import torch

    from grpo_magic.models import load_model

    model = load_model(evaluated.path, tokenizer=tokenizer)
    if evaluated.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, evaluated.adapter)
    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    return model


def same_tokenizer(a: Any, b: Any) -> bool:
    """Two tokenizers read and write the same tokens: same vocabulary, same chat template."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


# ---------------------------------------------------------------- the report


@dataclass
class EvalReport:
    """``summary`` (JSON-able numbers), ``rows`` (per prompt), and the same as HTML and text."""

    env_name: str
    model: str
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    baseline: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env_name,
            "model": self.model,
            "baseline": self.baseline,
            "summary": self.summary,
            "rows": self.rows,
        }

    def __repr__(self) -> str:
        return f"<EvalReport {self.env_name} on {self.model}: {self.summary['prompts']} prompts>"

    def __str__(self) -> str:
        return report_text(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython in a terminal shows the text table that ``print(report)`` gives, not the one-line repr."""
        p.text(str(self))

    def _repr_html_(self) -> str:
        return report_html(self)


def _fmt(value: float | None, ci: list[float] | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _lines(report: EvalReport) -> list[tuple[str, str]]:
    s = report.summary
    lines = [
        ("held-out prompts", f"{s['prompts']} ({s.get('source', '')})"),
        ("greedy mean", _fmt(s["greedy_mean"], s.get("greedy_ci"))),
    ]
    if s.get("samples"):
        lines.append((f"sampled mean ({s['samples']} a prompt)", _fmt(s["sampled_mean"], s.get("sampled_ci"))))
        for name, value in s["pass_at_k"].items():
            lines.append((name, _fmt(value, s["pass_at_k_ci"].get(name))))
    if s.get("components"):
        lines.append(("components (greedy)", ", ".join(f"{k} {v:.3f}" for k, v in s["components"].items())))
    lines.append(("episode errors", str(s["errors"])))
    if report.baseline is not None and "fixed" in s:
        lines.append((f"baseline greedy mean ({report.baseline})", _fmt(s.get("baseline_greedy_mean"))))
        lines.append(("failing -> passing", _pct(s.get("fixed"))))
        lines.append(("passing -> failing", _pct(s.get("broke"))))
        lines.append(("prompts that changed", str(len(s.get("changed") or []))))
    lines.append(("seconds", f"{s.get('seconds', 0.0):.2f}"))
    return lines


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def report_text(report: EvalReport) -> str:
    """The terminal's report: the summary, then the prompts that changed against the baseline."""
    head = f"grpo eval: {report.env_name} on {report.model}"
    width = max(len(k) for k, _ in _lines(report))
    out = [head, *(f"  {k:<{width}}  {v}" for k, v in _lines(report))]
    changed = [r for r in report.rows if r.get("change")]
    for r in changed[:MAX_ROWS_SHOWN]:
        out.append(
            f"  {r['change']:>5}: {_short(r['prompt'], 60)!r}: {_short(str(r.get('baseline_greedy')), 30)!r} "
            f"-> {_short(str(r.get('greedy')), 30)!r}"
        )
    return redact("\n".join(out))


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def report_html(report: EvalReport) -> str:
    """The notebook's table: the summary, then one row per prompt (changed ones first); every text escaped."""

    def esc(text: Any) -> str:
        return html.escape(redact(str(text)))

    summary = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{esc(k)}</th><td>{esc(v)}</td></tr>"
        for k, v in _lines(report)
    )
    rows = sorted(report.rows, key=lambda r: (not r.get("change"), r.get("change") != "broke"))
    has_base = any("baseline_score" in r for r in rows)
    head = (
        "<tr><th>prompt</th><th>greedy completion</th><th>greedy score</th>"
        + ("<th>baseline</th><th>change</th>" if has_base else "")
        + "<th>sampled scores</th></tr>"
    )
    body = []
    for r in rows[:MAX_ROWS_SHOWN]:
        colour = {"fixed": "rgba(34,197,94,.25)", "broke": "rgba(239,68,68,.25)"}.get(r.get("change", ""), "")
        sampled = ", ".join("err" if s is None else f"{s:.2f}" for s in r.get("sampled_scores") or [])
        base = f"<td>{_fmt(r.get('baseline_score'))}</td><td>{esc(r.get('change', ''))}</td>" if has_base else ""
        body.append(
            f"<tr style='background:{colour}'><td>{esc(_short(r['prompt'], 120))}</td>"
            f"<td><code>{esc(_short(str(r.get('greedy', '')), 120))}</code></td><td>{_fmt(r.get('greedy_score'))}</td>"
            f"{base}<td>{esc(sampled)}</td></tr>"
        )
    more = (
        f"<div>… {len(rows) - MAX_ROWS_SHOWN} more prompts in <code>report.rows</code></div>"
        if len(rows) > MAX_ROWS_SHOWN
        else ""
    )
    return (
        f"<div class='grpo-eval'><div><b>grpo eval</b>: {esc(report.env_name)} on <code>{esc(report.model)}</code>"
        f"</div><table>{summary}</table><table style='font-size:12px'>{head}{''.join(body)}</table>{more}</div>"
    )


# ---------------------------------------------------------------- the API


def _check_samples(samples: Any) -> int:
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise GRPOMagicError(
            f"samples must be a whole number of sampled episodes per prompt, 1 or more, got {samples!r}; use "
            "--samples 4 (or --greedy for greedy episodes only)."
        )
    return samples


def evaluate(
    env: Any = None,
    model_or_run_dir: Any = None,
    *,
    samples: int = 4,
    eval_split: float | None = None,
    seed: int | None = None,
    greedy_only: bool = False,
    baseline: Any = "auto",
    model: str | None = None,
    threshold: float = PASS_THRESHOLD,
    quiet: bool = True,
    progress: Progress | None = None,
    **settings: Any,
) -> EvalReport:
    """Score ``model_or_run_dir`` on the env's held-out prompts: greedy episodes, ``samples`` sampled ones, pass@k.

    ``env``: a registered name, a class, an instance (default: a run folder's logged env).
    ``model_or_run_dir``: a model (hub id, folder, ``tiny``) or a run's output folder, whose saved weights
    (or base model + adapter; ``model`` overrides that base) are loaded from disk. The held-out prompts
    are the env's ``build_eval_dataset`` or ``eval_split``'s share of ``build_dataset`` by ``seed`` (a run
    folder's own by default); without either, every row of build_dataset is scored (a note says so).
    ``baseline``: ``"auto"`` (a run folder: its base model; a model: none), None, a model or another run
    folder; its greedy episodes give the failing -> passing shares. ``settings``: GRPOParams generation
    fields (``rl_max_new_tokens``, ``rl_temperature``...), a run's own by default. ``progress``: where
    progress lines go (the CLI: stderr; ``%grpo_eval``: a line that updates), every few prompts, so that a
    slow env or model does not run minutes in silence; none by default.
    """
    from transformers.utils import logging as hf_logging

    from grpo_magic.models import load_tokenizer

    hf_logging.disable_progress_bar()  # "Loading weights" bars would print between the report's lines
    started = time.monotonic()
    samples = 0 if greedy_only else _check_samples(samples)
    if eval_split is not None:
        problem = GRPOParams.check_value("eval_split", eval_split)
        if problem:
            raise GRPOMagicError(problem)
    target = resolve_evaluated(model_or_run_dir, base_model=model)
    logged = dict(target.params)
    known = {f.name for f in GRPOParams.fields()}
    base_params = {k: v for k, v in logged.items() if k in known}
    params = GRPOParams(**{**base_params, "model": logged.get("model") or target.label})
    unknown = sorted(set(settings) - known)
    if unknown:
        raise GRPOMagicError(
            f"evaluate() got an unknown setting {unknown[0]!r}; pass GRPOParams generation fields "
            "such as rl_max_new_tokens or rl_temperature."
        )
    if settings:
        params = params.replace(**settings)
    seed = params.seed if seed is None else seed
    split = eval_split if eval_split is not None else params.eval_split
    spec = resolve_env(params, env)
    tokenizer = load_tokenizer(target.tokenizer_path or target.path)
    base_target = _baseline_target(baseline, target)
    base_tokenizer = None
    if base_target is not None:
        base_tokenizer = load_tokenizer(base_target.tokenizer_path or base_target.path)
        if not same_tokenizer(tokenizer, base_tokenizer):
            raise GRPOMagicError(
                f"The baseline {base_target.label} has another tokenizer than {target.label} (vocabulary or chat "
                "template), so their prompts are not the same tokens; compare runs of one base model, or pass "
                "--baseline none."
            )
    if target.adapter is not None and model is not None:
        if not same_tokenizer(tokenizer, load_tokenizer(target.path)):
            raise GRPOMagicError(
                f"Model {model} has another tokenizer than the run in {target.run_dir} (vocabulary or chat template), "
                "so it is not the base the adapter was trained on; pass the run's base model, or drop --model."
            )
    prepared = prepare_env(spec, tokenizer, eval_split=split, seed=seed, want_eval=True)
    dataset, source = prepared.eval_dataset, prepared.eval_source
    if dataset is None:
        dataset, source = prepared.dataset, "build_dataset: no held-out prompts"
        print(
            f"grpo-magic: note: {spec.name} has no held-out prompts (no build_eval_dataset, no eval_split), so "
            f"every row of build_dataset is scored, training prompts included.",
            file=sys.stderr,
        )
    policy = load_evaluated(target, tokenizer)
    rows = evaluate_rows(
        prepared, policy, tokenizer, dataset, params=params, samples=samples, seed=seed, agent_episodes=agent_episodes,
        progress=_progress_lines(progress, target.label, started),
    )
    del policy
    baseline_rows = None
    if base_target is not None:
        base_model = load_evaluated(base_target, base_tokenizer)
        baseline_rows = evaluate_rows(
            prepared,
            base_model,
            base_tokenizer,
            dataset,
            params=params,
            samples=samples,
            seed=seed,
            agent_episodes=agent_episodes,
            progress=_progress_lines(progress, f"baseline {base_target.label}", started),
        )
        del base_model
    summary = summarize(rows, samples=samples, seed=seed, threshold=threshold, baseline_rows=baseline_rows)
    summary.update(source=source, seconds=round(time.monotonic() - started, 3))
    if baseline_rows is not None:
        summary["baseline"] = {
            "greedy_mean": summary["baseline_greedy_mean"],
            "sampled_mean": summary["baseline_sampled_mean"],
            **summarize(baseline_rows, samples=samples, seed=seed, threshold=threshold),
        }
    report = EvalReport(
        env_name=spec.name,
        model=target.label,
        summary=summary,
        rows=rows,
        baseline=base_target.label if base_target is not None else None,
    )
    if not quiet:
        print(report_text(report))
    return report


def _progress_lines(progress: Progress | None, label: str, started: float) -> Progress | None:
    """``progress`` with each line saying which model and how long the evaluation has run."""
    if progress is None:
        return None

    def say(line: str) -> None:
        progress(f"grpo-magic eval: {label}: {line} ({time.monotonic() - started:.0f} s)")

    return say


def _baseline_target(baseline: Any, target: Evaluated) -> Evaluated | None:
    if baseline is None or (isinstance(baseline, str) and baseline.strip().lower() in ("none", "")):
        return None
    if isinstance(baseline, str) and baseline == "auto":
        if target.run_dir is None:
            return None
        base = target.params.get("model")
        return resolve_evaluated(base) if base else None
    if isinstance(baseline, str) and baseline == "base":
        base = target.params.get("model")
        if not base:
            raise GRPOMagicError(
                f"--baseline base needs a run folder, and {target.label} is a model; pass --baseline MODEL_OR_RUN_DIR."
            )
        return resolve_evaluated(base)
    return resolve_evaluated(baseline)
