"""``bench/cross_cpu.py``: the shipped verifier's outputs compared pair by pair across machines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bench.cross_cpu import compared, write_pairs
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lab.verifier.sources import Pair
from tests.claims.conftest import REPO

EVIDENCE = "Paris is the capital of France. The city is divided into 20 arrondissements."
CLAIMS = [
    ("Paris is the capital of France.", 1),
    ("Paris is divided into 20 arrondissements.", 1),
    ("Lyon is the capital of France.", 0),
]


def test_the_same_machine_gives_the_same_outputs_and_a_moved_one_is_counted(
    tmp_path: Path,
) -> None:
    verifier = OnnxVerifier.load(REPO / "models" / "verifier", threads=1)
    pairs = [Pair(c, EVIDENCE, y, "t", "t", str(k)) for k, (c, y) in enumerate(CLAIMS)]
    out = tmp_path / "pairs.jsonl.gz"
    assert write_pairs(verifier, {"a": pairs[:2], "b": pairs[2:]}, 5, 0, out) == 3
    same = compared(out, REPO / "models")
    assert same["pairs"] == 3 and same["per_form"] == {"a": 2, "b": 1}
    assert same["max_abs_logit_diff"] == 0.0 and same["max_abs_p_diff"] == 0.0
    assert {b["labels_changed"] for b in same["bands"].values()} == {0}
    assert same["golden_drift"]["verifier"] is not None

    # what another machine would show: one pair's p there on the other side of the band
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    row = json.loads(lines[1])
    edge = verifier.band.supported_from
    row["p"] = edge - 0.01 if row["p"] >= edge else edge + 0.01
    lines[1] = json.dumps(row)
    out.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    moved = compared(out, REPO / "models")
    assert moved["bands"]["served"]["labels_changed"] == 1
    assert moved["max_abs_p_diff"] > 0.0 and moved["max_abs_logit_diff"] == 0.0
