"""Sample event files shipped in the package: the demo's input events (importlib.resources)."""
