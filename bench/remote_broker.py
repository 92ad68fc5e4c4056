"""Fast-path drains with the broker a network hop away: pipelined confirmations on and off.

The sidecar reaches the broker through a throttling TCP proxy
(``sidecar/lab/chaos/proxy.py``) that delays every chunk by ``--latency-ms``
each way; the load generator and the verdict reader connect directly. For each
latency it drains the same load with ``GUARDRAIL_KAFKA__BATCHES_IN_FLIGHT`` 0
(each batch's verdicts confirmed before the next batch is taken) and 4 (the
default), alternated ``--rounds`` times, and writes answers/s per drain.

    .venv/bin/python bench/remote_broker.py --out bench/results/remote_broker.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from sidecar.lab.bench.e2e import Bench, LoadShape
from sidecar.lab.bench.ratios import machine, print_report
from sidecar.lab.chaos.proxy import ThrottlingProxy
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port


async def drains(
    broker: LocalKafka,
    proxy: ThrottlingProxy,
    workdir: Path,
    *,
    latencies: list[float],
    in_flight: list[int],
    n: int,
    rounds: int,
) -> list[dict[str, Any]]:
    results = []
    for latency in latencies:
        proxy.set_latency(latency)
        rates: dict[int, list[float]] = {k: [] for k in in_flight}
        incomplete = 0
        for r in range(rounds):
            for k in in_flight:
                env = {
                    "GUARDRAIL_SIGNALS__CLAIMS": "false",
                    "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": proxy.address,
                    "GUARDRAIL_KAFKA__BATCHES_IN_FLIGHT": str(k),
                }
                run = await Bench(broker, workdir, env).drain(
                    f"l{latency}-k{k}-{r}", n, LoadShape()
                )
                rates[k].append(run.throughput_answers_per_s)
                incomplete += run.incomplete
                print(f"latency {latency} ms, in flight {k}: {run.throughput_answers_per_s}/s")
        results.append(
            {
                "latency_ms_each_way": latency,
                "answers_per_s": {str(k): v for k, v in rates.items()},
                "median_answers_per_s": {str(k): statistics.median(v) for k, v in rates.items()},
                "incomplete": incomplete,
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 2.0, 5.0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="remote-", dir=home) as tmp:
        workdir = Path(tmp)
        proxied = free_port()
        proxy = ThrottlingProxy(upstream_port=proxied)
        broker = LocalKafka(
            workdir / "broker",
            ensure_jars(home / "lib"),
            port=free_port(),
            controller_port=free_port(),
            proxied_port=proxied,
            proxied_advertised_port=proxy.port,
        )
        proxy.start()
        try:
            broker.start()
            try:
                results = asyncio.run(
                    drains(
                        broker,
                        proxy,
                        workdir,
                        latencies=args.latency_ms,
                        in_flight=args.in_flight,
                        n=args.requests,
                        rounds=args.rounds,
                    )
                )
            finally:
                broker.stop()
        finally:
            proxy.close()
    report = {
        "what": "fast-path drains, sidecar -> broker through a delaying proxy",
        "requests": args.requests,
        "results": results,
        **machine(),
    }
    print_report(report, args.out)


if __name__ == "__main__":
    main()
