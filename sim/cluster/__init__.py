"""Replicas on one clock behind a router: the layer between the engine and the experiments."""
