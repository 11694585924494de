"""The curve panels of the dashboard, declared once: what each shows, for both renderers.

The live chart (``live``: uPlot in the page) and the picture (``curves``: a matplotlib PNG, for
replays, exports and frontends without widgets) draw the same panels from this table, and the view
model (``state``) keeps exactly the metrics they name. ``RunView.panels()`` is what a run shows:
these, the optional ones that have data (TRL's tool metrics), and one line per reward component.
A step marked on every panel (an env swap, an alarm of the reward-hacking watch) is an entry in
``RunView.markers``. The task metrics a run names (its ``watch`` parameter, the env's ``task_metrics``) are
drawn beside the reward, dashed, on the reward panel (``reward_panel``), so that a reward that rises while the
task stays flat shows in one picture.
"""

from __future__ import annotations

import dataclasses

BLUE, PURPLE, TEAL, AMBER, RED, GREY = "#2563eb", "#7c3aed", "#0f766e", "#d97706", "#dc2626", "#6b7280"


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of a panel: a metric of ``RunView.metrics``."""

    metric: str
    color: str
    label: str = ""
    dashed: bool = False
    share: bool = False  # a share in [0, 1], drawn against a second 0..1 axis on the right


@dataclasses.dataclass(frozen=True)
class Panel:
    """One small chart: its key (for notes and CSS hooks), title and series.

    ``band`` names the metric of a ± band around the first series (its std); ``group_range``
    adds the groups' lowest and highest score (``RunView.range_*``); ``ylim`` fixes the y range;
    ``min_top`` keeps at least [0, min_top] in view (a small error rate stays visibly small).
    """

    key: str
    title: str
    series: tuple[Series, ...]
    band: str | None = None
    group_range: bool = False
    ylim: tuple[float, float] | None = None
    min_top: float | None = None

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(s.metric for s in self.series) + ((self.band,) if self.band else ())


PANELS: tuple[Panel, ...] = (
    Panel("reward", "mean reward (± std, group min/max)", (Series("reward", BLUE, "mean"),), band="reward_std",
          group_range=True),
    Panel("kl", "KL", (Series("kl", PURPLE),)),
    Panel("loss", "loss", (Series("loss", TEAL),)),
    Panel("length", "completion length · clipped share (dashed)",
          (Series("completions/mean_length", BLUE, "mean length"),
           Series("completions/clipped_ratio", AMBER, "clipped share", dashed=True, share=True))),
    Panel("zero_std", "share of groups with zero reward std", (Series("frac_reward_zero_std", AMBER),),
          ylim=(-0.02, 1.02)),
    Panel("errors", "episode error rate", (Series("error_rate", RED),), min_top=0.05),
)


#: Shown when the run logs TRL's tool metrics (an agent env: TRL's tool loop runs its episodes).
TOOLS = Panel("tools", "tool calls per episode · failed share (dashed)",
              (Series("tools/call_frequency", BLUE, "calls per episode"),
               Series("tools/failure_frequency", RED, "failed share", dashed=True, share=True)))
#: Panels drawn only when their metrics have data.
OPTIONAL: tuple[Panel, ...] = (TOOLS,)

#: TRL's name prefix of the reward components an env returns (``components/<name>``).
COMPONENT_PREFIX = "components/"
#: Colors of the reward components' lines, in the order the components first appear.
COMPONENT_COLORS = ("#0891b2", "#db2777", "#65a30d", "#9333ea", "#ea580c", "#0d9488", "#4f46e5", "#ca8a04")


def components_panel(names: tuple[str, ...]) -> Panel:
    """One line per reward component (``components/<name>``: the mean over each step's scored episodes)."""
    return Panel("components", "reward components (mean)",
                 tuple(Series(COMPONENT_PREFIX + n, COMPONENT_COLORS[i % len(COMPONENT_COLORS)], n)
                       for i, n in enumerate(names)))


def task_label(name: str) -> str:
    """A task metric's name as the curves and alarm cards show it (``task``, ``task: valid``)."""
    return name if "task" in name.lower() else f"task: {name}"


def reward_panel(task_names: tuple[str, ...] = (), colors: dict[str, str] | None = None) -> Panel:
    """The reward panel, with the run's task metrics (reward components, ``components/<name>``) as dashed lines
    beside the mean reward, in the colors of their lines on the components panel (``colors``)."""
    if not task_names:
        return PANELS[0]
    colors = colors or {}
    tasks = tuple(Series(COMPONENT_PREFIX + n, colors.get(n, COMPONENT_COLORS[i % len(COMPONENT_COLORS)]),
                         task_label(n), dashed=True) for i, n in enumerate(task_names))
    base = PANELS[0]
    return dataclasses.replace(base, title="mean reward (± std, min/max) · task (dashed)",
                               series=base.series + tasks)


def curve_metrics(panels: tuple[Panel, ...] = PANELS + OPTIONAL) -> tuple[str, ...]:
    """Every metric the panels draw, once each, in panel order."""
    return tuple(dict.fromkeys(m for p in panels for m in p.metrics))
