"""Hyperparameter search with Optuna: search spaces, studies, parallel trials."""
