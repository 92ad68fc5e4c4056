"""The ``guardrail`` command line (also ``python -m sidecar``).

Each sub-command lives in its own module with ``register(subparsers)``; a module
imports its heavy dependencies inside the function that runs the command, so
``guardrail --help`` stays fast and the serving image needs no training extras.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from sidecar import __version__
from sidecar.exceptions import ConfigError, GuardrailError
from sidecar.lograte import calm_startup, limit_repeats, one_line, printable, report_repeats
from sidecar.redact import redact_text

# Modules that contribute sub-commands, in the order --help lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "sidecar.cli.run",
    "sidecar.cli.replay",
    "sidecar.cli.demo",
    "sidecar.cli.topics",
    "sidecar.cli.certificates",
    "sidecar.cli.dlq",
    "sidecar.cli.verdicts",
    "sidecar.cli.kafka",
    "sidecar.cli.config",
    "sidecar.cli.schemas",
    "sidecar.cli.chaos",
    "sidecar.cli.bench",
    "sidecar.cli.claims",
    "sidecar.cli.policy",
    "sidecar.cli.retrieval",
    "sidecar.cli.lookback",
    "sidecar.cli.report",
    "sidecar.cli.certify",
    "sidecar.cli.probe",
    "sidecar.cli.golden",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guardrail",
        description="Streaming guardrail sidecar for RAG services: allow / caveat / block.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def said(text: str) -> str:
    """An error's text for the terminal, as the log writes a message: each character that
    is not printable escaped and credentials in URLs masked. Its lines stay lines (the
    settings' errors list one per setting), each after the first indented, so none can
    pass for a line of its own: a path or a broker's reply quoted in an error wrote ESC
    sequences and a forged line to the terminal raw."""
    first, *rest = redact_text(text).split("\n")
    lines = [printable(first)]
    lines += [printable(line if line.startswith(" ") else f"  {line}") for line in rest]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("aiokafka", "faststream", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # a producer's malformed baggage header: a warning per member (180 per verdict, ~1 ms
    # of CPU with the line dropped), about text the sidecar only passes on
    logging.getLogger("opentelemetry.baggage").setLevel(logging.ERROR)
    # the client's "no group coordinator yet" retries while a new cluster starts: INFO
    calm_startup(logging.getLogger().handlers)
    # what they log at WARNING and above can come on every retry: one line per 10 s each
    limit_repeats(logging.getLogger().handlers)
    one_line(logging.getLogger().handlers)  # a producer's newline never starts a log line
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        sys.stderr.write(f"guardrail: configuration error: {said(str(exc))}\n")
        return 2
    except GuardrailError as exc:
        sys.stderr.write(f"guardrail: {said(str(exc))}\n")
        return 1
    except (IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError) as exc:
        # a path the user gave that cannot be written or read as asked (audit: --out naming
        # a directory, or an existing file, ended in a traceback)
        where = exc.filename2 or exc.filename or ""  # a rename's target, else the path
        sys.stderr.write(f"guardrail: {said(f'{where}: {exc.strerror or exc}')}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    finally:  # the counts of client lines held back since their last one went through
        report_repeats(logging.getLogger().handlers, every=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
