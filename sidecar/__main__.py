"""``python -m sidecar``: the ``guardrail`` command line."""

from sidecar.cli.main import main

raise SystemExit(main())
