"""The live dashboard of a run (docs/architecture.md, "The dashboard").

Modules with one job each: ``state`` folds events into a view model (``RunView``, also what the
terminal progress prints), ``html`` builds the HTML of that view, ``live`` sends the curves' new
points to the page (an anywidget widget drawn by uPlot), ``curves`` draws them as a PNG when asked,
``compare`` overlays other runs, and ``widget`` is the one object that displays a run, rendered off
the training thread (``Dashboard``). Importing this package does not import ipywidgets, anywidget
or matplotlib.
"""

from __future__ import annotations

from .state import RunView
from .widget import LATEST, Dashboard, replay

__all__ = ["LATEST", "Dashboard", "RunView", "replay"]
