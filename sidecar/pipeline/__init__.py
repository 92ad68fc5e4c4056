"""The sidecar's core: join the two halves of a request, score it, decide. No I/O."""
