// The transformer LM: parameter declaration and initialisation, and the layer-by-layer step.
#include "zps/train/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels.h"

namespace zps::train {
namespace {

// Per-block parameter slots, in id order within a block.
enum BlockSlot : uint32_t {
  kLn1G = 0,
  kLn1B,
  kWqkv,
  kBqkv,
  kWo,
  kBo,
  kLn2G,
  kLn2B,
  kW1,
  kB1,
  kW2,
  kB2,
  kBlockParams
};
constexpr uint32_t kTokEmb = 0;
constexpr uint32_t kPosEmb = 1;
constexpr uint32_t kFirstBlock = 2;

uint32_t BlockId(int layer, uint32_t slot) {
  return kFirstBlock + static_cast<uint32_t>(layer) * kBlockParams + slot;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Releases the acquired ids when it goes out of scope, unless already released.
class Held {
 public:
  Held(ParamAccess& access, std::span<const uint32_t> ids) : access_(access), ids_(ids) {}
  ~Held() { Done(); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  void Done() {
    if (!ids_.empty()) access_.Release(ids_);
    ids_ = {};
  }

 private:
  ParamAccess& access_;
  std::span<const uint32_t> ids_;
};

}  // namespace

Status ModelConfig::Validate() const {
  if (vocab != 256)
    return InvalidArgument("model: vocab must be 256 (byte-level), got " + std::to_string(vocab));
  if (d_model < 1 || d_model > 65536)
    return InvalidArgument("model: d_model must be in [1, 65536]");
  if (n_layers < 1 || n_layers > 4096)
    return InvalidArgument("model: n_layers must be in [1, 4096]");
  if (n_heads < 1 || d_model % n_heads != 0)
    return InvalidArgument("model: n_heads must be >= 1 and divide d_model");
  if (d_ff < 1 || d_ff > 262144) return InvalidArgument("model: d_ff must be in [1, 262144]");
  if (seq_len < 1 || seq_len > 65536)
    return InvalidArgument("model: seq_len must be in [1, 65536]");
  // Every weight matrix must fit int indexing of one dimension pair in int64 and a float count
  // below 2^40 (the layout's bound).
  if (static_cast<uint64_t>(d_model) * static_cast<uint64_t>(std::max(3 * d_model, d_ff)) >
      (1ull << 34))
    return InvalidArgument("model: weight matrices too large");
  return Status::Ok();
}

std::vector<ParamDecl> Specs(const ModelConfig& c) {
  const int64_t D = c.d_model, F = c.d_ff, V = c.vocab, T = c.seq_len;
  using K = ParamInit::Kind;
  const float w_std = 0.02f;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.n_layers));
  std::vector<ParamDecl> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamInit init) {
    out.push_back(ParamDecl{ParamSpec{std::move(name), std::move(shape)}, init});
  };
  add("tok_emb", {V, D}, {K::kUniform, w_std});
  add("pos_emb", {T, D}, {K::kUniform, 0.01f});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    add(p + "ln1.g", {D}, {K::kOnes, 0});
    add(p + "ln1.b", {D}, {K::kZeros, 0});
    add(p + "attn.wqkv", {D, 3 * D}, {K::kUniform, w_std});
    add(p + "attn.bqkv", {3 * D}, {K::kZeros, 0});
    add(p + "attn.wo", {D, D}, {K::kUniform, proj_std});
    add(p + "attn.bo", {D}, {K::kZeros, 0});
    add(p + "ln2.g", {D}, {K::kOnes, 0});
    add(p + "ln2.b", {D}, {K::kZeros, 0});
    add(p + "mlp.w1", {D, F}, {K::kUniform, w_std});
    add(p + "mlp.b1", {F}, {K::kZeros, 0});
    add(p + "mlp.w2", {F, D}, {K::kUniform, proj_std});
    add(p + "mlp.b2", {D}, {K::kZeros, 0});
  }
  add("lnf.g", {D}, {K::kOnes, 0});
  add("lnf.b", {D}, {K::kZeros, 0});
  add("lm_head", {D, V}, {K::kUniform, w_std});
  return out;
}

std::vector<ParamSpec> LayoutSpecs(const std::vector<ParamDecl>& decls) {
  std::vector<ParamSpec> out;
  out.reserve(decls.size());
  for (const auto& d : decls) out.push_back(d.spec);
  return out;
}

Status InitParam(const ParamDecl& decl, uint64_t seed, uint64_t offset, std::span<float> out) {
  const uint64_t numel = decl.spec.numel();
  if (offset > numel || out.size() > numel - offset)
    return OutOfRange("InitParam " + decl.spec.name + ": range [" + std::to_string(offset) + ", +" +
                      std::to_string(out.size()) + ") past " + std::to_string(numel));
  switch (decl.init.kind) {
    case ParamInit::Kind::kZeros:
      std::fill(out.begin(), out.end(), 0.0f);
      break;
    case ParamInit::Kind::kOnes:
      std::fill(out.begin(), out.end(), 1.0f);
      break;
    case ParamInit::Kind::kUniform: {
      // u in [-1, 1) from the top 24 bits (exact in fp32); scaled to std via sqrt(3).
      const uint64_t key = SplitMix64(seed ^ SplitMix64(Fnv1a(decl.spec.name)));
      const float a = decl.init.std * 1.7320508075688772f;
      for (size_t i = 0; i < out.size(); ++i) {
        const uint64_t r = SplitMix64(key + (offset + i) * 0x9e3779b97f4a7c15ull);
        const float u = static_cast<float>(static_cast<int32_t>(r >> 40) - (1 << 23)) *
                        (1.0f / static_cast<float>(1 << 23));
        out[i] = u * a;
      }
      break;
    }
  }
  return Status::Ok();
}

Status InitParam(const ParamDecl& decl, uint64_t seed, std::span<float> out) {
  if (out.size() != decl.spec.numel())
    return InvalidArgument("InitParam " + decl.spec.name + ": buffer of " +
                           std::to_string(out.size()) + " elements, parameter has " +
                           std::to_string(decl.spec.numel()));
  return InitParam(decl, seed, 0, out);
}

uint64_t CountParams(const ModelConfig& c) {
  const uint64_t D = c.d_model, F = c.d_ff, V = c.vocab, T = c.seq_len, L = c.n_layers;
  const uint64_t block = 4 * D + (3 * D * D + 3 * D) + (D * D + D) + (D * F + F) + (F * D + D);
  return V * D + T * D + L * block + 2 * D + D * V;
}

double TrainFlopsPerToken(const ModelConfig& c) {
  const double D = c.d_model, F = c.d_ff, V = c.vocab, T = c.seq_len, L = c.n_layers;
  const double matmul_params = L * (3 * D * D + D * D + 2 * D * F) + D * V;
  return 6.0 * matmul_params + 6.0 * L * T * D;
}

uint64_t ActivationBytes(const ModelConfig& c, int batch) {
  const uint64_t N = static_cast<uint64_t>(batch) * c.seq_len, D = c.d_model, F = c.d_ff,
                 V = c.vocab, L = c.n_layers, H = c.n_heads, T = c.seq_len;
  const uint64_t per_layer = N * (D /*x*/ + D /*ln1*/ + 3 * D /*qkv*/ + D /*att*/ + D /*mid*/ +
                                  D /*ln2*/ + 2 * F /*h, gelu*/ + 4 /*mean,rstd*/) +
                             static_cast<uint64_t>(batch) * H * T * T;
  const uint64_t head = N * (2 * D + 2 * V + 2);
  // Backward scratch, one group's gradients, transposed activations, GemmTransB's B panel.
  const uint64_t scratch = N * (5 * D + 3 * D + 2 * F) + std::max(D * 3 * D, D * F) +
                           N * std::max({3 * D, F, V}) + 16 * std::max({3 * D, F, V});
  return 4 * (L * per_layer + head + scratch);
}

// ---------------------------------------------------------------------------------------------
// Workspace: activations saved for backward and scratch, sized for the current batch.

struct Model::Workspace {
  int batch = 0;
  std::vector<uint8_t> inputs, targets;  // [N]
  std::vector<std::vector<float>> x;     // [L+1][N*D]: block inputs, final out
  std::vector<std::vector<float>> ln1, mean1, rstd1, qkv, probs, att, mid, ln2, mean2, rstd2, hpre,
      hact;  // per layer
  std::vector<float> lnf, meanf, rstdf, logits, dlogits;
  std::vector<float> dx, dmid, dtmp, dqkv, datt, dh, dact;  // backward scratch
  std::vector<float> trans;                                 // transposed activations
  std::vector<float> grad;                                  // one group's grads

  void Resize(const ModelConfig& c, int b) {
    if (b == batch) return;
    batch = b;
    const size_t N = static_cast<size_t>(b) * c.seq_len, D = c.d_model, F = c.d_ff, V = c.vocab,
                 L = c.n_layers, H = c.n_heads, T = c.seq_len;
    inputs.assign(N, 0);
    targets.assign(N, 0);
    x.assign(L + 1, std::vector<float>(N * D));
    auto per_layer = [&](std::vector<std::vector<float>>& v, size_t n) {
      v.assign(L, std::vector<float>(n));
    };
    per_layer(ln1, N * D);
    per_layer(mean1, N);
    per_layer(rstd1, N);
    per_layer(qkv, N * 3 * D);
    per_layer(probs, static_cast<size_t>(b) * H * T * T);
    per_layer(att, N * D);
    per_layer(mid, N * D);
    per_layer(ln2, N * D);
    per_layer(mean2, N);
    per_layer(rstd2, N);
    per_layer(hpre, N * F);
    per_layer(hact, N * F);
    lnf.assign(N * D, 0);
    meanf.assign(N, 0);
    rstdf.assign(N, 0);
    logits.assign(N * V, 0);
    dlogits.assign(N * V, 0);
    dx.assign(N * D, 0);
    dmid.assign(N * D, 0);
    dtmp.assign(N * D, 0);
    dqkv.assign(N * 3 * D, 0);
    datt.assign(N * D, 0);
    dh.assign(N * F, 0);
    dact.assign(N * F, 0);
    trans.assign(N * std::max({3 * D, F, V, D}), 0);
    const size_t block = 4 * D + 3 * D * D + 3 * D + D * D + D + 2 * D * F + F + D;
    grad.assign(std::max({block, V * D + T * D, 2 * D + D * V}), 0);
  }
};

Model::Model(const ModelConfig& config)
    : config_(config), decls_(Specs(config)), ws_(std::make_unique<Workspace>()) {
  groups_.push_back({kTokEmb, kPosEmb});
  for (int l = 0; l < config.n_layers; ++l) {
    std::vector<uint32_t> g;
    for (uint32_t s = 0; s < kBlockParams; ++s) g.push_back(BlockId(l, s));
    groups_.push_back(std::move(g));
  }
  const uint32_t head = kFirstBlock + static_cast<uint32_t>(config.n_layers) * kBlockParams;
  groups_.push_back({head, head + 1, head + 2});
}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::Create(const ModelConfig& config) {
  ZPS_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<Model>(new Model(config));
}

namespace {

// Acquire with length checks: a view of the wrong length is a broken ParamAccess.
Result<std::vector<std::span<const float>>> AcquireChecked(ParamAccess& access,
                                                           const std::vector<ParamDecl>& decls,
                                                           std::span<const uint32_t> ids) {
  ZPS_ASSIGN_OR_RETURN(auto views, access.Acquire(ids));
  if (views.size() != ids.size()) {
    access.Release(ids);
    return Internal("ParamAccess::Acquire returned " + std::to_string(views.size()) +
                    " views for " + std::to_string(ids.size()) + " ids");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (views[i].size() != decls[ids[i]].spec.numel()) {
      access.Release(ids);
      return Internal("ParamAccess::Acquire: view of " + decls[ids[i]].spec.name + " has " +
                      std::to_string(views[i].size()) + " elements, expected " +
                      std::to_string(decls[ids[i]].spec.numel()));
    }
  }
  return views;
}

Status CheckTokens(const ModelConfig& c, std::span<const uint8_t> tokens, int batch) {
  if (batch < 1 || static_cast<int64_t>(batch) * c.seq_len > (1 << 24))
    return InvalidArgument("batch must be >= 1 with batch x seq_len <= 2^24");
  const size_t want = static_cast<size_t>(batch) * (static_cast<size_t>(c.seq_len) + 1);
  if (tokens.size() != want)
    return InvalidArgument("token buffer has " + std::to_string(tokens.size()) +
                           " bytes, expected batch x (seq_len + 1) = " + std::to_string(want));
  return Status::Ok();
}

}  // namespace

Status Model::Forward(std::span<const uint8_t> tokens, int batch, ParamAccess& access, bool train,
                      double* loss, float loss_scale) {
  const ModelConfig& c = config_;
  Workspace& w = *ws_;
  w.Resize(c, batch);
  const int T = c.seq_len, D = c.d_model, F = c.d_ff, V = c.vocab, H = c.n_heads, L = c.n_layers,
            N = batch * T;
  for (int b = 0; b < batch; ++b) {
    const uint8_t* row = tokens.data() + static_cast<size_t>(b) * (T + 1);
    std::memcpy(&w.inputs[static_cast<size_t>(b) * T], row, static_cast<size_t>(T));
    std::memcpy(&w.targets[static_cast<size_t>(b) * T], row + 1, static_cast<size_t>(T));
  }

  {  // Embeddings.
    const auto& ids = groups_.front();
    ZPS_ASSIGN_OR_RETURN(auto p, AcquireChecked(access, decls_, ids));
    Held held(access, ids);
    float* x0 = w.x[0].data();
    for (int n = 0; n < N; ++n) {
      const float* te = p[0].data() + static_cast<size_t>(w.inputs[n]) * D;
      const float* pe = p[1].data() + static_cast<size_t>(n % T) * D;
      float* o = x0 + static_cast<size_t>(n) * D;
      for (int d = 0; d < D; ++d) o[d] = te[d] + pe[d];
    }
  }

  for (int l = 0; l < L; ++l) {
    const auto& ids = groups_[static_cast<size_t>(l) + 1];
    ZPS_ASSIGN_OR_RETURN(auto p, AcquireChecked(access, decls_, ids));
    Held held(access, ids);
    const float* x = w.x[l].data();
    kernels::LayerNormForward(x, p[kLn1G].data(), p[kLn1B].data(), w.ln1[l].data(),
                              w.mean1[l].data(), w.rstd1[l].data(), N, D);
    kernels::Gemm(w.ln1[l].data(), p[kWqkv].data(), p[kBqkv].data(), w.qkv[l].data(), N, D, 3 * D,
                  false);
    kernels::AttentionForward(w.qkv[l].data(), w.probs[l].data(), w.att[l].data(), batch, T, D, H);
    float* mid = w.mid[l].data();
    std::memcpy(mid, x, sizeof(float) * static_cast<size_t>(N) * D);
    kernels::Gemm(w.att[l].data(), p[kWo].data(), nullptr, w.dtmp.data(), N, D, D, false);
    for (size_t i = 0; i < static_cast<size_t>(N) * D; ++i)
      mid[i] += w.dtmp[i] + p[kBo][i % static_cast<size_t>(D)];
    kernels::LayerNormForward(mid, p[kLn2G].data(), p[kLn2B].data(), w.ln2[l].data(),
                              w.mean2[l].data(), w.rstd2[l].data(), N, D);
    kernels::Gemm(w.ln2[l].data(), p[kW1].data(), p[kB1].data(), w.hpre[l].data(), N, D, F, false);
    kernels::GeluForward(w.hpre[l].data(), w.hact[l].data(), static_cast<int64_t>(N) * F);
    kernels::Gemm(w.hact[l].data(), p[kW2].data(), p[kB2].data(), w.dtmp.data(), N, F, D, false);
    float* out = w.x[static_cast<size_t>(l) + 1].data();
    for (size_t i = 0; i < static_cast<size_t>(N) * D; ++i) out[i] = mid[i] + w.dtmp[i];
  }

  // Head: stays acquired through its backward (train) so it is fetched once.
  const auto& head_ids = groups_.back();
  ZPS_ASSIGN_OR_RETURN(auto hp, AcquireChecked(access, decls_, head_ids));
  Held held(access, head_ids);
  kernels::LayerNormForward(w.x[L].data(), hp[0].data(), hp[1].data(), w.lnf.data(), w.meanf.data(),
                            w.rstdf.data(), N, D);
  kernels::Gemm(w.lnf.data(), hp[2].data(), nullptr, w.logits.data(), N, D, V, false);
  const float grad_scale = loss_scale / static_cast<float>(N);
  *loss = kernels::CrossEntropy(w.logits.data(), w.targets.data(),
                                train ? w.dlogits.data() : nullptr, grad_scale, N, V);
  if (!train) return Status::Ok();

  // Head backward. Grad buffer: [lnf.g | lnf.b | lm_head].
  float* g_lnfg = w.grad.data();
  float* g_lnfb = g_lnfg + D;
  float* g_lm = g_lnfb + D;
  std::fill(g_lnfg, g_lnfg + 2 * D, 0.0f);
  kernels::Transpose(w.lnf.data(), w.trans.data(), N, D);
  kernels::Gemm(w.trans.data(), w.dlogits.data(), nullptr, g_lm, D, N, V, false);
  kernels::GemmTransB(w.dlogits.data(), hp[2].data(), w.dtmp.data(), N, V, D);
  kernels::LayerNormBackward(w.dtmp.data(), w.x[L].data(), w.meanf.data(), w.rstdf.data(),
                             hp[0].data(), w.dx.data(), g_lnfg, g_lnfb, N, D);
  ZPS_RETURN_IF_ERROR(access.PushGrad(head_ids[0], {g_lnfg, static_cast<size_t>(D)}));
  ZPS_RETURN_IF_ERROR(access.PushGrad(head_ids[1], {g_lnfb, static_cast<size_t>(D)}));
  ZPS_RETURN_IF_ERROR(
      access.PushGrad(head_ids[2], {g_lm, static_cast<size_t>(D) * static_cast<size_t>(V)}));
  held.Done();

  // Blocks in reverse. w.dx holds dL/dx_{l+1} on entry and dL/dx_l on exit.
  for (int l = L - 1; l >= 0; --l) {
    const auto& ids = groups_[static_cast<size_t>(l) + 1];
    ZPS_ASSIGN_OR_RETURN(auto p, AcquireChecked(access, decls_, ids));
    Held block_held(access, ids);
    // Grad slots, laid out back to back in id order.
    float* gslot[kBlockParams];
    {
      float* cur = w.grad.data();
      for (uint32_t s = 0; s < kBlockParams; ++s) {
        gslot[s] = cur;
        cur += decls_[ids[s]].spec.numel();
      }
      std::fill(w.grad.data(), cur, 0.0f);
    }
    const size_t ND = static_cast<size_t>(N) * D;
    // MLP: out = mid + hact·W2 + b2.
    kernels::ColumnSum(w.dx.data(), gslot[kB2], N, D, false);
    kernels::Transpose(w.hact[l].data(), w.trans.data(), N, F);
    kernels::Gemm(w.trans.data(), w.dx.data(), nullptr, gslot[kW2], F, N, D, false);
    kernels::GemmTransB(w.dx.data(), p[kW2].data(), w.dact.data(), N, D, F);
    kernels::GeluBackward(w.hpre[l].data(), w.dact.data(), w.dh.data(),
                          static_cast<int64_t>(N) * F);
    kernels::ColumnSum(w.dh.data(), gslot[kB1], N, F, false);
    kernels::Transpose(w.ln2[l].data(), w.trans.data(), N, D);
    kernels::Gemm(w.trans.data(), w.dh.data(), nullptr, gslot[kW1], D, N, F, false);
    kernels::GemmTransB(w.dh.data(), p[kW1].data(), w.dtmp.data(), N, F, D);
    kernels::LayerNormBackward(w.dtmp.data(), w.mid[l].data(), w.mean2[l].data(), w.rstd2[l].data(),
                               p[kLn2G].data(), w.dmid.data(), gslot[kLn2G], gslot[kLn2B], N, D);
    for (size_t i = 0; i < ND; ++i) w.dmid[i] += w.dx[i];
    // Attention: mid = x + att·Wo + bo.
    kernels::ColumnSum(w.dmid.data(), gslot[kBo], N, D, false);
    kernels::Transpose(w.att[l].data(), w.trans.data(), N, D);
    kernels::Gemm(w.trans.data(), w.dmid.data(), nullptr, gslot[kWo], D, N, D, false);
    kernels::GemmTransB(w.dmid.data(), p[kWo].data(), w.datt.data(), N, D, D);
    kernels::AttentionBackward(w.qkv[l].data(), w.probs[l].data(), w.datt.data(), w.dqkv.data(),
                               batch, T, D, H);
    kernels::ColumnSum(w.dqkv.data(), gslot[kBqkv], N, 3 * D, false);
    kernels::Transpose(w.ln1[l].data(), w.trans.data(), N, D);
    kernels::Gemm(w.trans.data(), w.dqkv.data(), nullptr, gslot[kWqkv], D, N, 3 * D, false);
    kernels::GemmTransB(w.dqkv.data(), p[kWqkv].data(), w.dtmp.data(), N, 3 * D, D);
    kernels::LayerNormBackward(w.dtmp.data(), w.x[l].data(), w.mean1[l].data(), w.rstd1[l].data(),
                               p[kLn1G].data(), w.dx.data(), gslot[kLn1G], gslot[kLn1B], N, D);
    for (size_t i = 0; i < ND; ++i) w.dx[i] += w.dmid[i];
    for (uint32_t s = 0; s < kBlockParams; ++s)
      ZPS_RETURN_IF_ERROR(access.PushGrad(ids[s], {gslot[s], decls_[ids[s]].spec.numel()}));
  }

  // Embeddings: no parameter values needed, so nothing is acquired.
  float* g_tok = w.grad.data();
  float* g_pos = g_tok + static_cast<size_t>(V) * D;
  std::fill(g_tok, g_pos + static_cast<size_t>(T) * D, 0.0f);
  for (int n = 0; n < N; ++n) {
    const float* d = w.dx.data() + static_cast<size_t>(n) * D;
    float* gt = g_tok + static_cast<size_t>(w.inputs[n]) * D;
    float* gp = g_pos + static_cast<size_t>(n % T) * D;
    for (int k = 0; k < D; ++k) gt[k] += d[k];
    for (int k = 0; k < D; ++k) gp[k] += d[k];
  }
  ZPS_RETURN_IF_ERROR(access.PushGrad(kTokEmb, {g_tok, static_cast<size_t>(V) * D}));
  ZPS_RETURN_IF_ERROR(access.PushGrad(kPosEmb, {g_pos, static_cast<size_t>(T) * D}));
  return Status::Ok();
}

Result<StepOutput> Model::TrainStep(std::span<const uint8_t> tokens, int batch, float loss_scale,
                                    ParamAccess& access) {
  ZPS_RETURN_IF_ERROR(CheckTokens(config_, tokens, batch));
  if (!std::isfinite(loss_scale) || loss_scale <= 0.0f)
    return InvalidArgument("loss_scale must be finite and > 0");
  StepOutput out;
  ZPS_RETURN_IF_ERROR(Forward(tokens, batch, access, true, &out.loss, loss_scale));
  out.tokens = static_cast<int64_t>(batch) * config_.seq_len;
  return out;
}

Result<double> Model::Evaluate(std::span<const uint8_t> tokens, int batch, ParamAccess& access) {
  ZPS_RETURN_IF_ERROR(CheckTokens(config_, tokens, batch));
  double loss = 0.0;
  ZPS_RETURN_IF_ERROR(Forward(tokens, batch, access, false, &loss, 1.0f));
  return loss;
}

}  // namespace zps::train
