"""Outcome rows of the real RAG loop, the calibrated-confidence fit and the evaluation report."""
