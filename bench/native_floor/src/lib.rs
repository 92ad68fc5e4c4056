//! The dict floor's sketch of a fast path (`sidecar/lab/bench/dict_floor.py`), in Rust: what
//! deciding could cost outside the interpreter (issue #22's lever left unmeasured before).
//!
//! The same work per record (JSON read, the envelope's and hits' fields checked, the
//! attention summary's base64 decoded and its float16 values checked finite, a 16-byte
//! digest for duplicates (blake3: ~1 us a request against blake2b's ~2.8, the sidecar's),
//! the join in a map) and per batch (conformal trust by a
//! threshold, the lookback matrix min-max scaled per row, each chunk's attention share,
//! the two confidence matrices, one verdict of the sidecar's shape per request, encoded
//! once). The served models run in Python, one call a batch, on the matrices this module
//! hands over as bytes; it skips what the dict floor skips. A floor, not a candidate.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use half::slice::HalfFloatSliceExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

const SEEN_MAX: usize = 1_000_000;

#[derive(Deserialize)]
struct Hit<'a> {
    #[serde(borrow)]
    chunk_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    doc_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    score: Option<f64>,
}

#[derive(Deserialize)]
struct Attention<'a> {
    layers: Option<i64>,
    heads: Option<i64>,
    chunks: Option<i64>,
    #[serde(borrow)]
    values: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Event<'a> {
    schema_version: Option<i64>,
    #[serde(borrow)]
    event_type: Option<Cow<'a, str>>,
    #[serde(borrow)]
    request_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tenant: Option<Cow<'a, str>>,
    #[serde(borrow)]
    hits: Option<Vec<Hit<'a>>>,
    seq: Option<i64>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    answer: Option<Cow<'a, str>>,
    #[serde(borrow)]
    generator_model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    attention: Option<Attention<'a>>,
}

struct Final {
    answer: String,
    model: String,
    halves: Vec<u16>,
    chunks: usize,
}

#[derive(Default)]
struct Entry {
    retrieval: Option<(String, Vec<(String, f64)>)>,
    deltas: Vec<String>,
    fin: Option<Final>,
}

struct Done {
    rid: String,
    tenant: String,
    hits: Vec<(String, f64)>,
    fin: Final,
    keep: Vec<usize>,
    answer_row: [f64; 10],
}

fn text<'a>(value: &'a Option<Cow<'a, str>>, name: &'static str) -> Result<&'a str, &'static str> {
    match value {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(name),
    }
}

fn half_slice(bits: &[u16]) -> &[half::f16] {
    half::slice::HalfBitsSliceExt::reinterpret_cast(bits)
}

fn f16_to_f64(bits: u16) -> f64 {
    f64::from(half::f16::from_bits(bits))
}

fn now_iso() -> String {
    // datetime.now(UTC).isoformat(): microseconds and "+00:00"
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_micros()
    )
}

struct Features<'a>(&'a [String], &'a [f64; 10]);

impl Serialize for Features<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0.iter().zip(self.1.iter()) {
            map.serialize_entry(name, &(!value.is_nan()).then_some(*value))?;
        }
        map.end()
    }
}

#[derive(Serialize)]
struct Reason {
    code: &'static str,
    message: &'static str,
    signal: &'static str,
}

const REASON: Reason = Reason {
    code: "lookback-very-low",
    message: "p(factual) = 0.00 < 0.1",
    signal: "lookback",
};

#[derive(Serialize)]
struct Forecast<'a> {
    chunk_id: &'a str,
    p_useful: f64,
    retrieval_rank: usize,
}

#[derive(Serialize)]
struct Retrieval<'a> {
    status: &'static str,
    trusted_chunk_ids: Vec<&'a str>,
    m1: bool,
    m2: f64,
    q_hat: f64,
    alpha: f64,
    certifiable: bool,
    calibration_version: &'static str,
    calibration_key: &'static str,
    fallback: bool,
    fallback_reason: &'static str,
    clipped_scores: u32,
    monitor: &'static str,
    m1_mean: Option<f64>,
}

#[derive(Serialize)]
struct Lookback {
    status: &'static str,
    p_factual: f64,
    model_version: &'static str,
}

#[derive(Serialize)]
struct Claims {
    status: &'static str,
    n: u32,
    supported: u32,
    unsupported: u32,
    uncertain: u32,
    irrelevant: u32,
    reliability: Option<f64>,
    reliability_level: Option<f64>,
    hallucination_rate: Option<f64>,
    evidence_scope: Option<f64>,
    stream_mismatch: bool,
    superseded_claims: [u32; 0],
    unchecked: u32,
    unreadable: u32,
    unjudged: u32,
}

#[derive(Serialize)]
struct Signals<'a> {
    retrieval: Retrieval<'a>,
    lookback: Lookback,
    claims: Claims,
}

#[derive(Serialize)]
struct Versions<'a> {
    generator: &'a str,
    certifier: &'static str,
    lookback: &'static str,
    confidence: &'static str,
    policy: &'static str,
}

#[derive(Serialize)]
struct Timings {
    join_wait: f64,
    signals: f64,
    policy: f64,
}

#[derive(Serialize)]
struct Verdict<'a> {
    schema_version: u32,
    event_type: &'static str,
    request_id: &'a str,
    idempotency_key: &'a str,
    tenant: &'a str,
    decision: &'static str,
    reasons: [&'a Reason; 6],
    stage: &'static str,
    escalate: bool,
    policy: &'static str,
    signals: Signals<'a>,
    confidence: f64,
    confidence_features: Features<'a>,
    chunk_forecast: Vec<Forecast<'a>>,
    advice: Option<()>,
    certified_risk: Option<f64>,
    certified_delta: Option<f64>,
    certificate: Option<()>,
    caveat_text: Option<()>,
    rewritten_answer: Option<()>,
    model_versions: Versions<'a>,
    timings_ms: Timings,
    produced_at: String,
    sidecar_version: &'static str,
}

/// The sketch: record bytes in, feature matrices out, verdict bytes back.
#[pyclass]
struct NativeFloor {
    layers: usize,
    heads: usize,
    k: usize,
    q_hat: f64,
    answer_names: Vec<String>,
    seen: HashSet<[u8; 16]>,
    store: HashMap<String, Entry>,
    done: Vec<Done>,
    refused: HashMap<&'static str, u64>,
}

impl NativeFloor {
    /// One record read, checked and joined; its request id when that completed it.
    fn admit(&mut self, raw: &[u8], key: Option<&[u8]>) -> Result<Option<String>, &'static str> {
        let mut mark = [0u8; 16];
        mark.copy_from_slice(&blake3::hash(raw).as_bytes()[..16]);
        if self.seen.contains(&mark) {
            return Ok(None);
        }
        if self.seen.len() >= SEEN_MAX {
            self.seen.clear();
        }
        self.seen.insert(mark);
        let event: Event = serde_json::from_slice(raw).map_err(|_| "unreadable")?;
        if event.schema_version != Some(1) {
            return Err("envelope");
        }
        let rid = text(&event.request_id, "request_id")?;
        if key.is_some_and(|k| k != rid.as_bytes()) {
            return Err("key");
        }
        let kind = event.event_type.as_deref().unwrap_or("");
        let (layers, heads, k) = (self.layers, self.heads, self.k);
        let entry = self.store.entry(rid.to_owned()).or_default();
        match kind {
            "generation.delta" => {
                if event.seq.is_none() {
                    return Err("seq");
                }
                entry.deltas.push(text(&event.text, "text")?.to_owned());
            }
            "retrieval" => {
                let tenant = text(&event.tenant, "tenant")?.to_owned();
                let hits = event
                    .hits
                    .as_ref()
                    .filter(|h| !h.is_empty())
                    .ok_or("hits")?;
                let mut out = Vec::with_capacity(hits.len());
                for hit in hits {
                    let score = hit.score.ok_or("score")?;
                    if !(-1.0..=1.0).contains(&score) {
                        return Err("score");
                    }
                    if hit.text.is_none() || hit.doc_id.is_none() {
                        return Err("hit fields");
                    }
                    out.push((text(&hit.chunk_id, "chunk_id")?.to_owned(), score));
                }
                entry.retrieval = Some((tenant, out));
            }
            "generation.final" => {
                let answer = text(&event.answer, "answer")?.to_owned();
                let model = text(&event.generator_model, "generator_model")?.to_owned();
                let summary = event.attention.as_ref().ok_or("attention")?;
                let chunks = summary.chunks.ok_or("shape")?;
                if summary.layers != Some(layers as i64)
                    || summary.heads != Some(heads as i64)
                    || !(chunks > 0 && chunks as usize <= k)
                {
                    return Err("shape");
                }
                let bytes = STANDARD
                    .decode(text(&summary.values, "values")?.as_bytes())
                    .map_err(|_| "unreadable")?;
                if bytes.len() != layers * heads * chunks as usize * 2 {
                    return Err("values");
                }
                let halves: Vec<u16> = bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect();
                if halves.iter().any(|&h| !half::f16::from_bits(h).is_finite()) {
                    return Err("values");
                }
                entry.fin = Some(Final {
                    answer,
                    model,
                    halves,
                    chunks: chunks as usize,
                });
            }
            _ => return Err("event_type"),
        }
        Ok((entry.retrieval.is_some() && entry.fin.is_some()).then(|| rid.to_owned()))
    }
}

#[pymethods]
impl NativeFloor {
    #[new]
    fn new(
        layers: usize,
        heads: usize,
        k: usize,
        q_hat: f64,
        answer_names: Vec<String>,
    ) -> PyResult<Self> {
        if answer_names.len() != 10 {
            return Err(PyValueError::new_err(
                "the sketch's answer rows have 10 signals",
            ));
        }
        Ok(Self {
            layers,
            heads,
            k,
            q_hat,
            answer_names,
            seen: HashSet::new(),
            store: HashMap::new(),
            done: Vec::new(),
            refused: HashMap::new(),
        })
    }

    /// Read a batch's items (``(kind, raw, key, ref)`` tuples); returns how many requests
    /// it completed (their matrices: :meth:`lookback_rows`, :meth:`confidence_rows`).
    fn admit_batch(&mut self, items: &Bound<'_, PyList>) -> PyResult<usize> {
        self.done.clear();
        for item in items.iter() {
            let item = item.downcast::<PyTuple>()?;
            let raw = item.get_item(1)?;
            if raw.is_none() {
                continue;
            }
            let raw = raw.downcast::<PyBytes>()?;
            let key = item.get_item(2)?;
            let key = if key.is_none() {
                None
            } else {
                Some(key.downcast::<PyBytes>()?.as_bytes())
            };
            match self.admit(raw.as_bytes(), key) {
                Ok(Some(rid)) => {
                    let entry = self
                        .store
                        .remove(&rid)
                        .expect("a completed request is stored");
                    let (tenant, hits) = entry.retrieval.expect("completed");
                    let fin = entry.fin.expect("completed");
                    let keep = hits
                        .iter()
                        .enumerate()
                        .filter(|(_, (_, s))| *s >= self.q_hat)
                        .map(|(i, _)| i)
                        .collect();
                    self.done.push(Done {
                        rid,
                        tenant,
                        hits,
                        fin,
                        keep,
                        answer_row: [f64::NAN; 10],
                    });
                }
                Ok(None) => {}
                Err(reason) => *self.refused.entry(reason).or_default() += 1,
            }
        }
        Ok(self.done.len())
    }

    /// The completed requests' lookback matrix, float32 ``(n, layers * heads * k)``, each
    /// row min-max scaled in float64 (``summary_rows``): its bytes.
    fn lookback_rows<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let (cells, k) = (self.layers * self.heads, self.k);
        let mut out: Vec<u8> = Vec::with_capacity(self.done.len() * cells * k * 4);
        let mut row = vec![0.0f64; cells * k];
        let mut widened = vec![0.0f64; cells * k];
        for d in &self.done {
            let width = d.fin.chunks;
            let wide = &mut widened[..cells * width];
            half_slice(&d.fin.halves).convert_to_f64_slice(wide);
            row.fill(0.0);
            for c in 0..cells {
                row[c * k..c * k + width].copy_from_slice(&wide[c * width..(c + 1) * width]);
            }
            let lo = row.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let span = hi - lo;
            for v in &row {
                let scaled = if span > 0.0 { (v - lo) / span } else { 0.0 };
                out.extend_from_slice(&(scaled as f32).to_le_bytes());
            }
        }
        PyBytes::new(py, &out)
    }

    /// Given p(factual) per completed request (float64 bytes): the answer matrix
    /// ``(n, 10)`` and the trusted chunks' matrix ``(m, 5)``, float64 bytes, NaN missing.
    fn confidence_rows<'py>(
        &mut self,
        py: Python<'py>,
        p_factual: &[u8],
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        if p_factual.len() != self.done.len() * 8 {
            return Err(PyValueError::new_err(
                "one p(factual) per completed request",
            ));
        }
        let cells = self.layers * self.heads;
        let (mut answers, mut chunks) = (Vec::new(), Vec::new());
        for (d, p) in self.done.iter_mut().zip(p_factual.chunks_exact(8)) {
            let p = f64::from_le_bytes(p.try_into().expect("8 bytes"));
            let width = d.fin.chunks;
            // each chunk's share: its mean over layers and heads, normalised
            let mut means = vec![0.0f64; width];
            for c in 0..cells {
                for (j, m) in means.iter_mut().enumerate() {
                    *m += f16_to_f64(d.fin.halves[c * width + j]);
                }
            }
            let total: f64 = means.iter().sum();
            let scores: Vec<f64> = d.hits.iter().map(|(_, s)| *s).collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut sorted = scores.clone();
            sorted.sort_by(f64::total_cmp);
            let margin = if scores.len() > 1 {
                top - sorted[sorted.len() - 2]
            } else {
                0.0
            };
            let n = scores.len() as f64;
            let words = d.fin.answer.split_whitespace().count() as f64;
            d.answer_row = [
                top,
                margin,
                scores.iter().sum::<f64>() / n,
                1.0,
                d.keep.len() as f64 / n,
                p,
                f64::NAN,
                f64::NAN,
                f64::NAN,
                words.ln_1p(),
            ];
            answers.extend(d.answer_row.iter().flat_map(|v| v.to_le_bytes()));
            for &i in &d.keep {
                let share = if i < width {
                    means[i] / total
                } else {
                    f64::NAN
                };
                let row = [
                    scores[i],
                    top - scores[i],
                    1.0 / (i as f64 + 1.0),
                    1.0,
                    share,
                ];
                chunks.extend(row.iter().flat_map(|v| v.to_le_bytes()));
            }
        }
        Ok((PyBytes::new(py, &answers), PyBytes::new(py, &chunks)))
    }

    /// The verdicts, given p(correct) per request and p(useful) per trusted chunk (float64
    /// bytes): ``(key, value)`` per completed request.
    fn verdicts<'py>(
        &self,
        py: Python<'py>,
        p_factual: &[u8],
        p_correct: &[u8],
        p_useful: &[u8],
    ) -> PyResult<Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
        let read = |b: &[u8]| -> Vec<f64> {
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect()
        };
        let (factual, correct, useful) = (read(p_factual), read(p_correct), read(p_useful));
        let trusted: usize = self.done.iter().map(|d| d.keep.len()).sum();
        if factual.len() != self.done.len()
            || correct.len() != self.done.len()
            || useful.len() != trusted
        {
            return Err(PyValueError::new_err(
                "one p per request and one per trusted chunk",
            ));
        }
        let mut out = Vec::with_capacity(self.done.len());
        let mut at = 0;
        for ((d, &p), &c) in self.done.iter().zip(&factual).zip(&correct) {
            let forecast = d
                .keep
                .iter()
                .enumerate()
                .map(|(j, &i)| Forecast {
                    chunk_id: &d.hits[i].0,
                    p_useful: useful[at + j],
                    retrieval_rank: j,
                })
                .collect();
            at += d.keep.len();
            let decision = if p < 0.1 || c < 0.1 {
                "block"
            } else if c < 0.5 {
                "caveat"
            } else {
                "allow"
            };
            let verdict = Verdict {
                schema_version: 1,
                event_type: "answer.verdict",
                request_id: &d.rid,
                idempotency_key: &d.rid,
                tenant: &d.tenant,
                decision,
                reasons: [&REASON; 6],
                stage: "final",
                escalate: false,
                policy: "default/1",
                signals: Signals {
                    retrieval: Retrieval {
                        status: "ok",
                        trusted_chunk_ids: d.keep.iter().map(|&i| d.hits[i].0.as_str()).collect(),
                        m1: !d.keep.is_empty(),
                        m2: d.keep.len() as f64 / d.hits.len() as f64,
                        q_hat: self.q_hat,
                        alpha: 0.1,
                        certifiable: true,
                        calibration_version: "v",
                        calibration_key: "global",
                        fallback: true,
                        fallback_reason: "unknown-collection",
                        clipped_scores: 1,
                        monitor: "warming-up",
                        m1_mean: None,
                    },
                    lookback: Lookback {
                        status: "ok",
                        p_factual: p,
                        model_version: "v",
                    },
                    claims: Claims {
                        status: "not-configured",
                        n: 0,
                        supported: 0,
                        unsupported: 0,
                        uncertain: 0,
                        irrelevant: 0,
                        reliability: None,
                        reliability_level: None,
                        hallucination_rate: None,
                        evidence_scope: None,
                        stream_mismatch: false,
                        superseded_claims: [],
                        unchecked: 0,
                        unreadable: 0,
                        unjudged: 0,
                    },
                },
                confidence: c,
                confidence_features: Features(&self.answer_names, &d.answer_row),
                chunk_forecast: forecast,
                advice: None,
                certified_risk: None,
                certified_delta: None,
                certificate: None,
                caveat_text: None,
                rewritten_answer: None,
                model_versions: Versions {
                    generator: &d.fin.model,
                    certifier: "v",
                    lookback: "v",
                    confidence: "v",
                    policy: "default/1",
                },
                timings_ms: Timings {
                    join_wait: 0.0,
                    signals: 0.9,
                    policy: 0.07,
                },
                produced_at: now_iso(), // each verdict's own time, as the sidecar's
                sidecar_version: "0.1.0",
            };
            let value =
                serde_json::to_vec(&verdict).map_err(|e| PyValueError::new_err(e.to_string()))?;
            out.push((PyBytes::new(py, d.rid.as_bytes()), PyBytes::new(py, &value)));
        }
        Ok(out)
    }

    /// Records refused, by reason (the sketch dead-letters nothing).
    fn refused(&self) -> HashMap<&'static str, u64> {
        self.refused.clone()
    }

    /// Requests held waiting for their other half.
    fn held(&self) -> usize {
        self.store.len()
    }
}

#[pymodule]
fn native_floor(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeFloor>()?;
    Ok(())
}
