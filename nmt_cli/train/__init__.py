"""Training: loss, learning-rate schedule, checkpoints, and the update loop."""
