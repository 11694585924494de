"""MkDocs hook: the reference pages' tables and listings, generated from the code when the site builds.

A page asks for a generated block with a line of its own, ``<!-- generated: NAME -->``; this hook replaces
the line with the output of ``GENERATORS[NAME]`` (a Markdown string). Everything here reads the public API
(``grpo_magic``, ``GRPOParams``, ``grpo_magic.events``, the magics as ``%load_ext grpo_magic`` registers them,
the ``grpo-magic`` command) or finds a generator by its module's name anywhere in the package, so that moving
modules between folders does not break the site. An unknown name, or a generator that fails, fails the build.

``python docs/hooks/reference.py NAME`` prints one block (what tests/test_readme.py compares with the code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import os
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType

import tomllib

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the docs describe this checkout's package (and tests/bad_inputs.py imports it)
    sys.path.insert(0, str(ROOT))
MARKER = re.compile(r"^([ \t]*)<!-- generated: ([a-z0-9-]+) -->[ \t]*$", re.MULTILINE)
#: Width of the help texts on the page (argparse reads COLUMNS).
HELP_COLUMNS = "100"


def find_module(name: str) -> ModuleType:
    """The package's module whose file is ``name``.py (``params_table``), in whichever folder it lives."""
    import grpo_magic

    package = Path(grpo_magic.__file__).parent
    found = sorted(".".join(("grpo_magic", *p.relative_to(package).with_suffix("").parts))
                   for p in package.rglob(f"{name}.py"))
    if len(found) != 1:
        raise LookupError(f"expected one module named {name!r} in grpo_magic, found {found or 'none'}")
    return importlib.import_module(found[0])


# ---------------------------------------------------------------------------------------------- parameters


def parameter_table() -> str:
    """The parameter table, as the package generates it from ``GRPOParams``' field metadata."""
    return find_module("params_table").markdown_table()


def recipe_table() -> str:
    return find_module("recipes").markdown_table()


# ---------------------------------------------------------------------------------------------- the CLI


def _help(argv: list[str]) -> str:
    module, _, function = _project()["scripts"]["grpo-magic"].partition(":")  # the console script's entry point
    main = getattr(importlib.import_module(module), function)
    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(argv)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip()


def _code(text: str) -> str:
    return "```text\n" + text + "\n```"


def cli_help() -> str:
    return _code(_help(["--help"]))


def cli_train_help() -> str:
    return _code(_help(["train", "--help"]))


def cli_eval_help() -> str:
    return _code(_help(["eval", "--help"]))


def installed_versions() -> str:
    from importlib.metadata import version

    names = ("grpo-magic", "trl", "transformers", "torch")
    return ", ".join(f"{n} {version(n)}" for n in names)


# ---------------------------------------------------------------------------------------------- the magics


@cache
def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("grpo_magic")
    return shell


def magics() -> str:
    """Every magic ``%load_ext grpo_magic`` registers, with its docstring (what ``%magic?`` shows)."""
    shell = _shell()
    parts = []
    for kind, prefix in (("cell", "%%"), ("line", "%")):
        for name, func in sorted(shell.magics_manager.magics[kind].items()):
            if not name.startswith("grpo"):
                continue
            doc = inspect.cleandoc(func.__doc__ or "").strip()
            first, _, rest = doc.partition("\n")
            parts.append(f"### `{prefix}{name}`\n\n{first}\n" + (f"\n```text\n{rest.strip()}\n```\n" if rest.strip() else ""))
    return "\n".join(parts)


def magic_settings() -> str:
    """The traitlets of the magics' class (``%config GrpoMagics.NAME = VALUE``)."""
    shell = _shell()
    (magics_class,) = [c for c in shell.configurables if type(c).__name__ == "GrpoMagics"]
    rows = ["| setting | default | what it does |", "|---|---|---|"]
    for name, trait in sorted(type(magics_class).class_traits(config=True).items()):
        rows.append(f"| `GrpoMagics.{name}` | `{trait.default_value!r}` | {trait.help} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- Python API


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj)).replace("'", "")
    except (TypeError, ValueError):
        return "(...)"


def _api_entries(module: ModuleType, names: list[str]) -> str:
    parts = []
    for name in names:
        obj = getattr(module, name)
        doc = inspect.getdoc(obj) or ""
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            signature = ""  # dataclasses' signatures list every field: the parameter table covers GRPOParams
        else:
            signature = _signature(obj)
        parts.append(f"### `{module.__name__}.{name}{signature}`\n\n" + (_code(doc) if doc else "") + "\n")
    return "\n".join(parts)


def python_api() -> str:
    import grpo_magic

    names = [n for n in grpo_magic.__all__ if not n.endswith("ipython_extension")]
    return _api_entries(grpo_magic, names)


def adapters_api() -> str:
    import grpo_magic.adapters as adapters

    names = sorted(n for n in vars(adapters) if n.startswith("from_") and callable(getattr(adapters, n)))
    return _api_entries(adapters, names)


# ---------------------------------------------------------------------------------------------- events


def _field_comments(cls: type) -> dict[str, str]:
    """``#:`` comments above a dataclass field, as Sphinx reads them."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if match and pending:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments


def _type_name(annotation: object) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def event_types() -> str:
    """One section per event type of the run log, from the event dataclasses of ``grpo_magic.events``."""
    from grpo_magic import events

    parts = []
    for cls, type_name in events.EVENT_TYPES_BY_CLASS.items():
        comments = _field_comments(cls)
        rows = ["| key | type | default | note |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f"`{f.default!r}`"
            elif f.default_factory is not dataclasses.MISSING:
                default = "now" if f.name == "time" else f"`{f.default_factory()!r}`"
            else:
                default = "required"
            note = comments.get(f.name, "seconds since the epoch" if f.name == "time" else "")
            rows.append(f"| `{f.name}` | `{_type_name(f.type).replace('|', '/')}` | {default} | "
                        f"{note.replace('|', '/')} |")
        doc = inspect.getdoc(cls) or ""
        parts.append(f"### `{type_name}`\n\n{doc}\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------- errors


def _bad_inputs() -> ModuleType:
    path = ROOT / "tests" / "bad_inputs.py"
    spec = importlib.util.spec_from_file_location("_docs_bad_inputs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def bad_inputs() -> str:
    """The catalogue of bad inputs the tests try on every surface: the mistake, where, the words of the answer."""
    catalogue = _bad_inputs()
    rows = ["| mistake | refused by | the answer says |", "|---|---|---|"]
    for row in catalogue.ROWS:
        words = " … ".join(f"`{w}`" if "`" not in w else w for w in row.words)
        rows.append(f"| {row.id.replace('|', '/')} | {', '.join(row.surfaces)} | {words.replace('|', '/')} |")
    return f"{len(catalogue.ROWS)} mistakes.\n\n" + "\n".join(rows)


# ---------------------------------------------------------------------------------------------- packaging


#: What each extra is for; the "installs" column comes from pyproject.toml (a new extra fails the build here).
EXTRAS_FOR = {
    "notebook": "the live dashboard in Jupyter (widget updates from the training thread need ipykernel 7.1; 7.0.x "
                "is broken)",
    "vllm": "`--use-vllm` generation on a GPU machine: the release TRL 1.16's own extra declares; it brings its own "
            "torch and transformers 5.17 and needs an NVIDIA driver for CUDA 13",
    "qlora": "`--load-in-4bit` (QLoRA, with `--peft`), on a CUDA GPU",
    "reasoning-gym": "`from_reasoning_gym` ([adapters](../how-to/adapters.md))",
    "openenv": "`from_openenv` ([adapters](../how-to/adapters.md)); not in one environment with `verifiers` (their "
               "`mcp` versions conflict): CI tests each in a venv of its own",
    "verifiers": "`from_verifiers` ([adapters](../how-to/adapters.md)); not in one environment with `openenv`",
    "trackio": "`--report-to trackio`: a local experiment tracker, no account (`trackio show` opens its dashboard)",
    "tensorboard": "`--report-to tensorboard` (event files in `OUTPUT_DIR/runs/`)",
    "test": "the test suite (the browser tests also need Debian's `chromium`)",
}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def extras_table() -> str:
    rows = ["| extra | installs | for |", "|---|---|---|"]
    for extra, reqs in _project()["optional-dependencies"].items():
        if extra not in EXTRAS_FOR:
            raise LookupError(f"docs/hooks/reference.py: say what the extra {extra!r} is for in EXTRAS_FOR")
        rows.append(f"| `grpo-magic[{extra}]` | {', '.join(f'`{r}`' for r in reqs)} | {EXTRAS_FOR[extra]} |")
    return "\n".join(rows)


def core_dependencies() -> str:
    return ", ".join(f"`{r}`" for r in _project()["dependencies"])


# ---------------------------------------------------------------------------------------------- offline models


def model_cards() -> str:
    """The shipped offline models' cards (package data beside their weights), headings one level down."""
    import grpo_magic

    cards = sorted(Path(grpo_magic.__file__).parent.rglob("MODEL_CARD.md"), key=lambda p: p.parent.name)
    if not cards:
        raise LookupError("no MODEL_CARD.md in the installed package")
    return "\n\n".join(re.sub(r"^#", "###", card.read_text(encoding="utf-8").strip(), flags=re.MULTILINE)
                       for card in cards)


GENERATORS: dict[str, Callable[[], str]] = {
    "parameter-table": parameter_table,
    "recipe-table": recipe_table,
    "cli-help": cli_help,
    "cli-train-help": cli_train_help,
    "cli-eval-help": cli_eval_help,
    "installed-versions": installed_versions,
    "magics": magics,
    "magic-settings": magic_settings,
    "python-api": python_api,
    "adapters-api": adapters_api,
    "event-types": event_types,
    "bad-inputs": bad_inputs,
    "extras-table": extras_table,
    "core-dependencies": core_dependencies,
    "model-cards": model_cards,
}


@cache
def generate(name: str) -> str:
    if name not in GENERATORS:
        raise KeyError(f"no generator named {name!r} (known: {', '.join(GENERATORS)})")
    return GENERATORS[name]()


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by its generated block, indented as the
    marker is (inside an admonition, a list item)."""

    def block(match: re.Match) -> str:
        indent, name = match.groups()
        return "\n".join(indent + line if line else line for line in generate(name).splitlines())

    return MARKER.sub(block, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' hook signature)
    try:
        return expand(markdown)
    except Exception as exc:  # one line naming the page, for the strict build's log
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_uri}: generating its reference failed: {exc!r}") from exc


if __name__ == "__main__":
    sys.stdout.write(generate(sys.argv[1]) + "\n")
