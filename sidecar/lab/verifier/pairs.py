"""HaluEval QA and NQ-open pairs (claim, evidence, label) where length does not give the label away.

HaluEval QA (``knowledge, question, right_answer, hallucinated_answer``) has a
strong artefact: right answers average 2.2 words, hallucinated ones 11.0, and
length alone separates them with AUROC ~0.95 (data README). A verifier trained
on (right, hallucinated) would learn length. The pairs here are built so that
each positive has a negative of (nearly) the same length and form:

==================  =====  ==============================================================
kind                label  claim / evidence
==================  =====  ==============================================================
``qa-right``          1    "question right_answer" / knowledge
``qa-distractor``     0    "question X" / knowledge, X a name or number *from the knowledge*
                           (or another record's answer) with the right answer's word count
``decl-right``        1    the hallucinated answer with its wrong name replaced by the
                           right answer ("... was first performed in Teatro dei Fiorentini.")
``decl-hallucinated`` 0    the hallucinated answer itself (real HaluEval hallucinations)
``sent-in``           1    a knowledge / passage sentence / the text that contains it
``sent-out``          0    the same sentence / the text without it (same claim, other evidence)
``sent-swap``         0    the sentence with one name or number swapped / the text
==================  =====  ==============================================================

The evidence is always what :class:`~sidecar.claims.evidence.EvidenceIndex`
selects for the claim and its question, as in production; every pair keeps
its question (``Pair.question``) for verifiers that read it. Records are split by a hash of the
question (train / val / test), so no question is in two splits. The
``natural`` set (``qa-right`` vs the raw ``"question hallucinated_answer"``)
keeps the artefact on purpose, to show it (its length-only AUROC is high).
Sources: HaluEval QA and the 2,000 NQ-open dev questions with their gold
passages, read by :mod:`sidecar.lab.verifier.sources` (the labels:
docs/methods.md §Claim verification, supported vs unsupported). Pair
building is pure (offline tooling, never serving).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.claims.sentences import split_sentences
from sidecar.lab.verifier.sources import NQRecord, Pair, QARecord, Split, fix_text, split_of

__all__ = [
    "EVAL_SETS",
    "PairBuilder",
    "build_eval_sets",
    "build_training_pairs",
    "decl_pairs",
    "declarative_right",
    "entities",
    "nq_pairs",
    "qa_pairs",
]

EVAL_SETS: Final = ("natural", "length-matched-qa", "length-matched-decl", "sentences")

_ENTITY: Final = re.compile(
    r"(?:\d{1,2}\s+)?(?:[A-Z][\w'\u2019\-]*\.?|\d[\d,]*(?:\.\d+)?)"
    r"(?:\s+(?:(?:of|the|de|dei|del|della|da|di|von|van|der|la|le|du|and|for|on|y)\s+)*"
    r"(?:[A-Z][\w'\u2019\-]*\.?|\d[\d,]*(?:\.\d+)?))*"
)
_SENTENCE_OPENERS: Final = frozenset(
    {"The", "A", "An", "It", "In", "On", "At", "He", "She", "They", "This", "That", "These",
     "Its", "His", "Her", "Their", "There", "As", "After", "Before", "During", "While", "When",
     "Yes", "No", "Both", "Neither", "Either", "Although", "Because", "Since", "From", "By"}
)  # fmt: skip
_NUMERIC: Final = re.compile(r"^\d[\d,]*(?:\.\d+)?$")


def _words(text: str) -> int:
    return len(text.split())


def entities(text: str) -> list[str]:
    """Names, numbers and dates of ``text`` (capitalised runs, digits), sentence openers dropped."""
    out = []
    for m in _ENTITY.finditer(text):
        span = m.group(0).strip().rstrip(".")
        first = span.split()[0] if span else ""
        if first in _SENTENCE_OPENERS:
            span = span[len(first) :].strip()
        if len(span) >= 2 and span not in out:
            out.append(span)
    return out


def _has_digit(text: str) -> bool:
    return any(ch.isdigit() for ch in text)


def _inside(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a in b or b in a


def _evidence(
    claim: str, texts: Sequence[str], question: str = "", window_chars: int | None = None
) -> str:
    """The evidence the verifier reads: the selector's window, or the best long window."""
    index = EvidenceIndex([EvidenceChunk("k", t) for t in texts])
    if window_chars is None:
        return index.select(claim, question).window
    found = index.windows(claim, question, max_windows=1, max_chars=window_chars)
    return found[0] if found else ""


def _qa_claim(answer: str) -> str:
    """What a QA answer asserts: the answer itself (its question travels in ``Pair.question``).

    The network reads ``question [SEP] answer``; restating the question in the
    claim ("question answer.") made it read the question twice and the
    answer's few words got lost among them.
    """
    return " ".join(answer.split())


class PairBuilder:
    """Pair builders sharing a seeded RNG and pools of answers / entities from other records."""

    def __init__(
        self,
        seed: int,
        answer_pool: Sequence[str],
        entity_pool: Sequence[str],
        *,
        question_aware: bool = True,
        window_chars: int | None = None,
        whole_evidence: bool = False,
    ) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
        self.question_aware = question_aware
        self.window_chars = window_chars
        # The evidence uncut (its texts joined): for measuring serving's own window settings.
        self.whole_evidence = whole_evidence
        by_len: dict[int, list[str]] = defaultdict(list)
        for a in answer_pool:
            by_len[_words(a)].append(a)
        self.answers_by_len = by_len
        self.entity_pool = list(entity_pool)

    def distractor(self, answer: str, context: str, question: str) -> tuple[str, str] | None:
        """A wrong answer of the right answer's word count: from the context, else the pool."""
        n = _words(answer)
        numeric = bool(_NUMERIC.match(answer.replace(" ", "")) or re.search(r"\d{3,4}", answer))
        cands = [
            e
            for e in entities(context)
            if not _inside(e, answer) and e.lower() not in question.lower()
        ]
        if numeric:
            cands = [c for c in cands if any(ch.isdigit() for ch in c)] or cands
        same = [c for c in cands if _words(c) == n] or [c for c in cands if abs(_words(c) - n) <= 1]
        if same:
            return self.rng.choice(same), "qa-distractor"
        pool = [a for a in self.answers_by_len.get(n, []) if not _inside(a, answer)]
        if pool:
            return self.rng.choice(pool), "qa-swap"
        return None

    def swap(self, sentence: str, context: str) -> str | None:
        """``sentence`` with one name or number replaced by another of the same type."""
        ents = [e for e in entities(sentence) if len(e) > 2]
        if not ents:
            return None
        target = self.rng.choice(ents)
        is_num = any(ch.isdigit() for ch in target)
        local = [
            e
            for e in entities(context)
            if not _inside(e, target) and any(ch.isdigit() for ch in e) == is_num
        ]
        others = (
            [e for e in self.entity_pool if any(ch.isdigit() for ch in e) == is_num]
            if not local
            else local
        )
        if is_num and not local:
            digits = re.search(r"\d+", target)
            if digits is None:
                return None
            value = int(digits.group(0))
            replacement = target.replace(
                digits.group(0), str(value + self.rng.choice([-3, -2, -1, 1, 2, 3, 10])), 1
            )
        elif others:
            replacement = self.rng.choice(others)
        else:
            return None
        if _inside(replacement, target):
            return None
        return sentence.replace(target, replacement, 1)

    def pair(
        self, claim: str, texts: Sequence[str], label: int, kind: str, *, source: str, question: str
    ) -> Pair:
        """A pair whose evidence the production selector picks (with the question if aware),
        or the whole of ``texts`` when the builder keeps the evidence whole."""
        asked = question if self.question_aware else ""
        if self.whole_evidence:
            ev = " ".join(texts)
        else:
            ev = _evidence(claim, texts, asked, self.window_chars)
        return Pair(claim, ev, label, kind, source, question, question)

    def sentence_pairs(self, texts: Sequence[str], source: str, group: str) -> list[Pair]:
        """One sentence: ``sent-in`` (+) and ``sent-out`` or ``sent-swap`` (-)."""
        sentences = [
            s.text for t in texts for s in split_sentences(fix_text(t)) if _words(s.text) >= 6
        ]
        if not sentences:
            return []
        claim = self.rng.choice(sentences)
        whole = [fix_text(t) for t in texts]
        out = [self.pair(claim, whole, 1, "sent-in", source=source, question=group)]
        rest = [s for t in whole for s in (x.text for x in split_sentences(t)) if s != claim]
        use_out = len(rest) >= 1 and self.rng.random() < 0.5
        if use_out:
            out.append(
                self.pair(claim, [" ".join(rest)], 0, "sent-out", source=source, question=group)
            )
        else:
            swapped = self.swap(claim, " ".join(whole))
            if swapped is not None and swapped != claim:
                out.append(self.pair(swapped, whole, 0, "sent-swap", source=source, question=group))
            elif rest:
                out.append(
                    self.pair(claim, [" ".join(rest)], 0, "sent-out", source=source, question=group)
                )
        return out


def declarative_right(record: QARecord) -> str | None:
    """The hallucinated answer with its one wrong name replaced by the right answer.

    ``None`` when the wrong name cannot be identified unambiguously (exactly one
    name or number of the hallucinated answer that is not in the question and
    not the right answer) or the right answer is long.
    """
    right = record.right_answer.strip().rstrip(".")
    hall = record.hallucinated_answer.strip()
    if not right or _words(right) > 6 or _inside(right, hall) or _words(hall) > 25:
        return None
    q = record.question.lower()
    cands = [e for e in entities(hall) if e.lower() not in q and not _inside(e, right)]
    if len(cands) != 1 or _has_digit(cands[0]) != _has_digit(right):
        return None  # ambiguous, or a name would be replaced by a date (or vice versa)
    out = hall.replace(cands[0], right, 1)
    return out if out != hall else None


def qa_pairs(record: QARecord, builder: PairBuilder, *, natural: bool = False) -> list[Pair]:
    q = record.question
    k = [fix_text(record.knowledge)]
    out: list[Pair] = []
    right_claim = _qa_claim(record.right_answer)
    out.append(builder.pair(right_claim, k, 1, "qa-right", source="halueval-qa", question=q))
    if natural:
        hall_claim = _qa_claim(record.hallucinated_answer)
        out.append(
            builder.pair(hall_claim, k, 0, "qa-hallucinated", source="halueval-qa", question=q)
        )
        return out
    wrong = builder.distractor(record.right_answer, k[0], q)
    if wrong is not None:
        claim = _qa_claim(wrong[0])
        out.append(builder.pair(claim, k, 0, wrong[1], source="halueval-qa", question=q))
    return out


def decl_pairs(record: QARecord, builder: PairBuilder) -> list[Pair]:
    positive = declarative_right(record)
    if positive is None:
        return []
    k = [fix_text(record.knowledge)]
    hall = record.hallucinated_answer.strip()
    q = record.question
    return [
        builder.pair(positive, k, 1, "decl-right", source="halueval-qa", question=q),
        builder.pair(hall, k, 0, "decl-hallucinated", source="halueval-qa", question=q),
    ]


def nq_pairs(record: NQRecord, builder: PairBuilder) -> list[Pair]:
    group = record.question
    passage = fix_text(record.passage)
    answer = next((a for a in record.answers if a.lower() in passage.lower()), None)
    out: list[Pair] = []
    if answer is not None:
        claim = _qa_claim(answer)
        out.append(builder.pair(claim, [passage], 1, "qa-right", source="nq-open", question=group))
        wrong = builder.distractor(answer, passage, record.question)
        if wrong is not None:
            wclaim = _qa_claim(wrong[0])
            out.append(
                builder.pair(wclaim, [passage], 0, wrong[1], source="nq-open", question=group)
            )
    out.extend(builder.sentence_pairs([passage], "nq-open", group))
    return out


def _pools(qa: Sequence[QARecord], nq: Sequence[NQRecord]) -> tuple[list[str], list[str]]:
    answers = [r.right_answer for r in qa] + [a for r in nq for a in r.answers[:1]]
    ents: list[str] = []
    for r in qa[:2000]:
        ents.extend(entities(fix_text(r.knowledge))[:4])
    return answers, ents


def build_training_pairs(
    qa: Iterable[QARecord],
    nq: Iterable[NQRecord],
    split: Split,
    *,
    seed: int = 0,
    limit_qa: int | None = None,
    limit_nq: int | None = None,
    question_aware: bool = True,
    window_chars: int | None = None,
) -> list[Pair]:
    """The training (or validation) mixture of ``split``, shuffled with ``seed``.

    ``question_aware``: evidence is selected with the question as well as the
    claim (:meth:`~sidecar.claims.evidence.EvidenceIndex.select`), as the
    checker does when the retrieval event carries the user's query.
    """
    qa_all = list(qa)
    nq_all = list(nq)
    answers, ents = _pools(qa_all, nq_all)
    builder = PairBuilder(
        seed, answers, ents, question_aware=question_aware, window_chars=window_chars
    )
    qa_rows = [r for r in qa_all if split_of(r.question) == split][:limit_qa]
    nq_rows = [r for r in nq_all if split_of(r.question) == split][:limit_nq]
    pairs: list[Pair] = []
    for r in qa_rows:
        pairs.extend(qa_pairs(r, builder))
        pairs.extend(decl_pairs(r, builder))
        pairs.extend(builder.sentence_pairs([r.knowledge], "halueval-qa", r.question))
    for n in nq_rows:
        pairs.extend(nq_pairs(n, builder))
    builder.rng.shuffle(pairs)
    return pairs


def build_eval_sets(
    qa: Iterable[QARecord],
    nq: Iterable[NQRecord] = (),
    *,
    split: Split = "test",
    seed: int = 1,
    limit: int | None = None,
    question_aware: bool = True,
    window_chars: int | None = None,
    whole_evidence: bool = False,
) -> dict[str, list[Pair]]:
    """Held-out sets: ``natural`` (raw HaluEval, length artefact kept), two length-matched
    sets and ``sentences`` (knowledge / passage sentences in, out, swapped).

    ``whole_evidence``: each pair keeps its knowledge / passage uncut (the same claims and
    labels), for scoring under the serving path's own evidence windows.
    """
    qa_all = list(qa)
    nq_all = list(nq)
    answers, ents = _pools(qa_all, nq_all)
    builder = PairBuilder(
        seed,
        answers,
        ents,
        question_aware=question_aware,
        window_chars=window_chars,
        whole_evidence=whole_evidence,
    )
    rows = [r for r in qa_all if split_of(r.question) == split][:limit]
    nq_rows = [r for r in nq_all if split_of(r.question) == split][:limit]
    sets: dict[str, list[Pair]] = {name: [] for name in EVAL_SETS}
    for r in rows:
        sets["natural"].extend(qa_pairs(r, builder, natural=True))
        sets["length-matched-qa"].extend(qa_pairs(r, builder))
        sets["length-matched-decl"].extend(decl_pairs(r, builder))
        sets["sentences"].extend(builder.sentence_pairs([r.knowledge], "halueval-qa", r.question))
    for n in nq_rows:
        sets["sentences"].extend(builder.sentence_pairs([n.passage], "nq-open", n.question))
    return sets


# --------------------------------------------------------------------------- grounding sources
#
# Beside HaluEval QA and NQ-open, four more task forms (data README, each
# grounding/*/SOURCE.md): HaluEval summarization and dialogue (right vs
# hallucinated candidate for one document / knowledge snippet), SummEdits
# (human-labelled summaries, minimal edits), Factcheck-GPT (claim vs web
# passage, human stance) and BEGIN (dialogue responses vs knowledge, human
# attribution). Readers return pairs whose evidence is the *whole* document;
# :func:`windowed` then cuts it to the window the verifier reads. Groups are
# the document (or claim) a pair belongs to, so splits never cut a document.
