"""Fault injection against the real broker: crashes, broker restarts, hostile input."""
