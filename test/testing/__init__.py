"""Tests of the mixin and the core modules around it: case, outcomes, isolation, instantiation, comparison, the pytest plugin."""
