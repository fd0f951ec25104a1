// zps/train/options.h — command-line options of the model and the data, for zps-train's main().
//
// Thread-safety: used from main(), once, like zps::Flags itself.
#pragma once

#include <string>

#include "zps/common/config.h"
#include "zps/train/data.h"
#include "zps/train/model.h"

namespace zps::train {

/// Registers --d-model, --n-layers, --n-heads, --d-ff, --seq-len and --model-seed, writing into
/// *config (whose current values are the defaults shown by --help). Call config->Validate() after
/// Flags::Parse: the cross-field rules (d_model % n_heads) are checked there.
void AddModelFlags(Flags& flags, ModelConfig* config);

/// Registers --batch, --data-seed, --eval-windows and --corpus (a file or a directory; empty = the
/// Debian license texts). Rank and world come from the job, not from these flags.
void AddDataFlags(Flags& flags, DataOptions* data, std::string* corpus);

}  // namespace zps::train
