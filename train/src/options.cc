#include "zps/train/options.h"

#include <cstdint>
#include <string>

namespace zps::train {

void AddModelFlags(Flags& flags, ModelConfig* c) {
  flags.Add("d-model", "model width (multiple of --n-heads)", &c->d_model, 1, 65536);
  flags.Add("n-layers", "transformer blocks", &c->n_layers, 1, 4096);
  flags.Add("n-heads", "attention heads per block", &c->n_heads, 1, 65536);
  flags.Add("d-ff", "MLP hidden width", &c->d_ff, 1, 262144);
  flags.Add("seq-len", "context length in bytes", &c->seq_len, 1, 65536);
  flags.AddCustom("model-seed", "seed of the parameter initialiser", std::to_string(c->seed),
                  [c](std::string_view text) -> Status {
                    ZPS_ASSIGN_OR_RETURN(int64_t v, ParseInt(text, 0, INT64_MAX));
                    c->seed = static_cast<uint64_t>(v);
                    return Status::Ok();
                  });
}

void AddDataFlags(Flags& flags, DataOptions* d, std::string* corpus) {
  flags.Add("batch", "sequences per rank per step", &d->batch, 1, 1 << 20);
  flags.Add("eval-windows", "held-out windows at the corpus end", &d->eval_windows, 0, 1 << 20);
  flags.AddCustom("data-seed", "seed of the data order", std::to_string(d->seed),
                  [d](std::string_view text) -> Status {
                    ZPS_ASSIGN_OR_RETURN(int64_t v, ParseInt(text, 0, INT64_MAX));
                    d->seed = static_cast<uint64_t>(v);
                    return Status::Ok();
                  });
  flags.Add("corpus", "training text: a file or directory (empty: /usr/share/common-licenses)",
            corpus);
}

}  // namespace zps::train
