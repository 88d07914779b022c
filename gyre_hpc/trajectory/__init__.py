"""Trajectory processing: TITO records → per-run prefix tree → J_max selection → scores and advantages →
packed rows (flat or tree) in which every generated token on several paths is trained exactly once.

Pure Python/numpy; only ``collate`` (the conversion to torch tensors) imports torch.
"""
