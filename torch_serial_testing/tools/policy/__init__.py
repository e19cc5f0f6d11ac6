"""The tools: everything that is not the vendored core."""
