"""What torch should do with one load here and now, and the load that asserts it."""
