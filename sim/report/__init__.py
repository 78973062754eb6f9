"""Reports: the plots, `report.md`, the interactive `report.html` and the Chrome/Perfetto trace
export, drawn from an experiment's result files.
"""
from __future__ import annotations

from sim.report.mpl_home import use_own_folder

use_own_folder()  # before any report module imports matplotlib
