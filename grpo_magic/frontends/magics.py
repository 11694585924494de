"""The notebook surface: ``%%grpo_env``, ``%grpo_train``, ``%grpo_check`` and friends.

Magics parse their line, turn every mistake into a one-line ``UsageError`` before anything slow
happens, and call the same Python API as everyone else (``register_env``, ``train``,
``check_env``). Defaults a user wants for every run are traitlets: ``%config
GrpoMagics.default_model = "Qwen/Qwen2.5-0.5B-Instruct"``.
"""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from traitlets import Bool, Unicode

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.env import (
    EnvSpec,
    get_env,
    is_env_class,
    is_env_instance,
    prepare_env,
    register_env,
    registered_envs,
    unregister_env,
)
from grpo_magic.errors import GRPOMagicError
from grpo_magic.redaction import redact
from grpo_magic.text import one_line
from grpo_magic.training.run import active_run, in_colab, in_notebook, last_run, train

from .cli import OneLineParser, params_from_namespace
from .form import TrainForm, module_name_for
from .magic_args import parse_line as _parse
from .magic_args import train_parser as _train_parser


@magics_class
class GrpoMagics(Magics):
    """GRPO training magics; settings below are traitlets (``%config GrpoMagics``)."""

    default_model = Unicode("tiny", help="Model used when --model is not given (tiny: the offline demo model).").tag(
        config=True)
    background = Bool(True, help="Train in a background thread so that Stop works (not on Colab).").tag(config=True)
    dashboard = Bool(True, help="Show the live dashboard while training.").tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.last_params: GRPOParams | None = None
        self.last_model: str | None = None
        self.last_form: TrainForm | None = None
        self.last_started: Any = None  # the last run %grpo_train or its form started: what %grpo_export writes

    # ------------------------------------------------------------ %%grpo_env

    @no_var_expand
    @cell_magic
    def grpo_env(self, line: str, cell: str) -> EnvSpec:
        """Register the environment class this cell defines: %%grpo_env [NAME] [--config JSON] [--swap]

        The cell runs in your namespace (the class stays usable as a normal name). The class with
        build_dataset and score_episode is registered, or the env class or instance the cell
        assigns (Gym = from_reasoning_gym("basic_arithmetic")); NAME picks one when the cell defines
        or assigns several. Re-running the cell replaces the registration. A run already training keeps the
        class it started with, unless --swap: it then scores with the new class from its next step
        on (same config unless --config is given), after the same checks as before training.
        """
        parser = OneLineParser(prog="%%grpo_env", add_help=False)
        parser.add_argument("name", nargs="?")
        parser.add_argument("--config", default=None)
        parser.add_argument("--swap", action="store_true")
        args = _parse(parser, line)
        problem = GRPOParams.check_value("rl_env_config", args.config)
        if problem:
            raise UsageError(problem.replace("rl_env_config (--rl-env-config)", "--config"))
        running = active_run()
        if args.swap:
            self._check_swap_target(running, args.name)
        code = self.shell.transform_cell(cell)
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            raise UsageError(f"The %%grpo_env cell has a syntax error at line {exc.lineno}: {exc.msg}; fix the "
                             "cell.") from None
        class_names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        filename = self.shell.compile.cache(code)  # so that tracebacks from the env show the cell's lines
        try:
            exec(compile(code, filename, "exec"), self.shell.user_ns)  # noqa: S102 - the user's own cell, their namespace
        except GRPOMagicError as exc:  # an adapter's answer (from_reasoning_gym...) is one sentence with its fix
            raise UsageError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"The %%grpo_env cell raised {type(exc).__name__}: {one_line(exc, 10_000)}; fix the "
                             "cell.") from None
        ns = self.shell.user_ns
        classes = {n: ns[n] for n in class_names if n in ns}
        candidates = {n: c for n, c in classes.items() if is_env_class(c)}
        for n in _assigned_names(tree):  # Gym = from_reasoning_gym(...), env = HotelEnv(max_turns=5)
            obj = ns.get(n)
            if (is_env_class(obj) or is_env_instance(obj)) and not any(obj is c for c in candidates.values()):
                candidates[n] = obj
        attr = self._pick_class(args.name, classes, candidates, assigned=set(candidates) - set(classes))
        cls = candidates[attr]
        name = args.name or attr
        if args.swap:
            self._check_swap_target(running, name)
        previous = registered_envs().get(name)
        try:
            spec = register_env(cls, name, config=args.config, source="cell", code=cell, attr=attr)
            # builds and checks the dataset (a bad env is not kept registered), then swaps when asked
            self._summary(spec, swap=running if args.swap else None, config=args.config,
                          running=running if running is not None and running.env_name == name else None)
        except GRPOMagicError as exc:
            unregister_env(name)
            if previous is not None:
                register_env(previous.cls or previous.instance, name, config=previous.config if previous.cls else None,
                             source=previous.source, code=previous.code, attr=previous.attr)
            message = str(exc)
            if args.swap and not message.startswith("Swap refused"):
                message = f"Swap refused, the run goes on with its env: {message}"
            raise UsageError(message) from None
        return spec

    @staticmethod
    def _pick_class(name: str | None, classes: dict[str, type], candidates: dict[str, Any],
                    assigned: frozenset[str] | set[str] = frozenset()) -> str:
        """The name (in the cell) of the env to register: NAME's, or the only one the cell defines or assigns."""
        from grpo_magic.environment.env import METHOD_SIGNATURES  # how a missing method is declared, for the fix

        if name and name in candidates:
            return name
        if name and name in classes:
            missing = [m for m in ("build_dataset", "score_episode") if not callable(getattr(classes[name], m, None))]
            raise UsageError(f"Class {name} has no {missing[0]}() method; add {METHOD_SIGNATURES[missing[0]]} "
                             "to it.")
        if len(candidates) == 1:
            return next(iter(candidates))
        if len(candidates) > 1:
            what = "environment classes" if not assigned else "environments (classes or instances)"
            verb = "defines" if not assigned else "defines or assigns"
            raise UsageError(f"The cell {verb} {len(candidates)} {what} ({', '.join(candidates)}); name the one to "
                             f"register: %%grpo_env {next(iter(candidates))}.")
        if classes:
            first = next(iter(classes.values()))
            missing = [m for m in ("build_dataset", "score_episode") if not callable(getattr(first, m, None))]
            raise UsageError(f"Class {first.__name__} has no {missing[0]}() method; add "
                             f"{METHOD_SIGNATURES[missing[0]]} to it.")
        raise UsageError("The %%grpo_env cell defines no class; define a class with build_dataset(self, tokenizer) "
                         "and score_episode(self, model, tokenizer, completion, ...), or assign one "
                         "(Env = from_reasoning_gym(...)).")

    @staticmethod
    def _check_swap_target(running: Any, name: str | None) -> None:
        """--swap needs a run training on env NAME: said before the cell runs when NAME is given."""
        if running is None:
            raise UsageError("--swap needs a run that is training, and none is; drop --swap to register the env, or "
                             "start a run with %grpo_train --run.")
        if name is not None and name != running.env_name:
            raise UsageError(f"--swap: the run that is training scores with env {running.env_name}, not {name}; name "
                             f"its env: %%grpo_env {running.env_name} --swap.")

    def _summary(self, spec: EnvSpec, *, swap: Any = None, config: str | None = None, running: Any = None) -> None:
        """Build the dataset once (which validates it) and show what the env gives the model.

        ``swap``: the run to hand the new class to (``run.swap_env``); ``running``: a run training
        on this env's name, which keeps the class it started with (the summary says so).
        """
        from IPython.display import display

        from grpo_magic.environment.env import ENV_PROMPT_COLUMN, prompt_text
        from grpo_magic.models import load_tokenizer, resolve_model

        # The tokenizer of the model last used, else the default, else tiny: a summary never fails on a model.
        for model in dict.fromkeys(m for m in (self.last_model, self.default_model, "tiny") if m):
            try:
                tokenizer = load_tokenizer(resolve_model(model))
                break
            except GRPOMagicError:
                continue
        prepared = prepare_env(spec, tokenizer)
        note = ""
        if swap is not None:
            swap.swap_env(spec, config=json.loads(config) if config else None)
            note = (f"<br><b>swap</b>: the run training on {html.escape(spec.name)} (step {swap.step}) scores with "
                    "this class from its next step on (an <code>env_swapped</code> event in its run log)")
        elif running is not None:
            note = (f"<br>a run is training on {html.escape(spec.name)} (step {running.step}): it keeps the class it "
                    "started with; re-run this cell with <code>--swap</code> to score its next steps with this one")
        data = prepared.dataset
        columns = [c for c in data.column_names if c != ENV_PROMPT_COLUMN]
        first = data[0]["prompt"]
        if not isinstance(first, str):  # an agent env's prompts are rendered with its tools by TRL, as here
            first = tokenizer.apply_chat_template(first, tools=prepared.tools if prepared.agent else None,
                                                  add_generation_prompt=True, tokenize=False)
        tools = ", ".join(t.get("function", t).get("name", "?") for t in prepared.tools) or "none"
        if prepared.agent is not None:
            tools += " (an agent env: the trainer runs and trains whole episodes, one instance per rollout)"
        config = json.dumps(spec.config) if spec.config else "{}"
        # The config and the prompts may carry a key or token (the env's own secrets): never shown as they are.
        config, first = redact(config), redact(first)
        original = redact(prompt_text(data[0].get(ENV_PROMPT_COLUMN, data[0]["prompt"])))
        page = (
            f"<div class='grpo-env-summary'><b>registered env {html.escape(spec.name)}</b> "
            f"({html.escape(_kind(spec))}, config {html.escape(config)})<br>"
            f"dataset: {len(data)} prompts, columns: {html.escape(', '.join(columns))}<br>tools: {html.escape(tools)}"
            f"<details><summary>first prompt as the model sees it ({html.escape(model)} tokenizer)</summary>"
            f"<pre style='white-space:pre-wrap'>{html.escape(first)}</pre></details>"
            f"<!-- {html.escape(original[:80])} -->{note}</div>"
        )
        text = (f"registered env {spec.name} ({_kind(spec)}, config {config})\ndataset: {len(data)} prompts, columns: "
                f"{', '.join(columns)}\ntools: {tools}\nfirst prompt as the model sees it ({model} tokenizer):\n"
                + "\n".join("  " + line for line in first.splitlines())
                + ("\n" + html.unescape(re.sub(r"<[^>]+>", "", note.replace("<br>", ""))) if note else ""))
        display({"text/html": page, "text/plain": text}, raw=True)  # text: IPython in a terminal

    # ------------------------------------------------------------ %grpo_train

    @no_var_expand
    @line_magic
    def grpo_train(self, line: str = "") -> Any:
        """Show the GRPO parameter form, or train at once with --run; returns the run (or the form)."""
        args = _parse(_train_parser(), line)
        base = GRPOParams(model=self.default_model or None)
        try:
            params = params_from_namespace(args, base)
        except GRPOMagicError as exc:
            raise UsageError(str(exc)) from None
        env_name = self._env_name(args.env, params)
        self.last_params = params
        if "model" not in vars(args) and params.model:  # the CLI requires --model; here the default stands in, and says so
            demo = ", the offline demo model" if params.model == "tiny" else ""
            print(f"model: {params.model} (no --model given: GrpoMagics.default_model{demo}; pass --model MODEL, or "
                  f"%config GrpoMagics.default_model = 'MODEL' for every run)")
        if not args.run:
            self.last_form = TrainForm(params, env_name, start=self._start_from_form)
            return self.last_form
        problems = params.problems()
        if problems:
            raise UsageError(problems[0][1])
        blocking = args.blocking or in_colab() or not self.background
        try:
            return self._start(params, env_name, blocking=blocking, resume=args.resume)
        except GRPOMagicError as exc:
            raise UsageError(str(exc)) from None

    def _env_name(self, name: str | None, params: GRPOParams) -> str | None:
        if name:
            try:
                get_env(name)
            except GRPOMagicError as exc:
                raise UsageError(str(exc)) from None
            return name
        if params.rl_env_module or params.rl_env_class:
            return None
        envs = list(registered_envs())
        if len(envs) == 1:
            return envs[0]
        if not envs:
            raise UsageError("No environment: define one in a %%grpo_env cell, or pass --rl-env-module and "
                             "--rl-env-class.")
        raise UsageError(f"Several environments are registered ({', '.join(envs)}); pick one with --env NAME.")

    def _start(self, params: GRPOParams, env_name: str | None, *, blocking: bool, resume: bool = False,
               display: Any = None) -> Any:
        self.last_model = params.model
        from .progress import TerminalProgress

        # IPython in a terminal shows no widgets: the run prints the CLI's progress lines there instead.
        progress = [] if in_notebook() else [TerminalProgress()]
        run = train(params, env_name, blocking=blocking, display=display if display is not None else self.dashboard,
                    resume=resume, raise_on_failure=False, callbacks=progress)
        self.last_started = run  # a refused line raised above: it never started, and is never exported
        return run

    def _start_from_form(self, params: GRPOParams, env_name: str | None, show: Any) -> Any:
        self.last_params = params
        return self._start(params, env_name, blocking=in_colab() or not self.background, display=show)

    # ------------------------------------------------------------ %grpo_check

    @no_var_expand
    @line_magic
    def grpo_check(self, line: str = "") -> Any:
        """Pre-flight an env: %grpo_check ENV [--model M] [--samples K] [--rl-num-generations N]"""
        parser = OneLineParser(prog="%grpo_check", add_help=False)
        parser.add_argument("env", nargs="?")
        parser.add_argument("--model", default=None)
        parser.add_argument("--samples", type=int, default=8)
        parser.add_argument("--rl-num-generations", dest="num_generations", type=int, default=4)
        parser.add_argument("--rl-max-new-tokens", dest="max_new_tokens", type=int, default=32)
        parser.add_argument("--card", default=None, help="compare the memory estimate with this card (T4, L4, A100-40GB...)")
        args = _parse(parser, line)
        if args.samples < 1:
            raise UsageError(f"--samples must be at least 1, got {args.samples}.")
        env_name = self._env_name(args.env, GRPOParams())
        from grpo_magic.analysis.check import check_env

        model = args.model or self.last_model or self.default_model
        try:
            from grpo_magic.config.memory import estimate

            base = self.last_params if self.last_params is not None else GRPOParams()
            if model:
                print("will it fit: " + estimate(base.replace(model=model), card=args.card).text())
        except GRPOMagicError as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - an estimate that cannot be made must not stop the check
            print(f"will it fit: no estimate ({type(exc).__name__}: {exc})")
        try:
            report = check_env(env_name, model=model, samples=args.samples, num_generations=args.num_generations,
                               max_new_tokens=args.max_new_tokens)
        except GRPOMagicError as exc:
            raise UsageError(str(exc)) from None
        return report

    # ------------------------------------------------------------ %grpo_rescore

    @no_var_expand
    @line_magic
    def grpo_rescore(self, line: str = "") -> Any:
        """Score a run's logged completions with an env as it is now: %grpo_rescore [OUTPUT_DIR] --env NAME [--steps A:B]

        Nothing is generated: the completions, prompts and dataset rows come from the run log
        (default: the last run of this session; a folder copied from elsewhere works too). The
        report shows old and new scores and advantages (TRL's formula, the run's settings), groups
        whose ranking changed first. --steps A:B includes both ends (A: and :B are open).
        """
        parser = OneLineParser(prog="%grpo_rescore", add_help=False)
        parser.add_argument("output_dir", nargs="?")
        parser.add_argument("--env", default=None)
        parser.add_argument("--steps", default=None)
        parser.add_argument("--rl-env-workers", dest="workers", type=int, default=None)
        args = _parse(parser, line)
        if args.workers is not None and args.workers < 1:
            raise UsageError(f"--rl-env-workers must be at least 1, got {args.workers}.")
        from grpo_magic.analysis.rescoring import parse_steps, rescore

        try:
            parse_steps(args.steps)
            target = args.output_dir or last_run()
            if target is None:
                raise GRPOMagicError("No run to rescore in this session; pass its output folder: %grpo_rescore "
                                     "OUTPUT_DIR --env NAME.")
            env_name = self._env_name(args.env, GRPOParams())
            return rescore(target, env_name, steps=args.steps, workers=args.workers)
        except GRPOMagicError as exc:
            raise UsageError(str(exc)) from None

    # ------------------------------------------------------------ %grpo_eval

    @no_var_expand
    @line_magic
    def grpo_eval(self, line: str = "") -> Any:
        """Evaluate on an env's held-out prompts: %grpo_eval ENV [RUN_DIR | --model M] [--samples K] [--greedy] [--baseline X]

        Greedy and K sampled episodes per held-out prompt (build_eval_dataset, or --eval-split of
        build_dataset's rows), pass@k with a bootstrap interval, and against the baseline (a run
        folder's base model by default; none, a model or another run) the prompts whose greedy episode
        went from failing to passing and back. A run folder is evaluated from its SAVED weights or adapter.
        """
        from .cli import add_eval_arguments, eval_call
        from .progress import updating_line

        parser = OneLineParser(prog="%grpo_eval", add_help=False)
        parser.add_argument("env", nargs="?")
        parser.add_argument("run_dir", nargs="?")
        add_eval_arguments(parser)
        args = _parse(parser, line)
        if (args.env and args.run_dir is None and args.env not in registered_envs()
                and (Path(args.env).expanduser().is_dir() or "/" in args.env or "\\" in args.env)):
            args.env, args.run_dir = None, args.env  # %grpo_eval RUN_DIR: the run's own env (a missing one is said so)
        if args.run_dir is None and args.model is None:
            run = last_run()
            if run is None:
                raise UsageError("Nothing to evaluate; pass a run's output folder or --model MODEL: "
                                 "%grpo_eval ENV RUN_DIR.")
            args.run_dir = str(run.output_dir)
        from grpo_magic.analysis.evaluation import missing_folder_message

        missing = missing_folder_message(args.run_dir, folder=True) if args.run_dir else None
        if missing:
            raise UsageError(missing)
        env = args.env
        if env is None and not (args.run_dir and Path(args.run_dir, "events.jsonl").is_file()):
            env = self._env_name(None, GRPOParams())
        elif env is not None:
            env = self._env_name(env, GRPOParams())
        try:
            return eval_call(args, env, progress=updating_line())
        except GRPOMagicError as exc:
            raise UsageError(str(exc)) from None

    # ------------------------------------------------------------ %grpo_compare

    @no_var_expand
    @line_magic
    def grpo_compare(self, line: str = "") -> Any:
        """Overlay runs' curves from their run logs: %grpo_compare DIR [DIR ...]

        Each run is named by its folder and the settings that differ between the runs (from each
        run log's parameters); the caption says which settings those are.
        """
        parser = OneLineParser(prog="%grpo_compare", add_help=False)
        parser.add_argument("output_dirs", nargs="*")
        args = _parse(parser, line)
        if not args.output_dirs:
            raise UsageError("Name the runs to compare: %grpo_compare DIR [DIR ...] (their output folders).")
        from grpo_magic.dashboard.compare import compare

        try:
            return compare(*args.output_dirs)
        except GRPOMagicError as exc:
            raise UsageError(str(exc)) from None

    # ------------------------------------------------------------ %grpo_envs, %grpo_stop, %grpo_export

    @line_magic
    def grpo_envs(self, line: str = "") -> dict[str, EnvSpec]:
        """List the registered environments: name, source and config."""
        envs = registered_envs()
        if not envs:
            print("No environment registered; define one in a %%grpo_env cell.")
        for name, spec in envs.items():
            where = "cell" if spec.source == "cell" else spec.module or spec.source
            print(f"{name}: {_kind(spec)} from {where}, config {json.dumps(spec.config)}")
        return envs

    @line_magic
    def grpo_stop(self, line: str = "") -> Any:
        """Stop the training run: it finishes its step, saves a checkpoint (``--resume`` continues it), and ends as stopped."""
        run = active_run()
        if run is None:
            print("No run is training.")
            return None
        run.stop()
        print(f"Stopping {run.env_name} after the current step; a checkpoint, the weights and the log go to "
              f"{run.output_dir} (--resume continues from there).")
        return run

    @no_var_expand
    @line_magic
    def grpo_export(self, line: str = "") -> Path:
        """Write a cell env as a module: %grpo_export ENV --to FILE.py [--force] [--from-form]

        The command printed (and launch.sh's) has the parameters of the last run that started, or with
        --from-form the form's values; the output says which. With --to DIR (no .py suffix) the folder
        gets the module, launch.sh (that grpo-magic train command; ./launch.sh accelerate for plain accelerate launch)
        and accelerate_config.yaml: copy it to a cluster and run ./launch.sh there. With
        --cluster slurm [--nodes N] [--gpus-per-node G] it also gets slurm.sbatch (srun starts
        launch.sh on every node, the rendezvous from SLURM's variables) and
        accelerate_config_slurm.yaml; --cluster none (the default) writes only the above.
        """
        parser = OneLineParser(prog="%grpo_export", add_help=False)
        parser.add_argument("env", nargs="?")
        parser.add_argument("--to", default=None)
        parser.add_argument("--force", action="store_true")
        parser.add_argument("--cluster", default="none")
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument("--gpus-per-node", type=int, default=8)
        parser.add_argument("--from-form", action="store_true")
        args = _parse(parser, line)
        cluster = _export_cluster(args)
        name = self._env_name(args.env, GRPOParams())
        spec = get_env(name)  # type: ignore[arg-type]
        if spec.code is None:
            raise UsageError(f"{spec.name} was not defined in a %%grpo_env cell (it comes from {spec.module}); "
                             "it is importable already.")
        target = Path(args.to or f"{module_name_for(spec.name)}.py")
        if target.suffix != ".py":
            return self._export_folder(spec, target, force=args.force, cluster=cluster, nodes=args.nodes,
                                       gpus_per_node=args.gpus_per_node, from_form=args.from_form)
        if cluster != "none":
            raise UsageError(f"--cluster {cluster} writes a folder (the module, launch.sh and {cluster}.sbatch), not "
                             f"one file; use --to DIR instead of --to {target}.")
        if not target.stem.isidentifier():
            raise UsageError(f"{target.name} is not an importable module name; use letters, digits and underscores.")
        if target.exists() and not args.force:
            raise UsageError(f"{target} exists; pass --force to overwrite it.")
        from .export import module_source

        params = self._export_params(args.from_form).replace(  # refused (--from-form) before anything is written
            rl_env_module=target.stem, rl_env_class=spec.attr_name,
            rl_env_config=json.dumps(spec.config) if spec.config else None)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(module_source(spec.name, spec.code), encoding="utf-8")
        command = params.to_command()
        print(f"wrote {target}\nrun it from {target.parent.resolve()}:\n  {command}\n"
              f"on several GPUs:\n  {command.replace('grpo-magic train', 'accelerate launch -m grpo_magic train', 1)}")
        return target

    def _export_params(self, from_form: bool) -> GRPOParams:
        """The last started run's parameters (``--from-form``: the form's), and a line saying which (export)."""
        from .export import params_to_export

        params, which = params_to_export(self.last_started, self.last_form, from_form=from_form,
                                         default_model=self.default_model)
        if params is None:
            raise UsageError(which)
        print(f"parameters from {which}")
        return params

    def _export_folder(self, spec: EnvSpec, folder: Path, *, force: bool, cluster: str = "none", nodes: int = 2,
                       gpus_per_node: int = 8, from_form: bool = False) -> Path:
        from .export import SBATCH_NAME, folder_files, write_folder

        module = module_name_for(spec.name)
        if not module.isidentifier():
            raise UsageError(f"{module}.py would not be an importable module name; register the env under a name "
                             "of letters, digits and underscores (%%grpo_env NAME).")
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{folder} is a file; --to takes a FILE.py or a folder.")
        existing = [p for p in folder_files(folder, module, cluster) if p.exists()]
        if existing and not force:
            raise UsageError(f"{existing[0]} exists; pass --force to overwrite it.")
        params = self._export_params(from_form).replace(
            rl_env_module=module, rl_env_class=spec.attr_name,
            rl_env_config=json.dumps(spec.config) if spec.config else None)
        files = write_folder(folder, module, spec.name, spec.code or "", params, cluster=cluster, nodes=nodes,
                             gpus_per_node=gpus_per_node)
        launch = folder / "launch.sh"
        print(f"wrote {', '.join(str(p) for p in files)}\nrun it (here or on a cluster, from any folder):\n"
              f"  {launch}\n  {launch} --dry-run   # the processes and GPUs it would use\n"
              f"  {launch} accelerate   # plain accelerate launch with {folder / 'accelerate_config.yaml'}")
        if cluster == "slurm":
            print(f"on SLURM ({nodes} nodes x {gpus_per_node} GPUs; the folder on a filesystem every node sees):\n"
                  f"  cd {folder} && sbatch {SBATCH_NAME}")
        return folder


def _export_cluster(args: Any) -> str:
    """%grpo_export's --cluster, --nodes and --gpus-per-node, checked before anything is written."""
    from .export import CLUSTERS

    if args.cluster not in CLUSTERS:
        raise UsageError(f"--cluster must be none or slurm, not {args.cluster!r}; use --cluster slurm for an sbatch "
                         "script, or leave it out.")
    if args.nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {args.nodes}; use the number of machines, e.g. --nodes 2.")
    if args.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node must be 0 (CPU nodes) or more, got {args.gpus_per_node}; use e.g. "
                         "--gpus-per-node 8.")
    return args.cluster


def _assigned_names(tree: ast.Module) -> list[str]:
    """The names a cell binds at its top level with ``=`` (``Gym = from_reasoning_gym(...)``), in order."""
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id not in names:
                names.append(target.id)
    return names


def _kind(spec: EnvSpec) -> str:
    """How an env was registered, in a few words: its class, or an instance of it."""
    if spec.cls is not None:
        return f"class {spec.cls.__name__}"
    return f"instance of {type(spec.instance).__name__}" if spec.instance is not None else "?"


def load_ipython_extension(ipython: Any) -> None:
    magics = GrpoMagics(shell=ipython)
    ipython.register_magics(magics)
    if magics not in ipython.configurables:
        ipython.configurables.append(magics)  # so that %config GrpoMagics.default_model = ... works
    GrpoMagics.grpo_train.__doc__ = _train_help()


def unload_ipython_extension(ipython: Any) -> None:
    registered = ipython.magics_manager.registry.pop("GrpoMagics", None)
    for kind, names in GrpoMagics.magics.items():
        for name in names:
            ipython.magics_manager.magics[kind].pop(name, None)
    if registered in ipython.configurables:
        ipython.configurables.remove(registered)


def _train_help() -> str:
    return ("Show the GRPO parameter form, or train at once with --run; returns the run.\n\n"
            "Examples:\n  run = %grpo_train --env HotelEnv --model tiny --run\n  %grpo_train --env HotelEnv\n\n"
            + _train_parser(trl=False).format_help()
            + "\nEvery other setting of TRL's GRPOConfig is a flag too, by its TRL name (--scale-rewards none); "
            "grpo-magic train --help lists them (kept out of here so that %load_ext does not import TRL).\n")


# last_run is part of the notebook story too: `grpo_magic.last_run()` after `%grpo_train`.
__all__ = ["GrpoMagics", "last_run", "load_ipython_extension", "unload_ipython_extension"]
