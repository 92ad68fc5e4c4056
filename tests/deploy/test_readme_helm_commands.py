"""The helm command lines of the how-tos (helm/README.md, the chart's README) that need no
cluster run as a user types them, with the project's pinned helm, in a copy of the tree.

``helm upgrade --install`` and ``helm test`` need a cluster and are left out (their
values files are rendered by scripts/helm-check.sh); ``helm dependency build``,
``helm template`` and ``helm lint`` lines run as written. Before, helm/README.md's
``helm template llm helm/example-llm-service -n rag`` failed with the pinned helm
("chart requires kubeVersion: >=1.29.0-0 which is incompatible with Kubernetes v1.20.0"):
a helm built by ``go install`` assumes Kubernetes 1.20 unless ``--kube-version`` says.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from tests.deploy.tools import CHART, ROOT, RUN_TIMEOUT_S, helm_env

HOWTOS = (ROOT / "helm" / "README.md", CHART / "README.md")
WITHOUT_A_CLUSTER = {"dependency", "template", "lint"}
_SH_BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.M | re.S)


def helm_lines(text: str) -> list[str]:
    """The ``helm …`` lines of the shell blocks, their comments left out."""
    lines = (line for block in _SH_BLOCK.findall(text) for line in block.splitlines())
    return [
        " ".join(shlex.split(line, comments=True))
        for line in lines
        if line.strip().startswith("helm ")
    ]


def test_the_howtos_helm_lines_run_as_written(helm: Path, tmp_path: Path) -> None:
    shutil.copytree(CHART, tmp_path / "charts" / CHART.name)
    shutil.copytree(ROOT / "helm", tmp_path / "helm", ignore=shutil.ignore_patterns("charts"))
    ran = []
    for howto in HOWTOS:
        for line in helm_lines(howto.read_text(encoding="utf-8")):
            words = shlex.split(line)
            if words[1] not in WITHOUT_A_CLUSTER:
                continue
            out = subprocess.run(
                [str(helm), *words[1:]],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                env=helm_env(),
                timeout=RUN_TIMEOUT_S,
                check=False,
            )
            assert out.returncode == 0, f"{howto.relative_to(ROOT)}: {line}\n{out.stderr}"
            ran.append(words[1])
    assert "dependency" in ran and "template" in ran, ran


def test_helm_lines_are_read_from_shell_blocks_only() -> None:
    text = "```sh\nhelm template a b -n rag   # renders\necho x\n```\n\nhelm lint c\n"
    text += "```yaml\nhelm: {}\n```\n"
    assert helm_lines(text) == ["helm template a b -n rag"]
