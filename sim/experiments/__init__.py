"""Experiments: the YAML schema and config loader, sweep expansion, one run's execution, local and
Dask executors, capacity search and result files.
"""
