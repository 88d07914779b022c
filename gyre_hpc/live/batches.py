"""The live runtime's fixed batches: the allocator's one former (``gyre_hpc.allocator.batches``), re-exported."""
from gyre_hpc.allocator.batches import FixedBatches

__all__ = ["FixedBatches"]
