// zps/server/job.h — the job spec the coordinator and every shard agree on. It is the contract
// between workers and servers, declared in zps/common/job_spec.h (JobSpec, ShardJob,
// OptimizerConfig, CommitConfig, LrScheduleConfig, their field lists and codecs); the server's
// code names its types zps::server::JobSpec etc. through that header's aliases. The server
// headers below are the logic built on those parts; this header has always brought them in.
#pragma once

#include "zps/common/job_spec.h"
#include "zps/server/optimizer.h"
#include "zps/server/shard_state.h"
#include "zps/server/step_commit.h"
