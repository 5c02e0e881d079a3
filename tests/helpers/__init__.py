"""Shared non-test code of the test tree: scenes, oracles, CLI runners, browsers, and the worker
scripts that multi-process tests launch as ``python -m tests.helpers.<worker>``."""
