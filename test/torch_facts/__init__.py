"""Tests of what the library asks torch: its unpickler's rules, load decisions, registry, devices."""
