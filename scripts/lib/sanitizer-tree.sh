# Sourced by scripts/fuzz.sh and scripts/tsan.sh: configures a clang sanitizer build tree.
#   configure_sanitizer_tree DIR [cmake args...]
# RelWithDebInfo at -O1 with line tables only: it compiles about a third faster than at -O2 -g,
# and sanitizer reports still name files and lines (CI builds these trees cold, docs/testing.md).
# ccache when it is installed, as scripts/build.sh.
configure_sanitizer_tree() {
  local dir=$1
  shift
  local opt="-O1 -gline-tables-only -DNDEBUG"
  local launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
    # With -g ccache also hashes the working directory (hash_dir), so without this a clone
    # in another folder never hit; the price is debug info naming the first clone's folder.
    export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  fi
  cmake -S . -B "$dir" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" "$@" >/dev/null
}
