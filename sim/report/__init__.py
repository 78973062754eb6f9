"""Reports: plots, `report.md` and the Chrome/Perfetto trace export, drawn from an experiment's
result files.
"""
