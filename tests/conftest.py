"""Plugins for the whole suite."""

pytest_plugins = ["pytester", "tests.slow_budget"]
