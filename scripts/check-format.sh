#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted as the checked-in .clang-format says (Debian's
# clang-format, the version CI runs). Prints the files that differ and exits 1 if any do;
# `scripts/check-format.sh --fix` rewrites them in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  echo "check-format: clang-format is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.inc' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of ${#files[@]} C++ files differ from .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "check-format: run scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} C++ files formatted"
