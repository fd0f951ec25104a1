#!/usr/bin/env bash
# One chart check, as ctest runs it (tests/chart/CMakeLists.txt registers one test per line below).
#   run-check.sh lint                  helm lint --strict, with the defaults and every values file
#   run-check.sh schema-rejects-typos  values.schema.json rejects misspelled keys and bad values
#   run-check.sh template <scenario>   helm template with tests/chart/values/<scenario>.yaml, then every
#                                      object against the Kubernetes schemas + the scenario's shape
#   run-check.sh references            NOTES.txt and deploy/ name Services and Secrets that are rendered
#   run-check.sh rules-check           promtool check rules
#   run-check.sh rules-test            promtool test rules tests/chart/rules_test.yaml
#   run-check.sh metrics               dashboards and rules use only the metrics in docs/metrics.md;
#                                      alerts' runbook_url anchors are headings of their docs page
#   run-check.sh lockfile              package-lock.json names no registry (no "resolved" URLs)
# Needs scripts/install-chart-tools.sh to have run (ctest's chart.tools fixture does it). Every check
# fails loudly when a tool is missing: none is skipped.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TOOLS=${ZPS_TOOLS_DIR:-$ROOT/build/tools}
WORK=${ZPS_CHART_WORK:-$ROOT/build/chart-tests}
HELM="$TOOLS/helm"
CHART="$ROOT/helm/zps"
# The release that deploy/ and the docs assume.
RELEASE=zps
NAMESPACE=training

mkdir -p "$WORK"
# Keep helm's state out of $HOME and away from any cluster: helm template and --dry-run=client need
# neither, and an empty kubeconfig makes sure nothing is contacted.
export HELM_CONFIG_HOME="$WORK/helm/config" HELM_CACHE_HOME="$WORK/helm/cache" HELM_DATA_HOME="$WORK/helm/data"
export KUBECONFIG="$WORK/helm/empty-kubeconfig"
mkdir -p "$HELM_CONFIG_HOME" && : >"$KUBECONFIG"

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "FAIL: '$1' not found ($2)" >&2; exit 1; }
}
need_helm() {
  [[ -x "$HELM" ]] || { echo "FAIL: $HELM missing; run scripts/install-chart-tools.sh" >&2; exit 1; }
}
need_node_modules() {
  need node "scripts/install-deps.sh installs it"
  [[ -d "$HERE/node_modules/kubernetes-models" ]] || { echo "FAIL: tests/chart/node_modules missing; run scripts/install-chart-tools.sh" >&2; exit 1; }
}
# API versions a scenario renders with: the monitoring-on scenario has the Prometheus Operator.
api_args() {
  case "$1" in
    monitoring-on) echo "--api-versions monitoring.coreos.com/v1" ;;
    *) echo "" ;;
  esac
}

check=${1:?usage: run-check.sh <check> [args]}
shift
case "$check" in
  lint)
    need_helm
    "$HELM" lint --strict "$CHART"
    # helm lint has no --api-versions: the ServiceMonitor and PrometheusRule templates are rendered
    # and checked by the template.monitoring-on test instead.
    for f in "$HERE"/values/*.yaml; do
      "$HELM" lint --strict "$CHART" -f "$f"
    done
    ;;
  schema-rejects-typos)
    need_helm
    # Each of these must be refused by values.schema.json, naming the offending key.
    cases=(
      "shard=4|additional properties 'shard'"
      "persistence.storageClass=fast|additional properties 'storageClass'"
      "monitoring.serviceMonitor.enable=true|additional properties 'enable'"
      "rdma.enable=true|additional properties 'enable'"
      "server.memoryBudget=24Gb|memoryBudget"
      "server.port=70000|port"
      "server.logLevel=verbose|logLevel"
      "server.logLevel=trace|logLevel"
      "shards=0|shards"
      "reshard.enable=true|additional properties 'enable'"
      "reshard.port=70000|port"
      "reshard.previousShards=-1|previousShards"
    )
    for c in "${cases[@]}"; do
      set_arg=${c%%|*} want=${c#*|}
      if out=$("$HELM" template "$RELEASE" "$CHART" -n "$NAMESPACE" --set "$set_arg" 2>&1); then
        echo "FAIL: --set $set_arg was accepted" >&2
        exit 1
      fi
      if ! grep -qF -- "$want" <<<"$out"; then
        echo "FAIL: --set $set_arg was refused, but not for the expected reason ($want):" >&2
        echo "$out" >&2
        exit 1
      fi
      echo "ok: --set $set_arg refused ($want)"
    done
    # The documented extension point takes zps-server options the chart has no value for (a real
    # option: zps-server refuses unknown keys at start); the chart's own are guarded.
    "$HELM" template "$RELEASE" "$CHART" --set server.extraConfig.serving-budget=8GiB >/dev/null
    if "$HELM" template "$RELEASE" "$CHART" --set server.extraConfig.ordinal=3 >/dev/null 2>&1; then
      echo "FAIL: server.extraConfig.ordinal was accepted" >&2
      exit 1
    fi
    ;;
  template)
    need_helm
    need_node_modules
    scenario=${1:?template needs a scenario}
    out="$WORK/rendered-$scenario.yaml"
    # shellcheck disable=SC2046
    "$HELM" template "$RELEASE" "$CHART" -n "$NAMESPACE" -f "$HERE/values/$scenario.yaml" $(api_args "$scenario") >"$out"
    node "$HERE/validate-manifests.mjs" "$scenario" "$out" "$ROOT"
    ;;
  references)
    need_helm
    need_node_modules
    out="$WORK/rendered-references.yaml"
    notes="$WORK/notes-default.txt"
    "$HELM" template "$RELEASE" "$CHART" -n "$NAMESPACE" >"$out"
    # helm template does not render NOTES.txt; a client-side dry-run install does, offline.
    "$HELM" install "$RELEASE" "$CHART" -n "$NAMESPACE" --dry-run=client >"$WORK/dry-run.txt"
    sed -n '/^NOTES:/,$p' "$WORK/dry-run.txt" >"$notes"
    [[ -s "$notes" ]] || { echo "FAIL: no NOTES in the dry-run output" >&2; exit 1; }
    node "$HERE/check-references.mjs" "$out" "$notes" \
      "$ROOT/deploy/worker-job.yaml" "$ROOT/deploy/worker-jobset.yaml" "$ROOT/deploy/worker-pytorchjob.yaml"
    ;;
  rules-check)
    need promtool "Debian's prometheus package, scripts/install-deps.sh"
    promtool check rules "$CHART/rules/zps-alerts.yaml"
    ;;
  rules-test)
    need promtool "Debian's prometheus package, scripts/install-deps.sh"
    promtool test rules "$HERE/rules_test.yaml"
    ;;
  metrics)
    need_node_modules
    node "$HERE/check-metrics.mjs" "$ROOT"
    ;;
  lockfile)
    if grep -n '"resolved"' "$HERE/package-lock.json"; then
      echo "FAIL: package-lock.json records registry URLs; regenerate with tests/chart/.npmrc in effect" >&2
      exit 1
    fi
    grep -q '"integrity"' "$HERE/package-lock.json" || { echo "FAIL: package-lock.json has no integrity hashes" >&2; exit 1; }
    echo "ok: lockfile pins versions and hashes, and names no registry"
    ;;
  *)
    echo "unknown check '$check'" >&2
    exit 2
    ;;
esac
