"""Reading and writing calibration artifacts (the only file I/O of the package).

Every problem with a file -- missing, not JSON, another schema version, a field
out of range, inconsistent numbers -- raises :class:`ArtifactError` naming the
file and what was wrong.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from sidecar.conformal.artifact import ARTIFACT_KIND, SCHEMA_VERSION, CalibrationArtifact
from sidecar.contracts.codec import summarise_validation
from sidecar.exceptions import ArtifactError
from sidecar.hashing import not_a_regular_file

__all__ = ["load_artifact", "save_artifact"]

log = logging.getLogger("sidecar.conformal")


def save_artifact(artifact: CalibrationArtifact, path: str | Path) -> Path:
    """Write the artifact as JSON (mode 0644), atomically (temporary file, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(artifact.dumps())
        # mkstemp makes the file private (0600); an artifact is read by the serving user.
        Path(tmp).chmod(0o644)
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_artifact(path: str | Path) -> CalibrationArtifact:
    """Read and validate a calibration artifact; :class:`ArtifactError` on any problem."""
    source = Path(path)
    problem = not_a_regular_file(source)
    if problem is not None:
        raise ArtifactError(f"calibration artifact {source} {problem}")
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ArtifactError(f"calibration artifact {source} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"calibration artifact {source} cannot be read: {exc}") from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"calibration artifact {source} is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ArtifactError(f"calibration artifact {source} must be a JSON object")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"calibration artifact {source} has schema_version {version!r}; this build reads "
            f"schema_version {SCHEMA_VERSION}"
        )
    if raw.get("kind") != ARTIFACT_KIND:
        raise ArtifactError(
            f"calibration artifact {source} has kind {raw.get('kind')!r}, expected "
            f"{ARTIFACT_KIND!r}"
        )
    try:
        artifact = CalibrationArtifact.model_validate(raw)
    except ValidationError as exc:
        problems = summarise_validation(exc, limit=exc.error_count())  # every one of them
        raise ArtifactError(f"calibration artifact {source} is invalid: {problems}") from exc
    if artifact.params_sha256 is None:
        log.warning(
            "calibration artifact %s has no params_sha256 (written before it existed): an edit "
            "of its values cannot be detected; run `guardrail calibrate retrieval` again",
            source,
        )
    return artifact
