# shellcheck shell=bash
# Sourced by scripts/test.sh: says again, at the end of a long log, which tests of an earlier
# ctest stage failed and what each printed: from its first report (a TSan warning, a failed
# expectation, a timeout), and its last lines (a CI log is often read from its tail).
#   print_ctest_failures BUILD_DIR STAGE
# Reads BUILD_DIR/Testing/Temporary/LastTestsFailed.log ("index:name" lines) and LastTest.log
# (every test's output); with --repeat, the output of a test's last run.
print_ctest_failures() {
  local dir=$1 stage=$2
  local failed=$dir/Testing/Temporary/LastTestsFailed.log
  local log=$dir/Testing/Temporary/LastTest.log
  if [[ ! -s $failed ]]; then
    echo "  $stage: no test is recorded as failed: the stage failed before or around its tests (above)"
    return 0
  fi
  local name
  while IFS= read -r line; do
    name=${line#*:}
    echo "  $stage: $name failed; what it printed:"
    [[ -f $log ]] || continue
    awk -v name="$name" '
      $0 ~ /^[0-9]+\/[0-9]+ Testing: / { inside = (substr($0, index($0, ": ") + 2) == name); if (inside) n = 0; next }
      inside && /^<end of output>$/ { inside = 0; next }
      inside { out[n++] = $0 }
      END {
        # From the first report (a TSan warning, a failed expectation), then the last lines.
        f = -1
        for (i = 0; i < n && f < 0; ++i) if (out[i] ~ /ThreadSanitizer|Failure|FATAL|[Tt]imeout/) f = i
        last = n > 15 ? n - 15 : 0
        if (f >= 0) {
          for (i = f; i < n && i < f + 40 && i < last; ++i) print "    | " out[i]
          if (f + 40 < last) print "    | ..."
        }
        for (i = (f >= 0 && last < f ? f : last); i < n; ++i) print "    | " out[i]
      }
    ' "$log"
  done <"$failed"
}
