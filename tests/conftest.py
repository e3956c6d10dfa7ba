"""Plugins for the whole suite."""

pytest_plugins = ["pytester", "tests.bytecode", "tests.slow_budget"]
