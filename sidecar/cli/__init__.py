"""The ``guardrail`` command line: a module per command group; lab commands import lazily."""
