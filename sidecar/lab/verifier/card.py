"""The verifier's model cards (markdown): the QA-only run's and the corpus run's, from the artifact.

Pure text rendering of the artifact's metadata and metrics and the training
settings; the same inputs give the same card, byte for byte.
"""

from __future__ import annotations

import math
from typing import Any

from sidecar.claims.artifact import VerifierArtifact
from sidecar.lab.verifier.settings import INT8_FILE, TrainConfig
from sidecar.lab.verifier.sources import Pair

__all__ = ["render_card", "render_corpus_card"]


def render_card(
    artifact: VerifierArtifact, config: TrainConfig, sets: dict[str, list[Pair]]
) -> str:
    """The model card (markdown) from the artifact's metadata and metrics."""
    m = artifact.metrics
    rows = []
    for name in sets:
        for prec in ("fp32", "int8"):
            r = m.get(f"{prec}/{name}")
            if r is None:
                continue
            rows.append(
                f"| {name} | {prec} | {r['n']} | {r['auroc']} | {r['accuracy']} | "
                f"{r['f1_hallucinated']} | {r['length_auroc']} | {r['uncertain_share']} | "
                f"{r['accuracy_decided']} | {r.get('auroc_logit_only')} | "
                f"{r.get('auroc_coverage_only')} |"
            )
    training = m.get("training", {})
    parity = m.get("parity", {})
    limit = "all" if config.limit is None else str(config.limit)
    nq_share = "all of its train split" if config.limit is None else "a quarter of that"
    steps = int(training.get("steps", 0) or 0)
    per_epoch = max(1, math.ceil(artifact.data.n_train / config.batch_size))
    passes = f"{steps / per_epoch:.2f} of {config.epochs} epoch(s)"
    limit_flag = " --limit 0" if config.limit is None else f" --limit {config.limit}"
    options = [
        *([f"--max-steps {config.max_steps}"] if config.max_steps is not None else []),
        *([f"--epochs {config.epochs}"] if config.epochs != 1 else []),
        *([f"--freeze-layers {config.freeze_layers}"] if config.freeze_layers != 2 else []),
        *(["--question-in-input"] if config.question_in_input else []),
        *([f"--threads {config.threads}"] if config.threads != 2 else []),
        *([f"--seed {config.seed}"] if config.seed != 0 else []),
        *([f"--val-limit {config.val_limit}"] if config.val_limit != 300 else []),
        *(
            [f"--test-limit {config.test_limit}"]
            if config.test_limit is not None and config.test_limit != 600
            else []
        ),
    ]
    option_flags = f" \\\n    {' '.join(options)}" if options else ""
    first = (
        "`question [SEP] claim` (the user's question, when known; "
        f"{config.question_dropout:.0%} of the training pairs without it)"
        if artifact.question_in_input
        else "claim"
    )
    outcome_flags = "".join(
        f" \\\n    {flag} {' '.join(str(p) for p in paths)}"
        for flag, paths in (
            ("--outcomes", config.outcomes),
            ("--lookback", config.lookback),
            ("--holdout", config.holdout),
        )
        if paths
    )
    extra = m.get("outcomes")
    in_domain = (
        ""
        if extra is None
        else f"""- **In-domain pairs** (`sidecar.lab.verifier.outcomes`): SmolLM2-135M answers to
  NQ-open questions of the *fit* part ({", ".join(str(p) for p in config.outcomes)}
  rows; {", ".join(str(p) for p in config.lookback) or "no"} lookback shards, chunk
  texts from the rebuilt corpus, trusted = raw score at or above the rows' cut-off),
  segmented by the production segmenter, evidence selected by the production selector
  from the trusted chunks (window and best chunk). A claim of a correct answer (NQ-open
  label) containing a gold answer string is supported; a claim of a wrong answer that
  carries answer content (a content word not in the question) is unsupported; claims
  restating the question and claims of correct answers without the gold string are
  dropped. Wrong and correct claims are subsampled to equal counts per 16-character
  length bin, and each correct claim gets an answer-swap negative (its gold answer
  replaced by another question's answer of the same word count). Questions of
  {", ".join(str(p) for p in config.holdout) or "no rows"} (the held-out eval part) are
  excluded from every pair, NQ gold-passage pairs included. 80 % train / 20 %
  validation by question hash (calibration and band use the validation part too).
  Train pairs: {extra.get("train_pairs")} (length-only AUROC
  **{extra.get("length_auroc_train")}**), validation pairs {extra.get("val_pairs")}.
"""
    )
    return f"""# Claim verifier: MiniLM-L6 cross-encoder (`{artifact.version}`)

Labels a (claim, evidence) pair **supported / uncertain / unsupported** for the
sidecar's streaming claim check (labels: docs/methods.md §Claim verification;
the four-way prompt's verified / unverified). Serving:
`sidecar.claims.verifier.OnnxVerifier` (onnxruntime + `tokenizers`, no torch).

## Model
- Base: {artifact.base_model}; `BertModel` reading `[CLS] claim [SEP] evidence
  [SEP]` (max {artifact.max_length} tokens, longest-first truncation), where the
  first segment is {first} (`question_in_input`:
  {str(artifact.question_in_input).lower()} in `verifier.json`); claim and
  evidence tokens mean-pooled separately into u, v (L2-normalised; the question's
  tokens are not pooled or aligned as claim tokens); dropout 0.1 on the vector
  features and one linear unit over `[u, v, |u-v|, u*v, cos(u, v), align_mean,
  align_min]` -> one logit, where align_* are the mean and min over claim
  tokens of their best cosine with any evidence token (BERTScore-style
  precision). The scalar features start with positive weights and the bias is
  centred on the first batches, so training starts from a sensible ranking.
- Shipped file: `{artifact.onnx_file}` ({artifact.quantization}), sha256
  `{artifact.onnx_sha256}`.
- Calibration on the validation split, fitted for the shipped file itself:
  p = sigmoid({artifact.logit_scale:.4f} * logit + {artifact.coverage_weight:.4f} * coverage
  + {artifact.bias:.4f}), where coverage is the share of the claim's content words and
  numbers found in the evidence (logistic regression; `sidecar.claims.calibration`).
  **uncertain** = p in [{artifact.unsupported_below}, {artifact.supported_from}) - the
  band where validation precision of either decision stays below
  {config.target_precision}. `irrelevant` never comes from this model (only from
  the optional LLM judge).

## Data
- HaluEval QA (`qa_data.json`, MIT) and the 2,000 NQ-open dev questions with
  their gold passages (`nq-open-oracle.dev.jsonl.gz`, MIT). No other NQ data.
- Split by `sha256(lower(question))`: test 10 %, val 10 %, train 80 %; no
  question is in two splits. Training used {limit} HaluEval records of the train
  split (NQ: {nq_share}), {artifact.data.n_train} pairs (sha256
  `{artifact.data.pairs_sha256[:16]}...`), validation {artifact.data.n_val} pairs.
- **Length does not predict the label.** HaluEval's right answers average 2.2
  words and hallucinated ones 11.0 (length alone: AUROC ~0.95). Pairs are
  built so each positive has a negative of the same form and length:
  "question + right answer" vs "question + a name/number from the knowledge
  with the same word count"; the real hallucinated answer vs the same sentence
  with its wrong name replaced by the right answer; a knowledge sentence with
  vs without itself in the evidence, or with one name/number swapped
  (`sidecar.lab.verifier.datasets`). Length-only AUROC of the training mixture:
  **{artifact.data.length_auroc_train}**.
- Evidence for every pair is chosen by the production evidence selector
  (`sidecar.claims.evidence`: best 3 sentences by IDF-weighted overlap with the
  claim plus overlap with the question).
{in_domain}
## Held-out results (test split)
AUROC / acc.: supported vs not from the calibrated p (threshold 0.5); F1 hal.:
F1 of flagging the unsupported class; len. AUROC: claim length alone (~0.5
means length carries no signal); unc. / acc. dec.: share labelled uncertain by
the band and accuracy on the rest; logit / cov.: AUROC of the network's logit
alone and of lexical coverage alone.

| set | prec. | n | AUROC | acc. | F1 hal. | len. AUROC | unc. | acc. dec. | logit | cov. |
|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- `natural`: "question + right answer" vs "question + hallucinated answer", the
  raw benchmark with its length artefact (shown for reference; the length
  column says how much length alone would get).
- `length-matched-qa`, `length-matched-decl`, `sentences`: as in training,
  held out. These are the numbers to trust.

ONNX parity on {parity.get("pairs", 0)} validation pairs (max |logit| difference
vs torch): fp32 {parity.get("max_abs_logit_diff_model.onnx")}, int8
{parity.get("max_abs_logit_diff_model.int8.onnx")}. Shipped: **{training.get("shipped")}**
(int8 is shipped only when its accuracy is within {config.int8_tolerance} and its
AUROC within {2 * config.int8_tolerance} of fp32 on every set; the fp32 file, 90 MB,
is not kept when int8 ships).

Training: {training.get("steps")} steps, batch {config.batch_size}, lr
{config.learning_rate} (head {config.head_learning_rate}), embeddings + lowest
{config.freeze_layers} layers frozen, {passes}, seed {config.seed},
{training.get("seconds")} s on CPU ({config.threads} thread(s)).

## Reproduce
```
guardrail train verifier --out models/verifier{limit_flag} \\
    --halueval ../shared/data/halueval/qa_data.json \\
    --nq ../shared/data/nq-open/nq-open-oracle.dev.jsonl.gz{option_flags}{outcome_flags}
guardrail eval claims --data ../shared/data/halueval/qa_data.json --format halueval-qa --json
```

## Limits
- Small CPU budget, modest model: compare the AUROC with the `cov.` column
  (lexical coverage alone). The verifier is good at telling whether the evidence
  states a sentence at all (`sentences`), fair on real HaluEval hallucinations
  rewritten as length-matched declarative claims (`length-matched-decl`) and
  near chance on question-answer correctness (`length-matched-qa`: it cannot
  tell the right name from another name of the same passage). With the band,
  most hard claims come out `uncertain` rather than wrong. More steps (or a GPU
  run of the same command without `--limit`) are the obvious next step.
- Trained on short encyclopaedic claims (Wikipedia knowledge); other domains
  (medical dosing, legal text) are out of distribution - the rule tier for
  numbers and the optional LLM judge exist for that.
- The claim format "question + answer" is used for QA; claims produced from
  streamed answers are declarative sentences (covered by the decl/sentence pairs).
- Created {artifact.created_at.isoformat()}.
"""


def render_corpus_card(
    artifact: VerifierArtifact,
    config: TrainConfig,
    manifest: dict[str, Any],
    sets: dict[str, list[Pair]],
) -> str:
    """The model card of a corpus-trained verifier: data hashes, steps, held-out vs baselines."""
    m = artifact.metrics
    prec = "int8" if artifact.onnx_file == INT8_FILE else "fp32"
    rows = []
    for name in sets:
        r = m.get(f"{prec}/{name}")
        if r is None:
            continue
        other = m.get(f"compare/{name}", {})
        rows.append(
            f"| {name} | {r['n']} | {r['auroc']} | {r['accuracy']} | {r['length_auroc']} | "
            f"{r['auroc_coverage_only']} | {r['auroc_logit_only']} | {r['uncertain_share']} | "
            f"{r['accuracy_decided']} | {other.get('auroc', '-')} | {other.get('accuracy', '-')} |"
        )
    training = m.get("training", {})
    parity = m.get("parity", {})
    files = manifest.get("files_sha256", {})
    hashes = "\n".join(f"  - `{k}`: `{v}`" for k, v in files.items())
    bands = (
        "; ".join(
            f"{b.target_precision:g}: [{b.unsupported_below:g}, {b.supported_from:g}), "
            f"{b.uncertain_share:.0%} uncertain"
            for b in artifact.bands
        )
        or "none (exported with one band)"
    )
    train = manifest.get("train", {})
    compare_name = next((v.get("verifier") for k, v in m.items() if k.startswith("compare/")), None)
    return f"""# Claim verifier: MiniLM-L6 cross-encoder on the whole mixture (`{artifact.version}`)

Labels a (claim, evidence) pair **supported / uncertain / unsupported**. Serving:
`sidecar.claims.verifier.OnnxVerifier` (onnxruntime + `tokenizers`, no torch).

## Model and input
- Base: {artifact.base_model}; reads `[CLS] question [SEP] claim [SEP] evidence [SEP]`
  (the question when known; {config.question_dropout:.0%} of the non-QA training pairs
  without it; a QA claim is the bare answer), max {artifact.max_length} tokens.
- Long evidence: the claim is scored against up to {artifact.evidence_max_windows} window(s)
  of at most {artifact.evidence_max_chars} characters (`EvidenceIndex.windows`: each
  claim sentence's best evidence sentences in turn, best first); the best window wins.
  Training pairs read the best window.
- Calibration: p = sigmoid({artifact.logit_scale:.4f} * logit + {artifact.coverage_weight:.4f}
  * coverage + {artifact.bias:.4f}), coverage = share of the claim's content words not in the
  question found in the window; **uncertain** = p in [{artifact.unsupported_below},
  {artifact.supported_from}): the band where validation precision of either decision stays
  below {config.target_precision} (empty when both reach it at one point: every claim is
  decided; `--target-precision` sets it). Shipped file `{artifact.onnx_file}`
  ({artifact.quantization}; self-attention fused, one onnxruntime `Attention` node per layer:
  `sidecar.lab.verifier.fusion`), sha256 `{artifact.onnx_sha256}`.
- Bands for other target precisions, fitted on the same validation pairs (served instead with
  `GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION`; a wider band asks a configured LLM judge
  about more claims): {bands}.

## Data (`sidecar.lab.verifier.datasets.build_corpus`)
- Sources and their sha256:
{hashes}
- Split: {manifest.get("split_rule")}. Every split length matched per source.
- Training pairs: {train.get("n")} (sha256 `{train.get("sha256")}`), caps per source
  {manifest.get("train_caps")}; **length-only AUROC {train.get("length_auroc")}, overlap-only
  AUROC {train.get("overlap_auroc")}** of the training mixture.
- Validation (calibration, band): {artifact.data.n_val} pairs, seeded sample.

## Held-out results (test split, {prec} as shipped)
AUROC / acc.: supported vs not, calibrated p at 0.5; len.: AUROC of claim length alone;
overlap: AUROC of lexical coverage alone; logit: the network alone; unc. / acc. dec.:
share in the uncertain band and accuracy on the rest; {compare_name or "compare"}: the
previous verifier on the same pairs (its own input settings).

| set | n | AUROC | acc. | len. | overlap | logit | unc. | acc. dec. | prev. AUROC | prev. acc. |
|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

ONNX parity on {parity.get("pairs", 0)} validation pairs (max |logit| difference vs torch):
fp32 {parity.get("max_abs_logit_diff_model.onnx")}, int8
{parity.get("max_abs_logit_diff_model.int8.onnx")}.

## Training
{training.get("steps")} of {training.get("total_steps")} planned steps (checkpoint
`{training.get("checkpoint")}`), batch {config.batch_size}, lr {config.learning_rate} (head
{config.head_learning_rate}), {
        "all 6 encoder layers"
        if config.layers is None
        else f"the lowest {config.layers} of the 6 encoder layers (the others dropped)"
    }, embeddings + lowest {config.freeze_layers} layers frozen,
seed {config.seed}, {training.get("seconds")} s of training on {
        f"CPU ({config.threads} threads)"
        if training.get("device", "cpu") == "cpu"
        else training.get("device")
    }.
Loss: binary cross-entropy{
        f" + {config.pairwise_weight} x softplus(z_wrong - z_right) over each batch's "
        "right/wrong pairs of one group (groups kept whole in a batch)"
        if config.pairwise_weight
        else ""
    }{
        f", the targets {training.get('distill_weight')} x the teacher's p(supported) "
        f"(`{training.get('teacher')}`) + the rest x the label"
        if training.get("distill_weight")
        else ""
    }; network initialised from {
        "the base MiniLM"
        if training.get("init_from", "None") == "None"
        else f"`{training.get('init_from')}`"
    }.

## Reproduce
```
{training.get("command") or "guardrail train verifier --work-dir DIR ... (see verifier.json)"}
guardrail train verifier --work-dir DIR --data-dir ../shared/data --export --out OUT \\
    --compare models/verifier --max-length {artifact.max_length} \\
    --window-chars {artifact.evidence_max_chars}
```
The first command trains (resumable: run it again to continue from the newest
checkpoint); the second exports the newest checkpoint, calibrates and writes
this card.
Created {artifact.created_at.isoformat()}.
"""
