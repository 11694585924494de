"""The reward-hacking watch: detectors fed one run event at a time (the statistics, and why: docs/explanation/watch.md).

A ``Watch`` reads what the run log already records for every step (``RunStarted``'s parameters, each step's
``GroupScored`` groups, then its ``StepLogged`` metrics) and returns ``Alarm`` objects when, over a window of
steps, the reward rises in a way the task does not follow:

- ``divergence``: the reward rises (Mann-Kendall trend test, and a Theil-Sen rise larger than the run's own
  step-to-step noise) while a named task metric does not follow it (flat or falling: its rise, given three
  standard errors of doubt, is under half the reward's);
- ``repetition``: while the reward rises and no task metric rises with it, most completions become one repeated
  character or n-gram;
- ``collapse``: the same, and completions to *different* prompts become near-identical (one reply for every
  prompt);
- ``length``: the same, and completion lengths run to the ``max_new_tokens`` cap or to almost nothing;
- ``proxy``: one reward component rises while another falls, both beyond their noise.

Each kind fires once per run by default (``cooldown`` lets it fire again after that many steps). The same object
runs live (subscribe ``observe_event`` to the event stream) and offline (``watch_run_log(output_dir)``).
Standard library only: this runs on every logged step and ``%load_ext grpo_magic`` stays light.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

KINDS = ("divergence", "repetition", "collapse", "length", "proxy")
EVAL = "eval"  # the task metric name of the in-run evaluation (EvalScored, --eval-steps)

#: The defaults, and why, are in docs/explanation/watch.md ("The statistics, and why").
DEFAULTS: dict[str, Any] = {
    "window": 16,          # steps in the trend window (the last W logged steps)
    "min_steps": 8,        # no test before this many logged steps
    "z_rise": 3.09,        # one-sided Mann-Kendall z for "rises" (p ~ 0.001 per test)
    "follow": 0.5,         # a task metric "does not follow" the reward when its rise, plus task_se_k standard
    "task_se_k": 3.0,      # errors, is below this share of the reward's rise over the same window
    "noise_k": 3.0,        # the Theil-Sen rise over the window must exceed noise_k x the step-to-step noise
    "min_rise": 0.05,      # ... and this much on the reward's own scale (rewards are in [0, 1])
    "repeat_cover": 0.5,   # one repeated unit covers this share of a completion's characters: repetitive
    "repeat_share": 0.3,   # repetition: this share of a step's completions are repetitive (last 3 steps' mean)
    "collapse_sim": 0.8,   # character-trigram Jaccard similarity of two "near-identical" completions
    "collapse_share": 0.5,  # collapse: this share of completions has a near-identical twin for another prompt
    "cap_share": 0.9,      # length to the cap: mean length >= this share of max_new_tokens (last 3 steps)
    "tiny_share": 0.1,     # length to nothing: mean length <= this share of the window's first length
    "recent": 3,           # "the last few steps" for the level conditions
}


@dataclass
class Alarm:
    """A detector's finding: ``kind`` (one of ``KINDS``), the ``step`` it fired at, a one-sentence ``message``
    and its ``evidence`` (the metric values over the window, the test statistics, two or three completions)."""

    kind: str
    step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "message": self.message, "evidence": _copy(self.evidence)}


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------------ statistics


def mann_kendall(values: Sequence[float]) -> float:
    """The Mann-Kendall trend statistic as a z-score (with the tie correction and continuity correction).

    Positive: the series tends to rise. Under "no trend" (any exchangeable noise) z is about standard normal, so
    z >= 3.09 happens by chance in about 0.1% of windows (2.33: 1%). 0.0 for fewer than 3 values or a constant series.
    """
    n = len(values)
    if n < 3:
        return 0.0
    s = 0
    for i in range(n - 1):
        vi = values[i]
        for j in range(i + 1, n):
            d = values[j] - vi
            if d > 1e-12:
                s += 1
            elif d < -1e-12:
                s -= 1
    ties = Counter(round(v, 12) for v in values).values()
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18.0
    if var <= 0 or s == 0:
        return 0.0
    return (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var)


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def theil_sen(values: Sequence[float]) -> float:
    """The Theil-Sen slope per step: the median of the pairwise slopes (robust to a few outlying steps)."""
    n = len(values)
    if n < 2:
        return 0.0
    return _median([(values[j] - values[i]) / (j - i) for i in range(n - 1) for j in range(i + 1, n)])


def step_noise(values: Sequence[float]) -> float:
    """The series' step-to-step noise (one step's standard deviation): the root mean square of the first
    differences over sqrt(2) (von Neumann's estimator; differencing removes a steady trend)."""
    if len(values) < 3:
        return 0.0
    diffs = [values[i + 1] - values[i] for i in range(len(values) - 1)]
    return math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs)))


def trend(values: Sequence[float]) -> dict[str, float]:
    """z (Mann-Kendall), the Theil-Sen rise over the window (slope x (n - 1)), the step noise, and the rise's
    standard error (that of a least-squares slope under that noise: noise x (n - 1) / sqrt(n (n^2 - 1) / 12))."""
    n = len(values)
    noise = step_noise(values)
    se = noise * (n - 1) / math.sqrt(n * (n * n - 1) / 12.0) if n >= 2 else 0.0
    return {"z": round(mann_kendall(values), 3), "rise": round(theil_sen(values) * (n - 1), 4),
            "noise": round(noise, 4), "se": round(se, 4)}


# ------------------------------------------------------------------------------------------- completion stats


_COUNT = itemgetter(1)


def repeat_coverage(text: str, max_n: int = 8, max_chars: int = 600, floor: float = 0.0,
                    first: bool = False) -> tuple[float, str]:
    """The share of a text's non-space characters covered by its most frequent character n-gram (n = 1..8),
    and that n-gram. ``"aaaa"`` -> (1.0, "a"); ``"banana banana"`` -> (1.0, "banana"). Only the first ``max_chars``
    characters are read (a bounded cost per completion).

    ``floor``: only a unit covering at least this share is looked for (the watch asks "repetitive or not"): a share
    at or above it is exact, one below it may be an underestimate. Text with no frequent unit stops after a few counts.
    ``first``: stop at the shortest unit that reaches ``floor`` (its share, which is then at least ``floor``, and
    that unit, not necessarily the best): enough to tell "repetitive or not" (``is_repetitive``).
    """
    chars = "".join(text[:max_chars].split())
    best, unit = 0.0, ""
    length = len(chars)
    if not length:
        return 0.0, ""
    need = floor * length  # a unit must cover at least this many characters to be of interest

    def hopeless(most: float) -> bool:  # no unit covering at most ``most`` characters can be the answer
        return most <= best * length or most < need

    bound = length  # the most frequent (n-1)-gram's count: no n-gram occurs more often
    for n in range(1, min(max_n, length) + 1):
        if hopeless(min(length, bound * max_n)):  # no unit this long or longer can cover enough
            break
        if hopeless(min(length, bound * n)):  # nor one of exactly this length: its n-grams are left uncounted
            continue  # (``bound`` stays an upper bound on every longer unit's count)
        # n-grams as tuples of characters, counted in C (zip), not as sliced strings in a Python loop
        grams = Counter(chars) if n == 1 else Counter(zip(*(chars[k:] for k in range(n)), strict=False))  # shorter tails end it
        top, count = max(grams.items(), key=_COUNT)  # most_common(1)'s answer, ties included, without its heapq call
        bound = count
        if count < 2 or hopeless(min(length, count * n)):  # no unit repeats, or it cannot cover enough
            continue
        gram = "".join(top)
        if any(gram[:k] == gram[n - k:] for k in range(1, n)):  # occurrences may overlap ("aa", "abab"): walk them
            covered = 0
            end = -1
            start = chars.find(gram)
            while start != -1:  # characters covered by the occurrences (overlapping ones counted once)
                covered += start + n - 1 - max(end, start - 1)
                end = start + n - 1
                start = chars.find(gram, start + 1)
        else:  # a unit with no border never overlaps itself: its occurrences cover count x n characters
            covered = count * n
        share = covered / length
        if share > best + 1e-12:
            best, unit = share, gram
            if first and best >= floor:
                break
    return best, unit


def is_repetitive(text: str, share: float) -> bool:
    """Does one repeated unit (``repeat_coverage``) cover at least ``share`` of the text? The same verdict as
    ``repeat_coverage(text)[0] >= share``, in about half its time: the search ends at the first unit that does."""
    return repeat_coverage(text, floor=share, first=True)[0] >= share


REPEAT_JUDGED = 8  # completions judged for repetition per step (evenly spaced): a bounded cost per step


def _spaced(items: Sequence[Any], limit: int) -> list[Any]:
    """At most ``limit`` items, evenly spaced (all of them when there are fewer)."""
    if len(items) <= limit:
        return list(items)
    return [items[round(i * (len(items) - 1) / (limit - 1))] for i in range(limit)]


def _trigrams(text: str, max_chars: int = 600) -> frozenset[Any]:
    """A text's character trigrams (lower case, runs of space as one), as tuples zipped in C: a set per text."""
    t = " ".join(text[:max_chars].lower().split())
    if len(t) < 3:
        return frozenset((t,))
    return frozenset(zip(t, t[1:], t[2:], strict=False))  # the shorter tails end it


def collapse_share(pairs: Sequence[tuple[str, str]], threshold: float, limit: int = 32) -> float | None:
    """The share of completions with a near-identical twin (trigram Jaccard >= threshold) among the completions of
    *other* prompts; with one distinct prompt, among the completions of the same group. None for < 2 completions.

    At most ``limit`` completions (evenly spaced) are compared, so the cost is bounded (32: 496 pairs)."""
    if len(pairs) < 2:
        return None
    pairs = _spaced(pairs, limit)
    prompts = [p for p, _ in pairs]
    cross = len(set(prompts)) > 1
    seen: dict[str, frozenset[Any]] = {}  # a text repeated (a collapsed group) has its trigrams made once
    grams = [seen[c] if c in seen else seen.setdefault(c, _trigrams(c)) for _, c in pairs]
    sizes = [len(g) for g in grams]  # never 0: a text too short for a trigram is one item (_trigrams)
    twin = [False] * len(pairs)
    for i in range(len(pairs)):
        gi, si, pi = grams[i], sizes[i], prompts[i]
        for j in range(i + 1, len(pairs)):
            if (twin[i] and twin[j]) or (cross and pi == prompts[j]):
                continue
            # Jaccard >= threshold needs the smaller set to be at least threshold x the larger: skip the
            # intersection of two texts of very different lengths
            sj = sizes[j]
            if (sj if sj < si else si) < threshold * (si if sj < si else sj):
                continue
            inter = len(gi & grams[j])  # Jaccard = inter / union, the union being si + sj - inter
            if inter >= threshold * (si + sj - inter):
                twin[i] = twin[j] = True
    return sum(twin) / len(twin)


# --------------------------------------------------------------------------------------------------- the watch


def _get(event: Any, name: str, default: Any = None) -> Any:
    if isinstance(event, Mapping):
        return event.get(name, default)
    return getattr(event, name, default)


def _type(event: Any) -> str:
    if isinstance(event, Mapping):
        return str(event.get("type", ""))
    try:
        return str(event.type)
    except Exception:  # noqa: BLE001 - not an event
        return ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _mean(values: Iterable[float]) -> float | None:
    v = list(values)
    return sum(v) / len(v) if v else None


def task_metrics_of(env: Any) -> tuple[str, ...]:
    """The task metrics an env names (its ``task_metrics`` attribute, class or instance): a tuple of names."""
    names = getattr(env, "task_metrics", ()) or ()
    if isinstance(names, str):
        names = (names,)
    return tuple(str(n) for n in names)


class Watch:
    """Reward-hacking detectors over a run's events; ``observe_event(event) -> list[Alarm]``.

    ``task_metrics``: names of what measures the task itself: a reward component (``"task"`` reads
    ``components/task``), any metric TRL logs (``"kl"``...), or ``"eval"``: the in-run evaluation's held-out mean. Without them, divergence cannot be tested and the
    degeneration detectors test "the reward rises" alone. ``max_new_tokens`` is read from ``RunStarted`` when
    not given. ``cooldown``: None fires each kind once per run; a number of steps lets it fire again after that.
    Other keywords override ``DEFAULTS``.
    """

    def __init__(self, task_metrics: Iterable[str] = (), *, max_new_tokens: int | None = None,
                 cooldown: int | None = None, **settings: Any) -> None:
        unknown = set(settings) - set(DEFAULTS)
        if unknown:
            from grpo_magic.errors import GRPOMagicError

            raise GRPOMagicError(f"Watch has no setting {', '.join(sorted(unknown))}; its settings are "
                                 f"{', '.join(DEFAULTS)} (docs/explanation/watch.md, \"The statistics, and why\").")
        # One name given as a string is one name, not its letters.
        self.task_metrics = (task_metrics,) if isinstance(task_metrics, str) else tuple(task_metrics)
        self.max_new_tokens = max_new_tokens
        self.cooldown = cooldown
        self.settings = {**DEFAULTS, **settings}
        self.alarms: list[Alarm] = []
        self.rows: list[dict[str, Any]] = []  # one per logged step: the per-step statistics the detectors read
        self._last_fired: dict[str, int] = {}
        self._groups: dict[int, list[Any]] = {}
        self._examples: list[tuple[str, str, float | None, dict[str, Any]]] = []  # the last step's episodes
        self._evals: list[tuple[int, float, float]] = []  # (step, held-out mean, its standard error)

    # ----------------------------------------------------------------------------------------- feeding events

    def observe_event(self, event: Any) -> list[Alarm]:
        """Feed one event (an ``grpo_magic.events`` dataclass or its JSON dict); returns the alarms it raised."""
        kind = _type(event)
        if kind == "run_started":
            params = _get(event, "params") or {}
            if self.max_new_tokens is None and isinstance(params, Mapping):
                cap = _number(params.get("rl_max_new_tokens"))
                self.max_new_tokens = int(cap) if cap else None
        elif kind == "group_scored":
            step = _get(event, "step")
            if isinstance(step, int):
                self._groups.setdefault(step, []).append(event)
        elif kind == "env_swapped":  # the reward means something else from here on: trends start again
            self.rows.clear()
            self._evals.clear()
        elif kind == "eval_scored":
            return self._eval(event)
        elif kind == "step_logged":
            step = _get(event, "step")
            if isinstance(step, int):
                return self._step(step, _get(event, "metrics") or {})
        return []

    def observe(self, events: Iterable[Any]) -> list[Alarm]:
        """Feed many events; returns every alarm they raised."""
        out: list[Alarm] = []
        for event in events:
            out += self.observe_event(event)
        return out

    # --------------------------------------------------------------------------------------- per-step stats

    def _step(self, step: int, metrics: Mapping[str, Any]) -> list[Alarm]:
        while self.rows and self.rows[-1]["step"] >= step:  # a resumed run replays steps from its checkpoint
            self.rows.pop()
        groups = self._groups.pop(step, [])
        for old in [s for s in self._groups if s < step]:
            del self._groups[old]
        row = self._row(step, metrics, groups)
        if row["reward"] is None:
            return []
        self.rows.append(row)
        window = self.settings["window"]
        if len(self.rows) > 4 * window:
            del self.rows[: len(self.rows) - 4 * window]
        if len(self.rows) < self.settings["min_steps"]:
            return []
        return self._detect(step)

    def _row(self, step: int, metrics: Mapping[str, Any], groups: list[Any]) -> dict[str, Any]:
        completions: list[tuple[str, str, float | None, dict[str, Any]]] = []
        for g in groups:
            prompt = str(_get(g, "prompt", ""))
            scores = list(_get(g, "scores") or [])
            comps = list(_get(g, "components") or [])
            for i, c in enumerate(_get(g, "completions") or []):
                completions.append((prompt, str(c), _number(scores[i]) if i < len(scores) else None,
                                    comps[i] if i < len(comps) and isinstance(comps[i], Mapping) else {}))
        reward = _number(metrics.get("reward"))
        if reward is None:
            reward = _mean(s for _, _, s, _ in completions if s is not None)
        components: dict[str, float] = {}
        for key, value in metrics.items():
            if key.startswith("components/") and _number(value) is not None:
                components[key[len("components/"):]] = float(value)
        for _, _, _, comp in completions:  # components the metrics lack: the mean over the step's episodes
            for key in comp:
                if key not in components and f"components/{key}" not in metrics:
                    components[key] = _mean(_number(c.get(key)) for _, _, _, c in completions
                                            if _number(c.get(key)) is not None) or 0.0
        tasks: dict[str, float | None] = {}
        for name in self.task_metrics:
            value = components.get(name)
            tasks[name] = value if value is not None else _number(metrics.get(name))
        length = _number(metrics.get("completions/mean_length"))
        if completions:
            self._examples = completions  # sorted only when an alarm shows them (_examples_for)
        return {
            "step": step,
            "reward": reward,
            "tasks": tasks,
            "components": components,
            # The text statistics are computed when a detector first asks for them (``_text_stats``): only while
            # the reward rises and no task metric follows it, so an honest run whose task follows pays nothing.
            "episodes": completions,  # (prompt, completion, score, components): what the text statistics read
            "length": length,
            "clipped": _number(metrics.get("completions/clipped_ratio")),
            "chars": _mean(len(c) for _, c, _, _ in completions),
        }

    # ------------------------------------------------------------------------------------------- detectors

    def _eval(self, event: Any) -> list[Alarm]:
        """Divergence against the in-run evaluation (task metric ``"eval"``): the reward rose between the last two
        evaluations (the rise test over the steps between them) and the held-out mean did not follow (its change,
        plus task_se_k standard errors of the difference, is below ``follow`` x the reward's rise)."""
        step, point = _get(event, "step"), _eval_point(event)
        if not isinstance(step, int) or point is None:
            return []
        while self._evals and self._evals[-1][0] >= step:
            self._evals.pop()
        self._evals.append((step, *point))
        if EVAL not in self.task_metrics or len(self._evals) < 2 or not self._may_fire("divergence", step):
            return []
        (s0, v0, se0), (s1, v1, se1) = self._evals[-2:]
        span = [r for r in self.rows if s0 < r["step"] <= s1]
        rewards = [r["reward"] for r in span]
        rising, rt = self._rises(rewards, self.settings["min_rise"])
        se = math.sqrt(se0 * se0 + se1 * se1)
        if not rising or (v1 - v0) + self.settings["task_se_k"] * se >= self.settings["follow"] * rt["rise"]:
            return []
        out: list[Alarm] = []
        self._fire("divergence", step, (
            f"The reward rose from {rewards[0]:.2f} to {rewards[-1]:.2f} over steps {span[0]['step']}-{s1} while the "
            f"held-out evaluation did not ({v0:.2f} at step {s0}, {v1:.2f} at step {s1}): the model may be gaming "
            "the reward instead of doing the task."),
            {"steps": [r["step"] for r in span], "reward": [round(v, 4) for v in rewards], "reward_trend": rt,
             "metric": EVAL, "evals": [{"step": e[0], "mean": round(e[1], 4), "se": round(e[2], 4)}
                                       for e in self._evals[-2:]], "examples": self._examples_for()}, out)
        return out

    def _text_stats(self, row: dict[str, Any], key: str) -> None:
        """A row's repetition (``key`` "repeat") or collapse statistic, each computed once, when its detector first
        asks (see ``_row``): after a detector has fired, its statistic is never computed again."""
        if key in row:
            return
        episodes = row["episodes"]
        if key == "repeat":
            judged = _spaced([c for _, c, _, _ in episodes if len("".join(c.split())) >= 8], REPEAT_JUDGED)
            # Which completions are repetitive is all the statistic needs; the unit each repeats is looked for
            # only when an alarm names it (``_repeat_unit``).
            row["repetitive"] = [c for c in judged if is_repetitive(c, self.settings["repeat_cover"])]
            row["repeat"] = len(row["repetitive"]) / len(judged) if judged else None
        else:
            row["collapse"] = collapse_share([(p, c) for p, c, _, _ in episodes], self.settings["collapse_sim"])
        if "repeat" in row and "collapse" in row:
            del row["episodes"]  # both statistics known: the texts are not needed any more

    def _repeat_unit(self) -> str:
        """The unit repeated most often in the repetitive completions of the last step that had any."""
        floor = self.settings["repeat_cover"]
        for row in reversed(self.rows):
            if row.get("repetitive"):
                return Counter(repeat_coverage(c, floor=floor)[1] for c in row["repetitive"]).most_common(1)[0][0]
        return ""

    def _recent_level(self, key: str) -> float | None:
        """The mean of a text statistic (``repeat`` or ``collapse``) over its last ``recent`` values in the window,
        computing it for those rows only: a detector whose level is below its threshold never fires, so the older
        rows' statistics are computed only once the level is reached (the same verdicts as over the whole series)."""
        values: list[float] = []
        for r in reversed(self.rows[-self.settings["window"]:]):
            self._text_stats(r, key)
            if r[key] is not None:
                values.append(float(r[key]))
                if len(values) == self.settings["recent"]:
                    break
        return _mean(values)

    def _series(self, key: str, sub: str | None = None) -> tuple[list[int], list[float]]:
        rows = self.rows[-self.settings["window"]:]
        steps, values = [], []
        for r in rows:
            if key in ("repeat", "collapse"):
                self._text_stats(r, key)
            v = r[key] if sub is None else r[key].get(sub)
            if v is not None:
                steps.append(r["step"])
                values.append(float(v))
        return steps, values

    def _rises(self, values: list[float], min_rise: float = 0.0) -> tuple[bool, dict[str, float]]:
        t = trend(values)
        ok = (len(values) >= self.settings["min_steps"] and t["z"] >= self.settings["z_rise"]
              and t["rise"] > self.settings["noise_k"] * t["noise"] and t["rise"] >= min_rise)
        return ok, t

    def _falls(self, values: list[float], t: dict[str, float] | None = None) -> tuple[bool, dict[str, float]]:
        """The rise test on the negated series, from the series' own trend ``t`` when given: negating a series
        negates its z and Theil-Sen rise exactly and leaves its noise, so no second trend is computed."""
        t = trend(values) if t is None else t
        s = self.settings
        ok = (len(values) >= s["min_steps"] and -t["z"] >= s["z_rise"] and -t["rise"] > s["noise_k"] * t["noise"]
              and -t["rise"] >= 0.0)
        return ok, {"z": t["z"], "rise": t["rise"], "noise": t["noise"]}

    def _may_fire(self, kind: str, step: int) -> bool:
        last = self._last_fired.get(kind)
        return last is None or (self.cooldown is not None and step - last >= self.cooldown)

    def _fire(self, kind: str, step: int, message: str, evidence: dict[str, Any], out: list[Alarm]) -> None:
        self._last_fired[kind] = step
        alarm = Alarm(kind, step, message, evidence)
        self.alarms.append(alarm)
        out.append(alarm)

    def _examples_for(self, key: Any = None, n: int = 3) -> list[dict[str, Any]]:
        pool = sorted(self._examples, key=lambda x: -(x[2] if x[2] is not None else -1.0))  # best first
        if key is not None:
            pool.sort(key=key)  # stable: best first among equals
        out, seen = [], set()
        for prompt, completion, score, comps in pool:
            if completion in seen:
                continue
            seen.add(completion)
            text = completion if len(completion) <= 200 else completion[:200] + "..."
            out.append({"prompt": prompt[:200], "completion": text, "score": score, "components": dict(comps)})
            if len(out) == n:
                break
        return out

    def _detect(self, step: int) -> list[Alarm]:
        s = self.settings
        out: list[Alarm] = []
        steps, reward = self._series("reward")
        rising, rt = self._rises(reward, s["min_rise"])
        tasks_evidence: dict[str, Any] = {}

        def base(**more: Any) -> dict[str, Any]:  # an alarm's evidence, built only when one fires
            return {"steps": steps, "reward": [round(v, 4) for v in reward], "reward_trend": rt, **tasks_evidence,
                    **more}

        lagging: list[str] = []  # task metrics that do not rise with the reward
        task_series: dict[str, list[float]] = {}
        task_trends: dict[str, dict[str, float]] = {}
        for name in self.task_metrics:
            if name == EVAL:
                continue  # sparse: tested when an evaluation arrives (_eval)
            _, values = self._series("tasks", name)
            if len(values) < s["min_steps"]:
                continue
            task_series[name] = [round(v, 4) for v in values]
            t = task_trends[name] = trend(values)
            # Confident that the task rose less than half as much as the reward (its own noise widens the doubt).
            if t["rise"] + s["task_se_k"] * t["se"] < s["follow"] * rt["rise"]:
                lagging.append(name)
        if task_series:
            tasks_evidence.update(tasks=task_series, task_trends=task_trends)
        # Degeneration counts only while the reward rises and no task metric rises with it.
        unexplained = rising and (not task_series or len(lagging) == len(task_series))

        if rising and lagging and self._may_fire("divergence", step):
            name = lagging[0]
            values = task_series[name]
            self._fire("divergence", step, (
                f"The reward rose from {reward[0]:.2f} to {reward[-1]:.2f} over steps {steps[0]}-{steps[-1]} while "
                f"the task metric '{name}' did not rise ({values[0]:.2f} to {values[-1]:.2f}): the model may be "
                "gaming the reward instead of doing the task."),
                base(metric=name, examples=self._examples_for()), out)

        if unexplained and self._may_fire("repetition", step) and (
                self._recent_level("repeat") or 0.0) >= s["repeat_share"]:
            rsteps, rep = self._series("repeat")
            if len(rep) >= s["min_steps"] and self._rises(rep)[0]:  # its recent level: checked above
                unit = self._repeat_unit()
                self._fire("repetition", step, (
                    f"While the reward rose ({reward[0]:.2f} to {reward[-1]:.2f}), {rep[-1]:.0%} of the "
                    f"completions at step {step} became one repeated {unit!r} covering most of their text."),
                    base(repetitive_share=[round(v, 3) for v in rep], repetitive_steps=rsteps, unit=unit,
                         examples=self._examples_for(lambda x: -repeat_coverage(x[1])[0])), out)

        if unexplained and self._may_fire("collapse", step) and (
                self._recent_level("collapse") or 0.0) >= s["collapse_share"]:
            csteps, col = self._series("collapse")
            if len(col) >= s["min_steps"] and self._rises(col)[0]:  # its recent level: checked above
                self._fire("collapse", step, (
                    f"While the reward rose ({reward[0]:.2f} to {reward[-1]:.2f}), {col[-1]:.0%} of the "
                    f"completions at step {step} were near-copies of the replies to other prompts: one reply "
                    "for every prompt."),
                    base(collapse_share=[round(v, 3) for v in col], collapse_steps=csteps,
                         examples=self._examples_for()), out)

        if unexplained and self._may_fire("length", step):
            key = "length" if any(r["length"] is not None for r in self.rows) else "chars"
            lsteps, lengths = self._series(key)
            recent = _mean(lengths[-s["recent"]:]) if lengths else None
            cap = self.max_new_tokens if key == "length" else None
            # the levels first: the trend is computed only when one of them is reached
            to_cap = bool(cap) and recent is not None and recent >= s["cap_share"] * cap
            to_nothing = recent is not None and bool(lengths) and recent <= s["tiny_share"] * max(lengths[0], 1e-9)
            up, lt = self._rises(lengths) if to_cap or to_nothing else (False, {})
            down, _ = self._falls(lengths, lt) if to_nothing else (False, {})

            def evidence(**more: Any) -> dict[str, Any]:
                return base(lengths=[round(v, 2) for v in lengths], length_steps=lsteps, length_trend=lt,
                            max_new_tokens=cap, **more)

            if up and to_cap:
                self._fire("length", step, (
                    f"While the reward rose ({reward[0]:.2f} to {reward[-1]:.2f}), the completions ran to the "
                    f"length cap: {lengths[0]:.1f} to {lengths[-1]:.1f} tokens of {cap}."),
                    evidence(direction="cap", examples=self._examples_for(lambda x: -len(x[1]))), out)
            elif down and to_nothing:
                self._fire("length", step, (
                    f"While the reward rose ({reward[0]:.2f} to {reward[-1]:.2f}), the completions shrank to "
                    f"almost nothing: {lengths[0]:.1f} to {lengths[-1]:.1f} {'tokens' if cap else 'characters'}."),
                    evidence(direction="nothing", examples=self._examples_for(lambda x: len(x[1]))), out)

        if self._may_fire("proxy", step):
            names = sorted({k for r in self.rows[-s["window"]:] for k in r["components"]})
            series = {n: self._series("components", n) for n in names}
            ups, downs = {}, {}
            for n, (_, values) in series.items():
                up, t = self._rises(values)
                if up:
                    ups[n] = t
                down, t = self._falls(values, t)
                if down:
                    downs[n] = t
            if ups and downs:
                a = max(ups, key=lambda n: ups[n]["z"])
                b = min(downs, key=lambda n: downs[n]["z"])
                va, vb = series[a][1], series[b][1]
                self._fire("proxy", step, (
                    f"The reward component '{a}' rose ({va[0]:.2f} to {va[-1]:.2f}) while '{b}' fell "
                    f"({vb[0]:.2f} to {vb[-1]:.2f}) over steps {series[a][0][0]}-{step}: one part of the reward "
                    "is taking over the others."),
                    base(rising=a, falling=b, components={a: [round(v, 4) for v in va], b: [round(v, 4) for v in vb]},
                         component_trends={a: ups[a], b: downs[b]}, examples=self._examples_for()), out)
        return out


def _eval_point(event: Any) -> tuple[float, float] | None:
    """An evaluation's held-out mean (greedy, else sampled) and its standard error (from its 95% bootstrap
    interval, else binomial over its prompts)."""
    for mean_key, ci_key in (("greedy_mean", "greedy_ci"), ("sampled_mean", "sampled_ci")):
        value = _number(_get(event, mean_key))
        if value is None:
            continue
        ci = _get(event, ci_key)
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_number(c) is not None for c in ci):
            return value, (float(ci[1]) - float(ci[0])) / 3.92
        prompts = _number(_get(event, "prompts")) or 0
        return value, math.sqrt(max(0.0, value * (1 - value)) / prompts) if prompts else 0.0
    return None


def watch_run_log(output_dir: Any, task_metrics: Iterable[str] = (), **options: Any) -> list[Alarm]:
    """Replay a run log (a run folder or its ``events.jsonl``) through a new ``Watch``; the alarms it raises."""
    from grpo_magic.errors import GRPOMagicError
    from grpo_magic.events import read_run_log, run_log_path

    watch = Watch(task_metrics, **options)
    if not run_log_path(output_dir).is_file():
        raise GRPOMagicError(f"No run log at {run_log_path(output_dir)}; pass the output folder of a run (it holds "
                             "events.jsonl).")
    return watch.observe(read_run_log(output_dir, skipped=[]))
