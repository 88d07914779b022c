"""Plots and tables (edge modules: matplotlib is imported here, never in the core)."""
