"""The package says truthfully what it needs and what it was tested with.

``pyproject.toml`` names for trl, transformers, ipython and ipykernel exactly the releases CI tests, from its
oldest leg (``requirements-oldest.txt``) to its main one (``requirements-ci.txt``);
every other pin CI installs is inside the range the package declares; the private TRL hook names
what is missing in one sentence; ``grpo-magic --version`` says what runs; the README says what each
extra installs; importing the adapters stays light.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import grpo_magic
from grpo_magic import GRPOMagicError
from grpo_magic.frontends.cli import main
from grpo_magic.trl_compat import TRL_INTERNALS, TRL_RANGE, check_trl
from tests.test_bad_inputs import FIX_WORDS

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(lines: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(line) for line in lines]
    return {r.name.lower().replace("_", "-"): r for r in reqs}


DECLARED = _requirements(PROJECT["dependencies"])


def _pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {name: str(next(iter(r.specifier)).version) for name, r in _requirements([x for x in lines if x]).items()}


PINNED = _pins(ROOT / "requirements-ci.txt")
PINNED["torch"] = re.search(r'"torch==([\d.]+)"', (ROOT / "scripts" / "install.sh").read_text()).group(1)
#: CI's "oldest" leg: the oldest end of each declared range (scripts/ci_oldest.sh sets GRPO_MAGIC_PINS to this
#: file there, then to it and requirements-vllm-stack.txt, separated by os.pathsep, for TRL 1.16 on transformers 5.17).
OLDEST = _pins(ROOT / "requirements-oldest.txt")
INSTALLED_PINS = dict(PINNED)
for _file in filter(None, os.environ.get("GRPO_MAGIC_PINS", "").split(os.pathsep)):
    INSTALLED_PINS.update(_pins(ROOT / _file))
RANGED = ["trl", "transformers", "ipython", "ipykernel"]


def _declared(name: str) -> Requirement:
    return DECLARED.get(name) or _requirements(PROJECT["optional-dependencies"]["notebook"])[name]


@pytest.mark.parametrize("name", RANGED)
def test_the_declared_range_is_exactly_the_tested_one_from_the_oldest_leg_to_the_newest(name):
    spec, newest, oldest = _declared(name).specifier, Version(PINNED[name]), Version(OLDEST[name])
    assert newest in spec and oldest in spec and oldest < newest
    lowest = min(Version(s.version) for s in spec if s.operator == ">=")
    assert (lowest.major, lowest.minor) == (oldest.major, oldest.minor)  # nothing older than the oldest leg tests
    later = f"{newest.major}.{newest.minor + 1}.0" if name in ("trl", "transformers") else f"{newest.major + 1}.0"
    assert Version(later) not in spec  # nothing newer than the main leg tests


def test_the_readme_states_the_declared_ranges_and_both_ends():
    readme = (ROOT / "README.md").read_text().split("### Installing the package elsewhere", 1)[1].split("\n### ", 1)[0]
    raw = [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["notebook"]]
    for name in RANGED:
        (declared,) = [r for r in raw if Requirement(r).name == name]
        assert f"`{declared}`" in readme, f"the README's install paragraph does not say {declared}"
        assert PINNED[name] in readme and OLDEST[name] in readme, name


def test_trl_s_range_spans_two_minor_releases_and_holds_what_the_vllm_extra_installs():
    trl_new, trl_old = Version(PINNED["trl"]), Version(OLDEST["trl"])
    assert (trl_new.major, trl_new.minor) != (trl_old.major, trl_old.minor)
    assert Version(OLDEST["transformers"]) < Version("5.18")  # vLLM 0.31 (TRL's newest) needs transformers <5.18


def test_every_pin_ci_installs_is_inside_the_declared_range():
    for extra in ("test", "reasoning-gym", "trackio", "tensorboard", "notebook"):
        for name, req in _requirements(PROJECT["optional-dependencies"][extra]).items():
            assert name in PINNED, f"{name} (extra {extra}) is not pinned in requirements-ci.txt"
            assert Version(PINNED[name]) in req.specifier, (name, PINNED[name], str(req.specifier))
    for name, req in DECLARED.items():
        if name in PINNED:
            assert Version(PINNED[name]) in req.specifier, (name, PINNED[name], str(req.specifier))


def test_the_installed_releases_are_the_ones_ci_pins():
    for name in RANGED:
        assert version(name) == INSTALLED_PINS[name], f"{name}: CI's pins are {os.environ.get('GRPO_MAGIC_PINS')}"


def test_the_oldest_leg_pins_are_inside_the_declared_ranges():
    for name, pinned in OLDEST.items():
        req = DECLARED.get(name)
        if req is not None:
            assert Version(pinned) in req.specifier, (name, pinned, str(req.specifier))


def test_live_widgets_declare_the_ipykernel_they_need():
    (req,) = [Requirement(r) for r in PROJECT["optional-dependencies"]["notebook"] if r.startswith("ipykernel")]
    assert req.specifier == SpecifierSet(">=7.1,<8") and Version("7.0.1") not in req.specifier


def _one_sentence(message: str) -> None:
    assert message.endswith(f"pip install 'trl{TRL_RANGE}'.") and "\n" not in message and FIX_WORDS.search(message)
    assert message.count(". ") == 0  # one sentence


def test_the_trl_hook_says_what_is_missing_in_one_sentence():
    check_trl()  # the installed TRL has everything the adapter touches
    import trl

    for owner, name, _, _ in TRL_INTERNALS:
        assert hasattr(getattr(trl, owner), name)
    assert SpecifierSet(TRL_RANGE) == DECLARED["trl"].specifier
    bare = {"GRPOTrainer": type("GRPOTrainer", (), {}), "GRPOConfig": type("GRPOConfig", (), {})}
    with pytest.raises(GRPOMagicError) as info:
        check_trl(bare, "9.0.0")
    message = str(info.value)
    assert message.startswith("The installed TRL 9.0.0 has no GRPOTrainer._generate_and_score_completions, which ")
    _one_sentence(message)


def test_the_trl_hook_checks_signatures_and_modules_not_only_names():
    import trl

    class Renamed(trl.GRPOTrainer):  # a release whose hook took another argument
        def _generate_and_score_completions(self, batch):  # type: ignore[override]
            return super()._generate_and_score_completions(batch)

    with pytest.raises(GRPOMagicError) as info:
        check_trl({"GRPOTrainer": Renamed, "GRPOConfig": trl.GRPOConfig}, "9.0.0")
    message = str(info.value)
    assert message.startswith("The installed TRL 9.0.0's GRPOTrainer._generate_and_score_completions takes no "
                              "'inputs' argument (it takes batch), and grpo_magic overrides")
    _one_sentence(message)

    class NoFactory(trl.GRPOTrainer):  # a release before environment_factory
        def __init__(self, model, reward_funcs, args=None, train_dataset=None, processing_class=None,
                     peft_config=None, callbacks=None):
            raise AssertionError("never built")

    with pytest.raises(GRPOMagicError, match="GRPOTrainer.__init__ takes no 'environment_factory' argument"):
        check_trl({"GRPOTrainer": NoFactory, "GRPOConfig": trl.GRPOConfig}, "9.0.0")
    with pytest.raises(GRPOMagicError) as info:
        check_trl(None, None, modules=("trl.generation.no_such_client",))
    assert str(info.value).startswith(f"The installed TRL {trl.__version__} has no module trl.generation.no_such_client")
    _one_sentence(str(info.value))


@pytest.mark.process
def test_version_flag_names_the_package_and_what_it_runs_on(capsys):
    assert grpo_magic.__version__ == PROJECT["version"]
    assert main(["--version"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (f"grpo-magic {PROJECT['version']} (trl {version('trl')}, transformers {version('transformers')}, "
                    f"torch {version('torch')}; Python {sys.version.split()[0]})")
    done = subprocess.run([sys.executable, "-m", "grpo_magic", "--version"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == line


def test_the_readme_says_what_each_extra_installs_and_starts_with_a_virtualenv():
    readme = (ROOT / "README.md").read_text()
    for extra, reqs in PROJECT["optional-dependencies"].items():
        row = next((line for line in readme.splitlines() if f"`grpo-magic[{extra}]`" in line), None)
        assert row is not None, f"the README does not say what grpo-magic[{extra}] installs"
        for req in reqs:
            assert Requirement(req).name in row, (extra, req)
    fresh = readme.split("## Two commands on a fresh machine", 1)[1]
    assert fresh.index("python3 -m venv .venv") < fresh.index("bash scripts/install.sh")


def test_importing_the_adapters_loads_no_heavy_library():
    code = ("import sys, grpo_magic.adapters; print(sorted(m for m in ('reasoning_gym', 'datasets', 'torch', "
            "'transformers', 'trl', 'trackio') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
