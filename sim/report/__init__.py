"""Reports: the plots, `report.md`, the interactive `report.html` and the Chrome/Perfetto trace
export, drawn from an experiment's result files.
"""
