"""The discrete-event simulator: virtual time, one event heap, the same policy objects as a live run."""
