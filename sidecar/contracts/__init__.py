"""Event contracts and their wire codec."""
