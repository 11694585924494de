"""``grpo-magic train``: the terminal surface, with flags generated from ``GRPOParams``.

Bad input exits with status 2 and one line on stderr, before any model loads. The same command
works under ``torchrun``/``accelerate launch``: nothing here is notebook-only, and only the main
process prints progress.

Why argparse and not transformers' ``HfArgumentParser`` or TRL's ``TrlParser`` (both argparse subclasses that
read a dataclass): the flags here come from ``GRPOParams``' field metadata (ranges, TRL's choices, why a bound
holds) and from every other field of the installed ``GRPOConfig`` (``trl_settings``), with ``--no-x``
booleans, JSON values and one-sentence errors with a did-you-mean. ``HfArgumentParser`` turns a bad value or an
unknown flag into argparse's usage dump and exit, and reads the dataclass's types only, so the errors, the
ranges and the TRL pass-through would be written around it anyway; a plain ``ArgumentParser`` subclass that
raises instead of exiting is less code.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from grpo_magic.config.params import CLI_PROJECT_NAME, GROUPS, GRPOParams
from grpo_magic.errors import GRPOMagicError
from grpo_magic.redaction import redact

PROG = "grpo-magic"
#: The exit status of a run that ``--on-alarm stop`` ended (the reward-hacking watch; 130/143 are the signals').
ALARM_EXIT_STATUS = 3


class ArgumentError(GRPOMagicError):
    """A flag argparse could not take; raised instead of exiting so every surface can word it."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag raises ``ArgumentError`` (one sentence) instead of printing usage.

    Prefixes are not flags (``allow_abbrev=False``): ``--max-step`` must not quietly mean ``--max-steps``, and an
    unknown flag is answered with the nearest one (``did you mean --max-steps?``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse, but flags a subcommand does not know are answered by that subcommand's parser (its flags)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._parser_of(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _parser_of(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The subcommand's parser that read ``parsed`` (``grpo-magic train``), else this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, OneLineParser):
                    return chosen._parser_of(parsed)
        return self

    def error(self, message: str) -> None:  # type: ignore[override]
        helps = f"{self.prog} --help" if self.add_help else f"{self.prog}?"  # a magic's help is IPython's ?
        near = self.nearest_flag(message)
        if near:
            raise ArgumentError(f"{message}; did you mean {near}? ({helps} lists the flags)")
        raise ArgumentError(f"{message}; run {helps} for the flags and their values.")

    def nearest_flag(self, message: str) -> str | None:
        """The flag of this parser nearest to the first unknown one in argparse's ``message`` (difflib, as
        ``GRPOParams`` suggests names), or None."""
        import difflib

        if not message.startswith("unrecognized arguments:"):
            return None
        unknown = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
        if not unknown:
            return None
        flags = [f for f in self._option_string_actions if f.startswith("--") and f != "--help"]
        near = difflib.get_close_matches(unknown[0], flags, n=1, cutoff=0.75)  # no far-fetched guesses
        return near[0] if near else None


def add_param_arguments(parser: argparse.ArgumentParser, *, refused: bool = True, trl: bool = True) -> None:
    """One flag per ``GRPOParams`` field, grouped as in the form, with help from the metadata; then TRL's.

    ``refused``: add the hidden flags of settings refused with a sentence now (else ``add_refused_arguments``
    later, after flags of the caller's own that may share a name). ``trl``: add TRL's settings (imports trl).
    """
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for f in GRPOParams.fields():
        meta = f.metadata
        group = groups.get(meta.get("group", ""), parser)
        kind = GRPOParams.field_type(f.name)
        default_text = "" if f.default is None else f" (default: {f.default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": meta.get("help", "") + default_text}
        if kind is bool:
            group.add_argument(GRPOParams.flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        kwargs["type"] = kind
        # Choices are listed in the help but checked by GRPOParams, so every surface words them alike.
        choices = (GRPOParams.trl_choices(f.name) if trl else None) if meta.get("trl_choices") else meta.get("choices")
        kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else f.name.split("_")[-1].upper()
        group.add_argument(GRPOParams.flag(f.name), **kwargs)
    if trl:
        add_trl_arguments(parser)
    if refused and trl:
        add_refused_arguments(parser)


TRL_DEST = "trl:"  # the dest prefix of flags named as TRL names them


def add_trl_arguments(parser: argparse.ArgumentParser) -> None:
    """Every other ``GRPOConfig`` setting of the installed TRL, grouped, with TRL's help (trl_settings).

    Also: a declared field's TRL name (``--beta`` for ``--rl-kl-coef``), so that naming it twice is one
    sentence; transformers' old names (``--gradient-checkpointing``); and the settings grpo_magic owns,
    hidden, so that they are refused with the parameter to use instead (not "unrecognized argument").
    """
    from grpo_magic.config import trl_settings as ts

    groups: dict[str, Any] = {}
    for setting in ts.settings().values():
        if setting.group not in groups:
            groups[setting.group] = parser.add_argument_group(
                setting.group, "GRPOConfig settings of the installed TRL: their help and defaults are TRL's.")
        group = groups[setting.group]
        default = "grpo_magic chooses" if setting.name in ts.AUTO else repr(setting.default)
        kwargs: dict[str, Any] = {"dest": TRL_DEST + setting.name, "default": argparse.SUPPRESS,
                                  "help": f"{setting.help} (TRL's default: {default})".replace("%", "%%")}
        flags = [setting.flag]
        flags += [f"--{old.replace('_', '-')}" for old, new in ts.ALIASES.items() if new == setting.name]
        if setting.kind is bool:
            _add(group, *flags, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        kwargs["type"] = setting.kind if setting.kind in (int, float) else str
        kwargs["metavar"] = ("{" + ",".join(setting.choices) + "}" if setting.choices
                             else "JSON" if setting.is_json else setting.name.split("_")[-1].upper())
        _add(group, *flags, **kwargs)


def add_refused_arguments(parser: argparse.ArgumentParser) -> None:
    """Hidden flags: a declared field's TRL name and the settings grpo_magic owns (refused by ``GRPOParams``)."""
    from grpo_magic.config import trl_settings as ts

    hidden = [*_explicit_trl_names(), *ts.OWNED]
    for name in hidden:
        _add(parser, f"--{name.replace('_', '-')}", dest=TRL_DEST + name, default=argparse.SUPPRESS,
             help=argparse.SUPPRESS, nargs="?", const=True)


def _explicit_trl_names() -> list[str]:
    """TRL names of declared fields whose flag is another (``beta`` of ``--rl-kl-coef``)."""
    return [f.metadata["trl"] for f in GRPOParams.fields() if f.metadata.get("trl") and f.metadata["trl"] != f.name]


def _add(group: Any, *flags: str, **kwargs: Any) -> None:
    try:
        group.add_argument(*flags, **kwargs)
    except argparse.ArgumentError:  # a flag of ours already (--vllm-server-port is the launcher's): ours wins
        pass


def params_from_namespace(namespace: argparse.Namespace, base: GRPOParams | None = None) -> GRPOParams:
    """Params from parsed flags: only flags given on the command line replace ``base``'s values."""
    names = {f.name for f in GRPOParams.fields()}
    given = {k: v for k, v in vars(namespace).items() if k in names}
    given.update({k[len(TRL_DEST):]: v for k, v in vars(namespace).items() if k.startswith(TRL_DEST)})
    return base.replace(**given) if base is not None else GRPOParams(**given)


def version_line() -> str:
    """``grpo-magic --version``: this package and what it runs on, read from the installed metadata (no import)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from grpo_magic import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    deps = ", ".join(f"{name} {installed(name)}" for name in ("trl", "transformers", "torch"))
    return f"{PROG} {__version__} ({deps}; Python {platform.python_version()})"


class _VersionAction(argparse.Action):
    """Like argparse's ``version`` action, but on one line (argparse wraps it to the terminal) and computed when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: str | None = None):
        print(version_line())
        parser.exit()


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description="Train language models with GRPO on your own environment.")
    parser.add_argument("--version", action=_VersionAction, help="print the version of grpo-magic and of what it runs on")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    train = sub.add_parser("train", help="train a model with GRPO", description="Train a model with GRPO (TRL).")
    add_param_arguments(train, refused=False)
    train.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the output folder")
    train.add_argument("--quiet", action="store_true", help="print only the final line")
    launch = train.add_argument_group("Launch", "How many processes train, on which GPUs (not training parameters).")
    launch.add_argument("--num-processes", type=int, default=None, metavar="N",
                        help="training processes; more than 1 starts accelerate launch (torchrun on CPU) itself "
                             "(default: one per visible GPU)")
    launch.add_argument("--accelerate-config", default=None, metavar="FILE",
                        help="accelerate config file (DeepSpeed or FSDP settings), passed to accelerate launch")
    launch.add_argument("--dry-run", action="store_true",
                        help="print the GPU assignment and the exact commands, and start nothing")
    launch.add_argument("--vllm-server-port", type=int, default=8000, metavar="PORT",
                        help="port of the vLLM server started in server mode without --vllm-server-url (default: 8000)")
    launch.add_argument("--vllm-server-timeout", type=float, default=900.0, metavar="SECONDS",
                        help="how long to wait for that server to answer (default: 900)")
    add_machine_arguments(train)
    add_refused_arguments(train)
    add_eval_command(sub)
    return parser


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``grpo-magic eval`` and ``%grpo_eval`` (docs/architecture.md, "Evaluation")."""
    parser.add_argument("--model", default=None, metavar="MODEL",
                        help="the model to evaluate; with a RUN_DIR, the base model of its LoRA adapter")
    parser.add_argument("--samples", type=int, default=4, metavar="K",
                        help="sampled episodes per held-out prompt, for pass@k and the sampled mean (default: 4)")
    parser.add_argument("--greedy", action="store_true", help="greedy episodes only (no sampled ones)")
    parser.add_argument("--baseline", default="auto", metavar="MODEL_OR_RUN_DIR",
                        help="what the greedy episodes are compared with: auto (a run's base model), none, a model "
                             "or another run folder")
    parser.add_argument("--eval-split", type=float, default=None, metavar="F",
                        help="hold out this share of build_dataset's rows (a run folder's own by default)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the split, the samples and the bootstrap")
    parser.add_argument("--rl-max-new-tokens", type=int, default=None, metavar="N",
                        help="most tokens a completion (a run's own by default)")


def add_eval_command(sub: Any) -> None:
    ev = sub.add_parser("eval", help="evaluate a model or a run folder on an env's held-out prompts",
                        description="Greedy and sampled episodes on the held-out prompts, pass@k, against a baseline.")
    ev.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run's output folder (its saved weights)")
    add_eval_arguments(ev)
    ev.add_argument("--rl-env-module", default=None, help="module of the env (default: the run's)")
    ev.add_argument("--rl-env-class", default=None, help="class of the env in that module (default: the run's)")
    ev.add_argument("--rl-env-config", default=None, help="JSON of the env's constructor arguments")
    ev.add_argument("--json", action="store_true", help="print the report as JSON")


def eval_call(args: argparse.Namespace, env: Any = None, progress: Callable[[str], None] | None = None) -> Any:
    """``evaluate`` with the parsed flags: RUN_DIR, or ``--model`` alone; a bad input is one GRPOMagicError.

    ``progress`` gets the evaluation's progress lines (``evaluation.evaluate``)."""
    from grpo_magic.analysis.evaluation import evaluate, missing_folder_message

    target = args.run_dir or args.model
    if target is None:
        raise GRPOMagicError("Nothing to evaluate; pass a run's output folder, or --model MODEL (e.g. --model tiny).")
    missing = missing_folder_message(args.run_dir, folder=True) if args.run_dir else None
    if missing:  # RUN_DIR is a folder: a typo in it is no question for the Hub
        raise GRPOMagicError(missing)
    settings: dict[str, Any] = {}
    for name in ("rl_env_module", "rl_env_class", "rl_env_config", "rl_max_new_tokens"):
        value = getattr(args, name, None)
        if value is not None:
            problem = GRPOParams.check_value(name, value)
            if problem:
                raise GRPOMagicError(problem)
            settings[name] = value
    return evaluate(env, target, samples=args.samples, greedy_only=args.greedy, eval_split=args.eval_split,
                    seed=args.seed, baseline=args.baseline, model=args.model if args.run_dir else None,
                    progress=progress, **settings)


def eval_main(args: argparse.Namespace) -> int:
    """``grpo-magic eval``: the report as text (or JSON) on stdout; exit 2 with one line for a bad input."""
    import json

    try:
        report = eval_call(args, progress=_stderr_line)  # progress on stderr: stdout stays the report
    except GRPOMagicError as exc:
        return _fail(str(exc))
    print(redact(json.dumps(report.to_dict(), indent=1, default=str)) if args.json else str(report))
    return 0


def _stderr_line(line: str) -> None:
    """One progress line on stderr, at once (a pipe would hold it back)."""
    print(line, file=sys.stderr, flush=True)


def _port(text: str) -> int:
    """A port number, or one sentence (argparse prefixes the flag)."""
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {text!r}")
    return int(text)


def add_machine_arguments(train: argparse.ArgumentParser) -> None:
    """Several machines: accelerate launch's flags and meaning, handed to accelerate launch or torchrun."""
    group = train.add_argument_group(
        "Several machines", "Run the same command on every machine, each with its own --machine-rank "
        "(accelerate's names; --num-processes then counts the processes of every machine).")
    group.add_argument("--num-machines", type=int, default=1, metavar="M", help="machines training together (default: 1)")
    group.add_argument("--machine-rank", type=int, default=0, metavar="R",
                       help="this machine's rank, 0 to M-1; 0 is the machine at --main-process-ip (default: 0)")
    group.add_argument("--main-process-ip", default=None, metavar="HOST",
                       help="address of machine 0, reachable from every machine (needed when M > 1)")
    group.add_argument("--main-process-port", type=_port, default=None, metavar="PORT",
                       help="rendezvous port on machine 0 (default: 29500)")
    group.add_argument("--rdzv-backend", default="static", metavar="{static,c10d}",
                       help="static: fixed machine ranks; c10d: torchrun's elastic rendezvous (default: static)")
    group.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                       help="the rendezvous as one HOST:PORT (torchrun's name), instead of --main-process-ip/-port")


def _fail(message: str, code: int = 2) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except ArgumentError as exc:
        return _fail(str(exc))
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    if args.command == "eval":
        return eval_main(args)

    from grpo_magic.launch.processes import LaunchOptions, execute, plan_launch
    from grpo_magic.runtime.distributed import end_distributed, is_main_process, world_size
    from grpo_magic.runtime.signals import EXIT_STATUS, Interrupted, StopSignals
    from grpo_magic.training.run import active_run, train
    from grpo_magic.training.watching import WATCH_STOP

    try:
        params = params_from_namespace(args)
        if params.project_name is None:  # the seed's default folder (params.CLI_PROJECT_NAME)
            params = params.replace(project_name=CLI_PROJECT_NAME)
        plan = plan_launch(params, LaunchOptions.from_namespace(args))
        if args.dry_run:
            print(redact(plan.describe()))  # the commands carry --rl-env-config: no token in what we print
            return 0
        if not plan.in_process:
            return execute(plan, params)
    except GRPOMagicError as exc:
        return _fail(str(exc))

    def request_stop(name: str) -> bool:  # a signal handler: sets a flag only (signals)
        run = active_run()
        return run is not None and run.request_stop(name)

    # Ctrl-C and SIGTERM are Stop: the step ends, a checkpoint is saved, the run log ends with
    # RunFinished(stopped), and we exit 130 / 143. A second Ctrl-C (one process) leaves at once.
    signals = StopSignals(request_stop, escalate=world_size() == 1)
    run = None
    try:
        with signals:
            try:
                callbacks = []
                if is_main_process() and not args.quiet:
                    from .progress import TerminalProgress

                    callbacks.append(TerminalProgress())
                # Several processes train in their main thread: a process group used from a helper thread
                # aborts the interpreter at exit (and torchrun then kills the ranks still saving).
                run = train(params, blocking=world_size() > 1, raise_on_failure=False, callbacks=callbacks,
                            display=False, resume=args.resume)
            except GRPOMagicError as exc:
                return _fail(str(exc))
            # run.wait() also joins the training thread: exiting while it still tears the trainer down
            # intermittently aborts the interpreter ("terminate called without an active exception").
            told = False
            while not run.done:
                if run.stop_reason and not told and is_main_process():
                    told = True
                    again = " (Ctrl-C again to abort)" if signals.escalate else ""
                    print(f"{PROG}: {run.stop_reason}: stopping after the current step, with a checkpoint{again}",
                          file=sys.stderr, flush=True)
                with contextlib.suppress(TimeoutError):
                    run.wait(timeout=0.25)
            run.wait()
    except Interrupted as exc:  # before there was a run: nothing trained, nothing to save
        print(f"{PROG}: {exc.signal_name} before training started; nothing was trained", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:  # the second Ctrl-C: leave now, the last checkpoint and the log are on disk
        where = run.output_dir if run is not None else params.project_name
        print(f"{PROG}: aborted; the run log and the last checkpoint are in {where}", file=sys.stderr)
        return EXIT_STATUS["SIGINT"]
    except GRPOMagicError as exc:
        return _fail(str(exc), code=1)
    finally:
        if run is not None and run.done:
            # The run is over and saved: a late SIGTERM (torchrun sends one to every worker as soon as one of
            # them exits 143) must not kill this process while it leaves, or it exits -15 instead of 143.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_distributed(barrier=run is not None and run.status in ("completed", "stopped"))
    if is_main_process():
        if run.status == "stopped":
            why = (f" ({run.stop_reason})" if run.stop_reason in EXIT_STATUS
                   else f" ({run.reason})" if (run.stop_reason or "").startswith(WATCH_STOP) else "")
            print(f"{PROG}: stopped after {run.step} steps{why}; a checkpoint, the weights and the run log are in "
                  f"{run.output_dir} (--resume continues from there)", file=sys.stderr)
        else:
            print(f"{PROG}: {run.status} after {run.step} steps; weights and run log in {run.output_dir}", file=sys.stderr)
        rewards = [h["reward"] for h in run.history if h.get("reward") is not None]
        if len(rewards) >= 2:
            tail = rewards[-5:]
            print(f"{PROG}: mean reward {rewards[0]:.3f} at step 1 -> {sum(tail) / len(tail):.3f} over the last "
                  f"{len(tail)} steps", file=sys.stderr)
    if run.status == "completed":
        return 0
    if run.status == "stopped" and (run.stop_reason or "").startswith(WATCH_STOP):
        return ALARM_EXIT_STATUS  # --on-alarm stop: the watch stopped the run (every process knows the reason)
    return EXIT_STATUS.get(run.stop_reason or "", EXIT_STATUS["SIGINT"]) if run.status == "stopped" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
