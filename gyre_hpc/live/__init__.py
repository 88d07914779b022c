"""Rank 0 of a live run: allocator server + proxy + harness + data-plane hub (see docs/runtime.md)."""
