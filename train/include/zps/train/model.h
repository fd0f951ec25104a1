// zps/train/model.h — a byte-level decoder-only transformer language model, forward and backward
// written in plain C++ (no BLAS), on the CPU.
//
// Architecture (GPT-2 style, pre-LayerNorm, untied LM head):
//   x0 = tok_emb[token] + pos_emb[t]
//   for each block: x = x + Attn(LN1(x)); x = x + MLP(LN2(x))      (causal multi-head attention,
//                                                                   MLP = W2 · GELU_tanh(W1 · h))
//   logits = LN_f(x) · lm_head;  loss = mean over tokens of cross-entropy.
// docs/model.md gives the parameter count, FLOPs and memory formulas.
//
// Parameters are declared (Specs) and never owned: during a step the model reaches them through
// ParamAccess, layer by layer (see LayerGroups and TrainStep).
//
// Determinism: one process, one thread per Model. Every output element is accumulated in a fixed
// order that depends only on the shapes, never on the ISA, vector width or timing (no FMA
// contraction, explicit lane order in reductions). Same inputs and parameters give the same bits.
//
// Thread-safety: a Model holds its activation workspace; one Model per thread. Different Model
// objects are independent. The free functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zps/common/layout.h"
#include "zps/common/status.h"
#include "zps/train/param_access.h"

namespace zps::train {

struct ModelConfig {
  int vocab = 256;    // Default: 256 (bytes). Must be 256 for byte-level data.
  int d_model = 128;  // Default: 128. Multiple of n_heads.
  int n_layers = 4;   // Default: 4. >= 1.
  int n_heads = 4;    // Default: 4. >= 1.
  int d_ff = 512;     // Default: 512 (4 x d_model).
  int seq_len = 128;  // Default: 128. Context length (positional table size).
  uint64_t seed = 1;  // Default: 1. Seeds InitParam.

  /// Errors: InvalidArgument naming the field (non-positive sizes, d_model % n_heads != 0,
  /// sizes whose products overflow the bounds below).
  Status Validate() const;
};

/// How a parameter starts. Uniform draws have mean 0 and standard deviation `std`
/// (uniform in [-std*sqrt(3), std*sqrt(3)]) from a counter-based generator, so any element range
/// can be initialised independently and bit-identically on any machine.
struct ParamInit {
  enum class Kind : uint8_t { kZeros = 0, kOnes = 1, kUniform = 2 };
  Kind kind = Kind::kZeros;
  float std = 0.0f;
};

struct ParamDecl {
  ParamSpec spec;  // name and shape, as registered in the flat layout
  ParamInit init;
};

/// The parameters in registration order; the index is the param id used with ParamAccess.
/// Order: tok_emb [V,D], pos_emb [T,D]; per block l ("h{l}."): ln1.g, ln1.b [D], attn.wqkv [D,3D],
/// attn.bqkv [3D], attn.wo [D,D], attn.bo [D], ln2.g, ln2.b [D], mlp.w1 [D,F], mlp.b1 [F],
/// mlp.w2 [F,D], mlp.b2 [D]; then lnf.g, lnf.b [D], lm_head [D,V]. Weights are [in, out].
/// Call config.Validate() first.
std::vector<ParamDecl> Specs(const ModelConfig& config);
/// Just the specs, for Layout::Build.
std::vector<ParamSpec> LayoutSpecs(const std::vector<ParamDecl>& decls);

/// Writes elements [offset, offset + out.size()) of parameter `decl`, derived from
/// (seed, name, element index) only. Errors: OutOfRange when the range passes the parameter's end.
Status InitParam(const ParamDecl& decl, uint64_t seed, uint64_t offset, std::span<float> out);
/// Whole-parameter form: out.size() must equal the parameter's numel.
Status InitParam(const ParamDecl& decl, uint64_t seed, std::span<float> out);

/// Parameter count (no padding).
uint64_t CountParams(const ModelConfig& config);
/// Training FLOPs per token (forward + backward): 6 x (non-embedding params + lm_head) plus the
/// causal attention term 6 x n_layers x seq_len x d_model. Used for tokens/s -> FLOP/s reporting.
double TrainFlopsPerToken(const ModelConfig& config);
/// Activation memory of one TrainStep for `batch` sequences, in bytes (the workspace).
uint64_t ActivationBytes(const ModelConfig& config, int batch);

struct StepOutput {
  double loss = 0.0;   // mean cross-entropy (nats/token) of this micro-batch, unscaled
  int64_t tokens = 0;  // predicted tokens = batch x seq_len
};

class Model {
 public:
  /// Errors: InvalidArgument from config.Validate().
  static Result<std::unique_ptr<Model>> Create(const ModelConfig& config);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  uint32_t num_params() const { return static_cast<uint32_t>(decls_.size()); }
  const std::vector<ParamDecl>& decls() const { return decls_; }

  /// The parameter ids of each layer group, in forward order: group 0 = embeddings
  /// {tok_emb, pos_emb}, groups 1..n_layers = blocks, last = head {lnf.g, lnf.b, lm_head}.
  const std::vector<std::vector<uint32_t>>& LayerGroups() const { return groups_; }

  /// One forward + backward pass over a micro-batch.
  ///
  /// `tokens` holds `batch` rows of seq_len + 1 bytes, row-major: row b predicts bytes 1..seq_len
  /// from bytes 0..seq_len-1. Gradients are of (loss x loss_scale), where loss is the mean over
  /// batch x seq_len tokens; each is pushed once through access.PushGrad.
  ///
  /// Access order: forward acquires group 0, 1, ..., n_layers (releasing each after use), then the
  /// head, which stays acquired through the loss and its own backward (one fetch, not two); then
  /// backward acquires blocks n_layers..1 again, in reverse, pushing each block's 12 grads before
  /// releasing it. The embedding backward needs no parameter values and acquires nothing; it
  /// pushes tok_emb then pos_emb last. Pushes: head (lnf.g, lnf.b, lm_head), then per block in
  /// reverse its params in id order, then the embeddings.
  ///
  /// Errors: InvalidArgument for a bad batch (< 1, or batch x seq_len > 2^24) or token buffer
  /// size, or a non-finite/non-positive loss_scale; Internal when Acquire returns views of the
  /// wrong length; any error of `access` (everything acquired is released first).
  Result<StepOutput> TrainStep(std::span<const uint8_t> tokens, int batch, float loss_scale,
                               ParamAccess& access);

  /// Forward only: the mean loss. Same token layout and access order (no backward, no pushes).
  Result<double> Evaluate(std::span<const uint8_t> tokens, int batch, ParamAccess& access);

 private:
  explicit Model(const ModelConfig& config);
  struct Workspace;
  Status Forward(std::span<const uint8_t> tokens, int batch, ParamAccess& access, bool train,
                 double* loss, float loss_scale);

  ModelConfig config_;
  std::vector<ParamDecl> decls_;
  std::vector<std::vector<uint32_t>> groups_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace zps::train
