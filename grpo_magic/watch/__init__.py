"""The reward-hacking watch: detectors over a run's events that raise alarms when the reward rises and
the task does not (docs/explanation/watch.md). Standard library only, so that importing it stays light."""

from __future__ import annotations

from .detectors import DEFAULTS, EVAL, KINDS, Alarm, Watch, task_metrics_of, watch_run_log

__all__ = ["DEFAULTS", "EVAL", "KINDS", "Alarm", "Watch", "task_metrics_of", "watch_run_log"]
