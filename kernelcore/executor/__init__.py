"""Executors and workers: run the model for the engine core."""
