"""Kafka adapters: the FastStream app, topic admin, client security."""
