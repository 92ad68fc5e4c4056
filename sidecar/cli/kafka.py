"""``guardrail kafka fetch|start|stop|status``: the project's local Apache Kafka broker."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson


def register(sub: Any) -> None:
    p = sub.add_parser("kafka", help="fetch, start, stop the local single-node Kafka broker")
    p.add_argument(
        "--home", type=Path, help="state directory (default $KAFKA_LOCAL_HOME or ./.kafka)"
    )
    p.add_argument("--port", type=int, default=9092, help="PLAINTEXT port on 127.0.0.1")
    p.add_argument("--controller-port", type=int, default=9093, help="KRaft controller port")
    cmds = p.add_subparsers(dest="kafka_command", metavar="ACTION", required=True)
    cmds.add_parser("fetch", help="download the broker's jars from Maven Central").set_defaults(
        func=run
    )
    cmds.add_parser("start", help="format (first time) and start; wait until ready").set_defaults(
        func=run
    )
    cmds.add_parser("stop", help="stop the broker").set_defaults(func=run)
    cmds.add_parser("status", help="print the broker's status as JSON").set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the local broker is lab tooling: imported when this command runs, not by `guardrail run`
    from sidecar.lab.localkafka.broker import (  # noqa: PLC0415
        LocalKafka,
        default_home,
        ensure_jars,
        lib_for,
    )

    home: Path = (args.home or default_home()).resolve()
    action = args.kafka_command
    lib = ensure_jars(lib_for(home)) if action in {"fetch", "start"} else lib_for(home)
    if action == "fetch":
        sys.stdout.write(f"Kafka jars in {lib}\n")
        return 0
    instance = home / "broker"
    if action == "start":
        broker = LocalKafka(instance, lib, port=args.port, controller_port=args.controller_port)
        broker.start()
        sys.stdout.write(f"Kafka broker ready on {broker.bootstrap_servers} (data in {instance})\n")
        return 0
    if not (instance / "ports.json").exists():
        sys.stdout.write(
            orjson.dumps({"running": False, "instance_dir": str(instance)}).decode() + "\n"
        )
        return 0 if action == "stop" else 1
    broker = LocalKafka.from_instance_dir(instance, lib)
    if action == "stop":
        stopped = broker.stop()
        sys.stdout.write("stopped\n" if stopped else "not running\n")
        return 0
    status = broker.status()
    sys.stdout.write(orjson.dumps(status).decode() + "\n")
    return 0 if status["serving"] else 1
