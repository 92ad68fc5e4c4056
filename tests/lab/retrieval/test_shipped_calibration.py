"""The shipped calibration artifact belongs to this code's data split and chunking.

Recomputes, without embedding anything, the question split, the chunked corpus
and the data hash that ``guardrail calibrate retrieval`` records, from the
artifact's own provenance. A change to the split, the chunker, the document ids
or the hash recipe makes the shipped file stale, and this test says so.
"""

from __future__ import annotations

import pytest

from sidecar.conformal.quantile import order_statistic_rank
from sidecar.conformal.registry import CalibrationRegistry
from sidecar.conformal.storage import load_artifact
from sidecar.hashing import sha256_file
from sidecar.lab.retrieval.corpus import load_questions
from sidecar.lab.retrieval.split import select_split
from sidecar.lab.retrieval.workflow import calibration_data_hash, load_corpus
from tests.lab.retrieval.conftest import REPO

SHIPPED = REPO / "models" / "conformal" / "nq-open-minilm.json"


def test_shipped_artifact_matches_its_data() -> None:
    art = load_artifact(SHIPPED)
    prov = art.provenance
    assert prov is not None
    questions_file = REPO / prov.questions_file
    assert sha256_file(questions_file) == prov.questions_sha256
    records = load_questions(questions_file)
    assert len(records) == prov.n_questions_total == 2000
    cal = select_split(
        records,
        prov.split,
        seed=prov.split_seed,
        cal_fraction=prov.cal_fraction,
        max_questions=prov.max_questions,
    )
    assert len(cal) == art.n_questions
    assert art.chunk_words is not None
    corpus = load_corpus([REPO / f for f in prov.corpus_files], art.chunk_words)
    assert corpus.fingerprint == prov.corpus_sha256
    assert art.data_hash == calibration_data_hash(
        questions_sha256=prov.questions_sha256,
        question_indices=[q.index for q in cal],
        corpus=corpus,
        embedding_model_id=art.embedding_model_id,
        top_k=art.top_k,
        beta=art.beta,
    )


def test_shipped_artifact_is_certifiable_for_its_key() -> None:
    art = load_artifact(SHIPPED)
    assert (art.alpha, art.top_k) == (0.1, 10)
    assert art.k == order_statistic_rank(art.n, art.alpha) <= art.n
    resolved = CalibrationRegistry(art).resolve(art.tenant, art.collection, art.retriever_id)
    assert not resolved.fallback
    assert resolved.calibration.certifiable
    at_alpha = next(p for p in art.alpha_sweep if p.alpha == art.alpha)
    assert at_alpha.q_hat == pytest.approx(art.q_hat)
