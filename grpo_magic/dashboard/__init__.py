"""The live dashboard of a run (docs/architecture.md, "The dashboard").

Four rooms, one job each: ``state`` folds events into a view model (``RunView``, also what the
terminal progress prints), ``html`` builds the HTML of that view, ``curves`` draws the curves,
and ``widget`` is the one object that displays and throttles (``Dashboard``). Importing this
package does not import ipywidgets or matplotlib.
"""

from __future__ import annotations

from .state import RunView
from .widget import LATEST, Dashboard, replay

__all__ = ["LATEST", "Dashboard", "RunView", "replay"]
