"""Metrics: the per-step log, the per-request table and the summary columns (named as in `vllm
bench serve`), plus KV-usage summaries.
"""
