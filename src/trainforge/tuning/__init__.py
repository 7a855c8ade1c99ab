"""Hyperparameter search with Optuna: search spaces, studies, parallel trials.

    result = trainforge.tune("digits_cnn", "recipes/sweeps/digits_cnn.yaml", trials=20)   # see tuning.api.tune
"""
