"""The steady fused training step (work in progress)."""
