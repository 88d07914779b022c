"""The cell runner of a live run: rollout side (engine), training side (core / satellite), data plane."""
