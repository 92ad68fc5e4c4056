"""Tests of the runnable examples (the reference RAG service)."""
