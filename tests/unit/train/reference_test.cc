// ReferenceTrainer: determinism, learning on the real corpus, fp16 overflow skip, clipping.
#include "zps/train/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "zps/common/block_quant.h"
#include "zps/testing/status_matchers.h"
#include "zps/train/data.h"

namespace zps::train {
namespace {

ModelConfig TinyModel() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = 64;
  c.seq_len = 32;
  c.seed = 7;
  return c;
}

ReferenceOptions SmallChunks(int world) {
  ReferenceOptions o;
  o.layout.chunk_elems = 4096;  // many chunks, parameters spanning chunk boundaries
  o.layout.align_elems = 64;
  o.layout.num_shards = 2;
  o.world = world;
  o.optimizer.lr = 3e-3f;
  o.commit.grad_divisor = world;
  return o;
}

struct Run {
  std::unique_ptr<ReferenceTrainer> trainer;
  std::unique_ptr<DataLoader> loader;
  int batch;
  std::vector<ReferenceStepResult> results;

  Status Steps(int n) {
    const int world = loader->options().world;
    std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(world),
                                           std::vector<uint8_t>(loader->batch_bytes()));
    for (int i = 0; i < n; ++i) {
      std::vector<std::span<const uint8_t>> spans;
      for (int r = 0; r < world; ++r) {
        ZPS_RETURN_IF_ERROR(loader->BatchForRank(trainer->step(), r, bufs[static_cast<size_t>(r)]));
        spans.emplace_back(bufs[static_cast<size_t>(r)]);
      }
      ZPS_ASSIGN_OR_RETURN(auto res, trainer->Step(spans, batch));
      results.push_back(std::move(res));
    }
    return Status::Ok();
  }
};

const std::string& Corpus() {
  static const std::string corpus = LoadCorpus("").value();
  return corpus;
}

Run MakeRun(const ModelConfig& mc, const ReferenceOptions& o, int batch) {
  Run run;
  run.trainer = std::move(ReferenceTrainer::Create(mc, o, nullptr).value());
  DataOptions d;
  d.seq_len = mc.seq_len;
  d.batch = batch;
  d.world = o.world;
  d.seed = 5;
  run.loader = std::move(DataLoader::Create(Corpus(), d).value());
  run.batch = batch;
  return run;
}

bool SameState(const ReferenceTrainer& a, const ReferenceTrainer& b) {
  auto eq = [](auto x, auto y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size_bytes()) == 0;
  };
  return eq(a.master(), b.master()) && eq(a.m(), b.m()) && eq(a.v(), b.v()) &&
         eq(a.serving(), b.serving()) && eq(a.quantized_serving(), b.quantized_serving());
}

TEST(ReferenceTest, InitialStateFromSeededInit) {
  auto run = MakeRun(TinyModel(), SmallChunks(1), 2);
  const auto& t = *run.trainer;
  EXPECT_GT(t.layout().num_chunks(), 5u);
  const auto& decls = run.trainer->model().decls();
  for (uint32_t id = 0; id < decls.size(); ++id) {
    std::vector<float> want(decls[id].spec.numel());
    ASSERT_THAT(InitParam(decls[id], TinyModel().seed, want), IsOk());
    auto got = t.ParamMaster(id);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(0, std::memcmp(want.data(), got->data(), want.size() * sizeof(float)));
    const uint64_t off = t.layout().param_offset(id);
    EXPECT_EQ(t.serving()[off], FloatToBf16(want[0]));
  }
}

TEST(ReferenceTest, DeterministicTwoRuns) {
  auto a = MakeRun(TinyModel(), SmallChunks(2), 2);
  auto b = MakeRun(TinyModel(), SmallChunks(2), 2);
  ASSERT_THAT(a.Steps(3), IsOk());
  ASSERT_THAT(b.Steps(3), IsOk());
  EXPECT_TRUE(SameState(*a.trainer, *b.trainer));
  for (size_t i = 0; i < a.results.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(&a.results[i].loss, &b.results[i].loss, sizeof(double)));
    EXPECT_EQ(a.results[i].decision.grad_scale, b.results[i].decision.grad_scale);
  }
  // A thread pool changes nothing.
  auto pool = ThreadPool::Create({.name = "t", .threads = 2}).value();
  auto c = MakeRun(TinyModel(), SmallChunks(2), 2);
  c.trainer = std::move(ReferenceTrainer::Create(TinyModel(), SmallChunks(2), pool.get()).value());
  ASSERT_THAT(c.Steps(3), IsOk());
  EXPECT_TRUE(SameState(*a.trainer, *c.trainer));
}

TEST(ReferenceTest, LossFallsOnCorpus) {
  ModelConfig mc = TinyModel();
  auto o = SmallChunks(2);
  o.optimizer.lr = 1e-2f;
  o.commit.max_grad_norm = 1.0;
  auto run = MakeRun(mc, o, 4);
  std::vector<uint8_t> eval(static_cast<size_t>(8) * (mc.seq_len + 1));
  ASSERT_THAT(run.loader->EvalBatch(0, 8, eval), IsOk());
  const double before = run.trainer->Evaluate(eval, 8).value();
  EXPECT_NEAR(before, std::log(256.0), 0.1);
  ASSERT_THAT(run.Steps(30), IsOk());
  const double after = run.trainer->Evaluate(eval, 8).value();
  EXPECT_LT(after, 0.7 * before) << "eval loss " << before << " -> " << after;
  EXPECT_LT(run.results.back().loss, 0.7 * run.results.front().loss);
  EXPECT_EQ(run.trainer->optimizer_step(), 30);
}

TEST(ReferenceTest, Fp16LossScalingForcedOverflowSkips) {
  auto o = SmallChunks(2);
  o.serving_dtype = DType::kF16;
  o.grad_dtype = DType::kF16;
  o.commit.dynamic_loss_scale = true;
  o.commit.initial_loss_scale = 1024.0;
  o.commit.scale_window = 2;
  o.inject_overflow_step = 3;
  auto run = MakeRun(TinyModel(), o, 2);
  ASSERT_THAT(run.Steps(3), IsOk());
  EXPECT_EQ(run.trainer->optimizer_step(), 3);
  EXPECT_EQ(run.trainer->loss_scale(), 2048.0);  // grew once after 2 good steps
  std::vector<float> master(run.trainer->master().begin(), run.trainer->master().end());
  std::vector<uint16_t> serving(run.trainer->serving().begin(), run.trainer->serving().end());
  ASSERT_THAT(run.Steps(1), IsOk());  // the overflow step
  const auto& d = run.results.back().decision;
  EXPECT_TRUE(d.skip);
  EXPECT_EQ(d.loss_scale, 2048.0);
  EXPECT_EQ(d.next_loss_scale, 1024.0);
  EXPECT_EQ(run.trainer->optimizer_step(), 3);
  EXPECT_EQ(
      0, std::memcmp(master.data(), run.trainer->master().data(), master.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(serving.data(), run.trainer->serving().data(),
                           serving.size() * sizeof(uint16_t)));
  ASSERT_THAT(run.Steps(2), IsOk());
  EXPECT_FALSE(run.results.back().decision.skip);
  EXPECT_EQ(run.trainer->optimizer_step(), 5);
  EXPECT_TRUE(std::isfinite(run.results.back().loss));
}

TEST(ReferenceTest, ClippingScalesTheUpdate) {
  auto o = SmallChunks(2);
  o.commit.max_grad_norm = 1e-3;
  auto run = MakeRun(TinyModel(), o, 2);
  ASSERT_THAT(run.Steps(2), IsOk());
  for (const auto& r : run.results) {
    ASSERT_FALSE(r.decision.skip);
    EXPECT_GT(r.decision.global_norm, 1e-3);
    EXPECT_NEAR(r.decision.grad_scale * r.decision.global_norm * 2.0, 1e-3, 1e-6);
  }
}

// fp32 serving: the model reads the masters' exact values; the copy is the master bit for bit.
TEST(ReferenceTest, Fp32ServingCopyIsTheMaster) {
  auto o = SmallChunks(2);
  o.serving_dtype = DType::kF32;
  auto run = MakeRun(TinyModel(), o, 2);
  ASSERT_THAT(run.Steps(3), IsOk());
  EXPECT_EQ(run.trainer->optimizer_step(), 3);
  ASSERT_EQ(run.trainer->serving().size(), run.trainer->master().size() * 2);
  EXPECT_EQ(0, std::memcmp(run.trainer->serving().data(), run.trainer->master().data(),
                           run.trainer->master().size() * sizeof(float)));
  EXPECT_TRUE(std::isfinite(run.results.back().loss));
}

// Quantized weights (issue 27, item 1): the serving copy is the int8 blocks of each chunk's
// master, parameters are read from their pieces' covering blocks (pieces start anywhere in a
// block: chunk_elems 4096, align_elems 64, block 256), and the run is deterministic.
TEST(ReferenceTest, QuantizedWeightsServeTheMasterBlocks) {
  auto o = SmallChunks(2);
  o.quantized_weights_block = kWeightQuantBlock;
  auto a = MakeRun(TinyModel(), o, 2);
  auto b = MakeRun(TinyModel(), o, 2);
  ASSERT_THAT(a.Steps(3), IsOk());
  ASSERT_THAT(b.Steps(3), IsOk());
  EXPECT_TRUE(SameState(*a.trainer, *b.trainer));
  for (size_t i = 0; i < a.results.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(&a.results[i].loss, &b.results[i].loss, sizeof(double)));
  }
  const ReferenceTrainer& t = *a.trainer;
  EXPECT_TRUE(t.serving().empty());
  const QuantFormat f{8, kWeightQuantBlock};
  const uint64_t ce = t.layout().options().chunk_elems;
  ASSERT_EQ(t.quantized_serving().size(), t.layout().num_chunks() * QuantizedBytes(f, ce));
  for (uint32_t c = 0; c < t.layout().num_chunks(); ++c) {
    const uint64_t n = t.layout().chunk_size(c);
    std::vector<std::byte> want(QuantizedBytes(f, n));
    QuantizeBlocks(f, t.master().subspan(c * ce, n), want);
    ASSERT_EQ(0, std::memcmp(want.data(), t.quantized_serving().data() + c * QuantizedBytes(f, ce),
                             want.size()))
        << "chunk " << c;
  }
}

// Read through the int8 copy, the model is the same model: its held-out loss is within 2% of
// the bf16 copy's at the start and after training, and training still lowers it.
TEST(ReferenceTest, QuantizedWeightsTrainCloseToBf16) {
  ModelConfig mc = TinyModel();
  auto o = SmallChunks(2);
  o.optimizer.lr = 1e-2f;
  o.commit.max_grad_norm = 1.0;
  auto bf16 = MakeRun(mc, o, 4);
  o.quantized_weights_block = kWeightQuantBlock;
  auto q = MakeRun(mc, o, 4);
  std::vector<uint8_t> eval(static_cast<size_t>(8) * (mc.seq_len + 1));
  ASSERT_THAT(q.loader->EvalBatch(0, 8, eval), IsOk());
  const double q0 = q.trainer->Evaluate(eval, 8).value();
  const double b0 = bf16.trainer->Evaluate(eval, 8).value();
  EXPECT_NEAR(q0, b0, 0.02 * b0);
  ASSERT_THAT(q.Steps(30), IsOk());
  ASSERT_THAT(bf16.Steps(30), IsOk());
  const double q1 = q.trainer->Evaluate(eval, 8).value();
  const double b1 = bf16.trainer->Evaluate(eval, 8).value();
  EXPECT_LT(q1, 0.7 * q0);
  EXPECT_NEAR(q1, b1, 0.02 * b1) << "int8 " << q1 << " bf16 " << b1;
}

TEST(ReferenceTest, BadInput) {
  auto o = SmallChunks(2);
  o.serving_dtype = static_cast<DType>(7);  // fp32 serving is supported now; no such dtype is
  EXPECT_EQ(ReferenceTrainer::Create(TinyModel(), o, nullptr).status().code(),
            Code::kInvalidArgument);
  o = SmallChunks(2);
  o.quantized_weights_block = 100;  // not a multiple of 64
  EXPECT_EQ(ReferenceTrainer::Create(TinyModel(), o, nullptr).status().code(),
            Code::kInvalidArgument);
  auto run = MakeRun(TinyModel(), SmallChunks(2), 2);
  std::vector<uint8_t> buf(run.loader->batch_bytes());
  std::vector<std::span<const uint8_t>> one = {buf};
  EXPECT_EQ(run.trainer->Step(one, 2).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(run.trainer->step(), 0);
}

}  // namespace
}  // namespace zps::train
