"""Property-based tests (hypothesis) of the reward adapter and of GRPOParams.

Whatever ``score_episode`` returns or raises, the adapter gives TRL a list of the right length of
floats in [0, 1] or None, and records one error for each None. Whatever values the parameters
hold, validation either passes or raises ``GRPOMagicError``, never another exception; params that
validate survive the trip through the CLI command.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import shlex
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams
from grpo_magic.environment.reward import EnvErrorRateExceeded, EnvReward, normalize_score
from grpo_magic.frontends.cli import build_parser, params_from_namespace

# ---------------------------------------------------------------- what an env can hand back


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")


class BrokenFloat:
    """Claims to be a real number, but cannot be turned into a float."""

    def __float__(self) -> float:
        raise RuntimeError("float exploded")


numbers.Real.register(BrokenFloat)


class BrokenGetattr:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} for you")


class BrokenStrError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str exploded")


@dataclasses.dataclass
class Raise:
    """An outcome that is an exception raised by score_episode."""

    exc: BaseException


# Objects that break repr() or attribute lookup are tried in a plain test below: hypothesis itself
# needs those to draw and report an example.
ODD_OBJECTS = [BrokenFloat(), object(), Ellipsis, NotImplemented, print, [0.5], {"s": 1}]

returns = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**320),  # past float range
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.fractions(),
    st.just(Fraction(10**400, 3)),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.complex_numbers(),
    st.builds(np.float64, st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(np.float32, st.floats(width=32, allow_nan=True, allow_infinity=True)),
    st.builds(np.int64, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.builds(np.array, st.floats(allow_nan=True)),
    st.builds(lambda x: torch.tensor(x), st.floats(allow_nan=True, allow_infinity=True)),
    st.sampled_from(ODD_OBJECTS),
)
EXCEPTIONS = [ValueError, KeyError, RuntimeError, ZeroDivisionError, AssertionError, TimeoutError, ConnectionError,
              MemoryError, RecursionError, BrokenStrError, GRPOMagicError]


def _raises(classes: list[type[BaseException]]) -> st.SearchStrategy[Raise]:
    return st.builds(lambda cls, text: Raise(cls(text)), st.sampled_from(classes), st.text(max_size=30))


outcomes = st.one_of(returns, _raises(EXCEPTIONS))
#: With what is not an Exception: Ctrl-C and sys.exit() raised by the env itself.
any_outcomes = st.one_of(returns, _raises([*EXCEPTIONS, KeyboardInterrupt, SystemExit]))


class ScriptedEnv:
    """Episode ``idx`` returns (or raises) ``script[idx]``; async when asked."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script

    def build_dataset(self, tokenizer):  # pragma: no cover - not used by the adapter
        raise NotImplementedError

    def score_episode(self, model, tokenizer, completion, idx):
        item = self.script[idx]
        if isinstance(item, Raise):
            raise item.exc
        return item


class AsyncScriptedEnv(ScriptedEnv):
    async def score_episode(self, model, tokenizer, completion, idx):
        return ScriptedEnv.score_episode(self, model, tokenizer, completion, idx)


def _check(record: Any, n: int) -> list[Any]:
    scores = record.scores
    assert isinstance(scores, list) and len(scores) == n
    for s in scores:
        assert s is None or (type(s) is float and 0.0 <= s <= 1.0 and math.isfinite(s)), repr(s)
    assert len(record.outcomes) == n
    for score, outcome in zip(scores, record.outcomes, strict=True):
        assert (score is None) == (outcome.error is not None)
        if outcome.error is not None:
            assert isinstance(outcome.error["kind"], str) and isinstance(outcome.error["message"], str)
            assert outcome.error["message"]
    return scores


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(any_outcomes, min_size=1, max_size=8), mode=st.sampled_from(["sync", "threads", "async"]))
def test_the_adapter_gives_trl_a_float_in_0_1_or_none_for_anything_an_env_does(script, mode):
    env = AsyncScriptedEnv(script) if mode == "async" else ScriptedEnv(script)
    reward = EnvReward(env, workers=3 if mode == "threads" else 1, timeout=30 if mode == "threads" else None)
    n = len(script)
    interrupt = next((item.exc for item in script if isinstance(item, Raise) and not isinstance(item.exc, Exception)),
                     None)
    try:
        if mode == "sync" and interrupt is not None:  # in the training thread, Ctrl-C must stop the run
            with pytest.raises(type(interrupt)):
                reward(prompts=["p"] * n, completions=["c"] * n, idx=list(range(n)))
            return
        # In worker threads and our event loop they are episode errors: a lost result would hang the step.
        record = reward.score(prompts=["p"] * n, completions=["c"] * n, idx=list(range(n)))
    finally:
        reward.close()
    scores = _check(record, n)
    assert reward.totals["errors"] == sum(s is None for s in scores)
    assert reward.totals["clipped"] == sum(o.clipped for o in record.outcomes)


@settings(max_examples=150, deadline=None)
@given(script=st.lists(outcomes, min_size=1, max_size=8), limit=st.floats(min_value=0, max_value=1))
def test_the_run_stops_exactly_when_the_error_rate_passes_the_limit(script, limit):
    records: list[Any] = []
    reward = EnvReward(ScriptedEnv(script), max_error_rate=limit, on_batch=records.append)
    n = len(script)
    try:
        scores = reward(prompts=["p"] * n, completions=["c"] * n, idx=list(range(n)))
    except EnvErrorRateExceeded as exc:
        errors = sum(o.error is not None for o in records[-1].outcomes)
        assert errors / n > limit and f"{errors} of {n} episodes failed" in str(exc)
        return
    assert sum(s is None for s in scores) / n <= limit


@settings(max_examples=400, deadline=None)
@given(value=returns)
def test_normalize_score_never_raises_and_clips_only_real_numbers(value):
    outcome = normalize_score(value)
    assert (outcome.score is None) == (outcome.error is not None)
    if outcome.score is not None:
        assert 0.0 <= outcome.score <= 1.0
        assert outcome.clipped == (not 0.0 <= float(value) <= 1.0)


def test_numbers_that_work_and_those_that_do_not():
    assert normalize_score(np.float32(0.5)).score == 0.5 and normalize_score(True).score == 1.0
    assert normalize_score(Fraction(1, 4)).score == 0.25
    assert normalize_score(10**400).error["kind"] == "not a number"
    assert "use .item()" in normalize_score(torch.tensor(0.5)).error["message"]
    for odd in (BrokenRepr(), BrokenGetattr(), BrokenFloat()):
        assert normalize_score(odd).error is not None
    reward = EnvReward(ScriptedEnv([BrokenRepr(), BrokenGetattr(), Raise(BrokenStrError()), 0.5]))
    _check(reward.score(prompts=["p"] * 4, completions=["c"] * 4, idx=[0, 1, 2, 3]), 4)


# ---------------------------------------------------------------- parameters


def _junk() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(), st.integers(min_value=10**18, max_value=10**40),
        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.none(), st.booleans(),
    )


EXAMPLES = {"model": ["tiny", "some-org/some-model"], "rl_env_module": ["envs.letters"],
            "rl_env_class": ["LettersEnv"], "project_name": ["run-1", "runs/b"]}


def _valid_alternatives(f: dataclasses.Field) -> list[Any]:
    """The default and other values that pass the field's own checks (bounds included)."""
    meta = f.metadata
    values = [f.default] if not meta.get("required") else []
    values += EXAMPLES.get(f.name, [])
    kind = GRPOParams.field_type(f.name)
    if kind in (int, float):
        low = meta.get("ge", meta.get("gt"))
        if low is not None:
            values += [low + 1, low + 3] if kind is int else [low + 0.25, low + 1e-6]
            values += [low] if "ge" in meta else []
        if "le" in meta:
            values.append(meta["le"])
    if "choices" in meta:
        values += list(meta["choices"])
    if meta.get("json_object"):
        values += ['{"letters": "ab"}', "{}"]
    if meta.get("url"):
        values += ["http://localhost:8000"]
    return values


@st.composite
def params_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """Each field a value that passes its own checks, except up to two fields that get junk.

    So that the rules across fields, the later checks and the CLI round trip are reached too.
    """
    fields = GRPOParams.fields()
    junk = draw(st.sets(st.sampled_from([f.name for f in fields]), max_size=2))
    return {f.name: draw(_junk() if f.name in junk else st.sampled_from(_valid_alternatives(f))) for f in fields}


PARSER = build_parser()


@settings(max_examples=400, deadline=None)
@given(values=params_dicts())
def test_any_params_validate_or_raise_grpo_magic_error_and_nothing_else(values):
    params = GRPOParams(**values)
    for name, value in values.items():
        problem = GRPOParams.check_value(name, value)
        assert problem is None or ("\n" not in problem and name in problem)
    try:
        params.validate()
    except GRPOMagicError as exc:
        assert "\n" not in str(exc)
        return
    # Valid params reproduce themselves through the exported command (an int in a float field comes back a float).
    command = params.to_command()
    argv = shlex.split(command)[2:]
    floats = {f.name: float(v) for f in GRPOParams.fields()
              if GRPOParams.field_type(f.name) is float and isinstance(v := getattr(params, f.name), int)}
    assert params_from_namespace(PARSER.parse_args(["train", *argv])) == params.replace(**floats)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=params_dicts())
def test_preparing_a_run_with_any_params_raises_only_grpo_magic_error(values, in_tmp, monkeypatch):
    """Past validation: env, model path, context, vLLM checks and the dataset, still before any model loads."""
    from grpo_magic import models
    from grpo_magic.training.preflight import prepare

    monkeypatch.setenv("GRPO_MAGIC_VLLM_CHECK_TIMEOUT", "0.5")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded while preparing"))
    values = {**values, "model": "tiny" if values["model"] is None else values["model"]}
    values = {**values, "rl_env_module": None, "rl_env_class": None}
    try:
        prepare(GRPOParams(**values), LettersEnv)
    except GRPOMagicError as exc:
        assert "\n" not in str(exc)
