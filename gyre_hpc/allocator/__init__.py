"""The allocator: pure scheduling policies over plain-data state, and the simulator that drives them.

``policies.make_policy(scheduler_cfg, cells)`` returns an object with ``decide(state, now) -> list[Order]``.
The simulator (``allocator.sim``) and the live allocator update a ``SchedState`` from events and apply the
orders; neither the policies nor the state read a clock, do I/O, or draw random numbers.
"""
