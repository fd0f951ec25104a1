# shellcheck shell=bash
# Sourced by scripts/bench-memory.sh and scripts/bench-biggest.sh, whose zps.torch worker trains
# a model of large CPU parameters.
#   worker_huge_pages
#       Unless HUGETLB=0, adds glibc.malloc.hugetlb=1 to GLIBC_TUNABLES (exported; the shards the
#       worker starts inherit it): glibc then advises its fresh mappings MADV_HUGEPAGE, and the
#       worker's gradients, torch's own allocations, get transparent huge pages instead of
#       being faulted in 4 KiB at a time (docs/pytorch.md, "How parameters live").
worker_huge_pages() {
  if [[ ${HUGETLB:-1} != 0 && ${GLIBC_TUNABLES:-} != *glibc.malloc.hugetlb* ]]; then
    export GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1
  fi
}
