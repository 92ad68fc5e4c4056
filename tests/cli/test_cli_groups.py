"""Command groups shared by several modules (``guardrail eval ...``)."""

from __future__ import annotations

import argparse

import pytest

from sidecar.cli import retrieval
from sidecar.cli.groups import get_group
from sidecar.cli.main import build_parser
from sidecar.exceptions import ConfigError


def test_group_is_created_once_and_shared() -> None:
    parser = argparse.ArgumentParser(prog="guardrail")
    sub = parser.add_subparsers(dest="command", required=True)
    first = get_group(sub, "eval", "Evaluate.")
    first.add_parser("lookback").set_defaults(which="lookback")
    again = get_group(sub, "eval", "ignored the second time")
    assert again is first
    again.add_parser("claims").set_defaults(which="claims")
    assert parser.parse_args(["eval", "lookback"]).which == "lookback"
    assert parser.parse_args(["eval", "claims"]).which == "claims"
    with pytest.raises(SystemExit):
        parser.parse_args(["eval"])  # a sub-command is required


def test_a_plain_command_is_not_a_group() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sub.add_parser("run")
    with pytest.raises(ConfigError, match="not a command group"):
        get_group(sub, "run", "")


def test_retrieval_commands_register_in_any_order() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    get_group(sub, "eval", "Evaluate.").add_parser("claims")
    retrieval.register(sub)
    args = parser.parse_args(
        ["eval", "retrieval", "--calibration", "c.json", "--questions", "q", "--corpus", "a", "b"]
    )
    assert args.func is retrieval.run_eval
    assert [str(p) for p in args.corpus] == ["a", "b"]
    assert args.split == "test"
    args = parser.parse_args(
        ["calibrate", "retrieval", "--questions", "q", "--corpus", "c", "--out", "o.json"]
    )
    assert args.func is retrieval.run_calibrate
    assert (args.alpha, args.top_k, args.beta, args.split) == ("0.1", 10, 0.0, "cal")


def test_guardrail_parser_has_the_retrieval_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["calibrate", "retrieval", "--questions", "q", "--corpus", "c", "--out", "o.json",
         "--qdrant-url", "http://qdrant:6333"]
    )  # fmt: skip
    assert args.qdrant_url == "http://qdrant:6333"
    with pytest.raises(SystemExit):
        parser.parse_args(
            ["calibrate", "retrieval", "--questions", "q", "--corpus", "c", "--out", "o",
             "--qdrant-url", "u", "--qdrant-path", "p"]
        )  # fmt: skip
