"""Workloads: trace files (native and Azure formats), synthetic arrival processes and length
distributions, multi-turn conversations, and trace statistics.
"""
