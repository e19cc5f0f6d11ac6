"""Reading checkpoints without unpickling them: torch's records, and every pickle walked statically."""
