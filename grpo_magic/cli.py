"""``grpo-magic train``: the terminal surface, with flags generated from ``GRPOParams``.

Bad input exits with status 2 and one line on stderr, before any model loads. The same command
works under ``torchrun``/``accelerate launch``: nothing here is notebook-only, and only the main
process prints progress.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .errors import GRPOMagicError
from .params import CLI_PROJECT_NAME, GROUPS, GRPOParams
from .redaction import redact

PROG = "grpo-magic"


class ArgumentError(GRPOMagicError):
    """A flag argparse could not take; raised instead of exiting so every surface can word it."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag raises ``ArgumentError`` (one sentence) instead of printing usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ArgumentError(f"{message}; run {self.prog} --help for the flags and their values.")


def add_param_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per ``GRPOParams`` field, grouped as in the form, with help from the metadata."""
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
        choices = meta.get("choices")
        kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else f.name.split("_")[-1].upper()
        group.add_argument(GRPOParams.flag(f.name), **kwargs)


def params_from_namespace(namespace: argparse.Namespace, base: GRPOParams | None = None) -> GRPOParams:
    """Params from parsed flags: only flags given on the command line replace ``base``'s values."""
    names = {f.name for f in GRPOParams.fields()}
    given = {k: v for k, v in vars(namespace).items() if k in names}
    return (base or GRPOParams()).replace(**given)


def version_line() -> str:
    """``grpo-magic --version``: this package and what it runs on, read from the installed metadata (no import)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

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
    add_param_arguments(train)
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
    return parser


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

    from .distributed import end_distributed, is_main_process, world_size
    from .launch import LaunchOptions, execute, plan_launch
    from .run import active_run, train
    from .signals import EXIT_STATUS, Interrupted, StopSignals

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
            why = f" ({run.stop_reason})" if run.stop_reason in EXIT_STATUS else ""
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
    return EXIT_STATUS.get(run.stop_reason or "", EXIT_STATUS["SIGINT"]) if run.status == "stopped" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
