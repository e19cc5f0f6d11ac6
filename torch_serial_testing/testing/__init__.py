"""The test-author layer: the mixin, generated tests, per-test isolation, exact comparison."""
