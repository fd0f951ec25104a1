// zps-train's own flags in a test, registered as its main() registers them (AddTrainFlags), for
// job_flags_test.cc and options_test.cc.
#pragma once

#include <vector>

#include "zps/common/config.h"
#include "zps/train/job_flags.h"
#include "zps/train/options.h"

namespace zps::train {

// The options, the flags and the job-spec flags of one zps-train command line. Not copyable:
// the flags hold pointers into `o`.
struct TrainFlags {
  TrainOptions o;
  Flags flags{"t", "test"};
  JobFlags job{&flags};

  TrainFlags() { AddTrainFlags(flags, job, &o); }
  TrainFlags(const TrainFlags&) = delete;
  TrainFlags& operator=(const TrainFlags&) = delete;

  // Parses `args`, the command line without the program name.
  Result<ParseOutcome> Parse(std::vector<const char*> args) {
    args.insert(args.begin(), "t");
    return flags.Parse(static_cast<int>(args.size()), args.data());
  }
};

}  // namespace zps::train
