"""batching: see chunk.py."""
