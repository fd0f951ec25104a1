// The embedded default of zps-train: a local cluster of zps-server and zps-train processes on
// loopback. Internal to zps-train.
#pragma once

#include <string>

#include "zps/common/status.h"

namespace zps::train {

struct LocalCluster {
  int shards = 2;                     // zps-server processes (ordinal 0 is the coordinator)
  int workers = 2;                    // zps-train --mode worker processes
  std::string ucx_tls;                // passed to every process ("" = UCX's choice)
  int metrics_port = 0;               // 0 = no metrics; else shard i serves on base+i, worker r on
                                      // base+shards+r (all on 127.0.0.1)
  uint64_t shard_memory_budget = 0;   // > 0: every shard gets --memory-budget and its own
                                      // --data-dir (<temp dir>/shard-i-data: spill files and
                                      // checkpoints); 0 = neither (all in RAM)
  uint64_t shard_serving_budget = 0;  // > 0: every shard gets --serving-budget (and the
                                      // --data-dir above)
  std::string shard_serving_copies = "stored";  // every shard's --serving-copies
  std::string work_dir;  // where the cluster directory (zps-local-XXXXXX) is made; "" = $TMPDIR,
                         // else /tmp
};

/// The directory the cluster directory is made in: `work_dir`, else $TMPDIR, else /tmp.
std::string ClusterParentDir(const std::string& work_dir);

/// Starts the shards, then the workers with this process's own arguments plus their rank and
/// the endpoint; prints rank 0's output; stops everything at the end (or on SIGINT/SIGTERM, or
/// when any process fails, whose log tail is printed). Logs, the token and the shards' data
/// (spill files, checkpoints) go to a new directory under ClusterParentDir(work_dir), removed
/// after a clean run and kept (its path printed) after a failure. Errors: NotFound (no zps-server
/// beside this program, or no such work dir), an errno error when the directory cannot be made,
/// Internal naming a process that stopped early (its exit code or signal), Cancelled (a signal).
Status RunLocalCluster(const LocalCluster& cluster, int argc, char** argv);

}  // namespace zps::train
