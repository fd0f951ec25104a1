// zps-plan's arithmetic (tools/include/zps/tools/plan.h) against cases computed by hand; each
// comment shows the sum.
#include "zps/tools/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps::plan {
namespace {

using ::testing::HasSubstr;

// The value of an OK Result, or the test's failure (value() asserts that it holds one).
template <typename T>
T Value(const Result<T>& r) {
  EXPECT_THAT(r, IsOk());
  return r.ok() ? *r : T{};
}

// The testbed's shape: 4 workers on their own hosts, 2 shards on theirs, 1 Gbit/s, 1M
// parameters (2 MB of bf16: the whole model fits in the 1 GiB live window, one fetch a step).
PlanInput Testbed() {
  PlanInput in;
  in.params = 1e6;
  in.nodes = 4;
  in.gpus_per_node = 1;
  in.shards = 2;
  in.colocated = false;
  in.link_gbps = 1;
  in.link_efficiency = 1;
  in.optimizer_rate = 1e8;
  in.compute_s = 0.1;
  return in;
}

TEST(PlanFormats, ElementAndStateBytes) {
  EXPECT_EQ(ElementBytes(Format::kFp32, 2048), 4);
  EXPECT_EQ(ElementBytes(Format::kBf16, 2048), 2);
  EXPECT_EQ(ElementBytes(Format::kFp16, 2048), 2);
  EXPECT_DOUBLE_EQ(ElementBytes(Format::kInt8, 2048), 1 + 4.0 / 2048);
  EXPECT_DOUBLE_EQ(ElementBytes(Format::kInt4, 1024), 0.5 + 4.0 / 1024);
  // master 4 + m + v + serving copy
  EXPECT_EQ(Value(StateBytesPerParam(Format::kFp32, Format::kBf16, 2048)), 14.0);
  EXPECT_EQ(Value(StateBytesPerParam(Format::kBf16, Format::kBf16, 2048)), 10.0);
  EXPECT_EQ(Value(StateBytesPerParam(Format::kInt8, Format::kBf16, 2048)), 8.0);
  EXPECT_EQ(Value(StateBytesPerParam(Format::kFp32, Format::kFp32, 2048)), 16.0);
  EXPECT_THAT(StateBytesPerParam(Format::kInt4, Format::kBf16, 2048),
              StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(Value(ParseFormat("bfloat16")), Format::kBf16);
  EXPECT_EQ(Value(ParseFormat("int4")), Format::kInt4);
  EXPECT_THAT(ParseFormat("int3"), StatusIs(Code::kInvalidArgument, HasSubstr("int3")));
}

TEST(Plan, ServerSumOnSeparateHosts) {
  Plan p = Value(MakePlan(Testbed()));
  EXPECT_EQ(p.workers, 4);
  EXPECT_EQ(p.fetch_passes, 1);
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 4e6);  // 1e6 x fp32
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 2e6);   // 1e6 x bf16, once
  EXPECT_DOUBLE_EQ(p.worker_host.out, 4e6);
  EXPECT_DOUBLE_EQ(p.shard_in, 8e6);   // 4 workers x 0.5e6 x 4 B
  EXPECT_DOUBLE_EQ(p.shard_out, 4e6);  // 4 workers x 0.5e6 x 2 B
  EXPECT_DOUBLE_EQ(p.shard_host.in, 8e6);
  EXPECT_DOUBLE_EQ(p.t_network, 0.064);        // 8e6 B / 125e6 B/s
  EXPECT_DOUBLE_EQ(p.shard_state_bytes, 7e6);  // 0.5e6 x 14
  EXPECT_DOUBLE_EQ(p.shard_grad_bytes, 8e6);   // 0.5e6 x 4 slots x 4 B
  EXPECT_DOUBLE_EQ(p.shard_ram_bytes, 15e6);   // 6e6 + 1e6 serving + 8e6
  EXPECT_DOUBLE_EQ(p.shard_nvme_bytes, 0);
  EXPECT_DOUBLE_EQ(p.t_optimizer, 0.005);  // 0.5e6 / 1e8
  // Forward: the shards serve 4e6 B (the workers take 2e6 each); backward: they take 8e6 B.
  EXPECT_DOUBLE_EQ(p.t_network_forward, 0.032);   // 4e6 B / 125e6 B/s
  EXPECT_DOUBLE_EQ(p.t_network_backward, 0.064);  // 8e6 B / 125e6 B/s
  EXPECT_DOUBLE_EQ(p.t_lower, 0.105);             // max(0.064, 0.1) + 0.005
  EXPECT_DOUBLE_EQ(p.t_expected, 0.105);          // max(0.032, 0.1/3) + max(0.064, 0.2/3) + 0.005
  EXPECT_DOUBLE_EQ(p.t_upper, 0.201);             // 0.032 + 0.064 + 0.1 + 0.005
  EXPECT_DOUBLE_EQ(p.worker_residual_bytes, 0);
}

// Where the link sets the step, a shard's fetches and pushes follow each other: the expected
// step is their sum, above the lower bound's busiest direction (the testbed at 100 Mbit/s).
TEST(Plan, NetworkBoundPhasesAddUp) {
  PlanInput in = Testbed();
  in.link_gbps = 0.1;  // 12.5e6 B/s
  in.grad = Format::kBf16;
  Plan p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.shard_out, 4e6);            // 4 workers x 0.5e6 x 2 B
  EXPECT_DOUBLE_EQ(p.shard_in, 4e6);             // the same in bf16
  EXPECT_DOUBLE_EQ(p.t_network, 0.32);           // 4e6 B / 12.5e6 B/s, either way
  EXPECT_DOUBLE_EQ(p.t_network_forward, 0.32);   // the fetches
  EXPECT_DOUBLE_EQ(p.t_network_backward, 0.32);  // the pushes
  EXPECT_DOUBLE_EQ(p.t_lower, 0.325);            // max(0.32, 0.1) + 0.005
  EXPECT_NEAR(p.t_expected, 0.645, 1e-12);       // 0.32 + 0.32 + 0.005
  EXPECT_NEAR(p.t_upper, 0.745, 1e-12);          // 0.32 + 0.32 + 0.1 + 0.005
  // Half the compute: the expected step does not move, the network hides it.
  in.compute_s = 0.05;
  EXPECT_NEAR(Value(MakePlan(in)).t_expected, 0.645, 1e-12);
}

TEST(Plan, PreReducedBf16Gradients) {
  PlanInput in = Testbed();
  in.pre_reduced = true;
  in.grad = Format::kBf16;
  Plan p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 3.5e6);    // 3/4 x 1e6 x 4 B reduce-scatter + 0.25e6 x 2 B
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 5e6);       // 2e6 fetched + 3e6 reduce-scatter
  EXPECT_DOUBLE_EQ(p.shard_in, 1e6);             // 0.5e6 x 2 B, once
  EXPECT_DOUBLE_EQ(p.shard_grad_bytes, 3e6);     // 0.5e6 x (1 slot x 2 B + 4 B fp32 sum)
  EXPECT_DOUBLE_EQ(p.worker_bucket_bytes, 5e6);  // min(16 MiB, 4e6) + 1/4 of it
  EXPECT_DOUBLE_EQ(p.t_network, 0.04);           // the workers' 5e6 in, at 125e6 B/s
}

// Gloo's halving-doubling reduce-scatter of 4 ranks: rank 1 sends 1/2 (to rank 0) and 1/4 (to
// rank 3) in the halving steps, then the slice it holds, rank 2's (1 reversed in 2 bits), 1/4:
// the whole buffer. A ring edge carries 3/4 of it.
TEST(Plan, GlooReduceScatterSendsMoreThanARing) {
  EXPECT_DOUBLE_EQ(ReduceScatterHostBytes(4e6, 4, 1, false), 3e6);
  EXPECT_DOUBLE_EQ(ReduceScatterHostBytes(4e6, 4, 1, true), 4e6);
  // Two hosts of two ranks: the first step (rank ^ 1) stays on the host; 1/4 leaves it per rank
  // in the second, and rank 1's slice goes to rank 2 on the other host: 2 x 1e6 + 1e6.
  EXPECT_DOUBLE_EQ(ReduceScatterHostBytes(4e6, 4, 2, true), 3e6);
  // 8 ranks, one a host: 7/8 in the halving steps and, for rank 1 (reversed: 4), 1/8 more.
  EXPECT_DOUBLE_EQ(ReduceScatterHostBytes(8e6, 8, 1, true), 8e6);
  // Two ranks: rank 1 holds its own slice after the one step.
  EXPECT_DOUBLE_EQ(ReduceScatterHostBytes(4e6, 2, 1, true), 2e6);
  // One host: nothing leaves it.
  EXPECT_DOUBLE_EQ(ReduceScatterHostBytes(4e6, 8, 8, true), 0);
  // 2^30 ranks (the planner's most): not walked, bounded by the whole buffer.
  EXPECT_DOUBLE_EQ(ReduceScatterHostBytes(4e6, 1 << 30, 1, true), 4e6);

  PlanInput in = Testbed();
  in.pre_reduced = true;
  in.grad = Format::kBf16;
  in.gloo_collectives = true;
  Plan p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 4.5e6);     // 1e6 x 4 B reduce-scatter + 0.25e6 x 2 B
  EXPECT_DOUBLE_EQ(p.worker_host.in, 6e6);        // 2e6 fetched + 4e6 reduce-scatter
  EXPECT_DOUBLE_EQ(p.t_network_backward, 0.036);  // 4.5e6 B out at 125e6 B/s
  EXPECT_DOUBLE_EQ(p.t_scatter, 0.032);           // 4e6 B at 125e6 B/s
  // The forward: max(0.032 served by a shard, 0.1 / 3); the backward's compute 0.2 / 3 hides
  // its network, unless the reduce-scatter runs after it.
  EXPECT_NEAR(p.t_expected, 0.1 / 3 + 0.2 / 3 + 0.005, 1e-12);
  in.serial_collectives = true;
  EXPECT_NEAR(Value(MakePlan(in)).t_expected, 0.1 / 3 + (0.2 / 3 + 0.032) + 0.005, 1e-12);
}

TEST(Plan, BandwidthCentricFetches) {
  PlanInput in = Testbed();
  in.bandwidth_centric = true;
  Plan p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 2e6);     // 0.25e6 x 2 B + 3/4 x 2e6 all-gathered
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 5.5e6);  // 4e6 pushed + 1.5e6 all-gather
  EXPECT_DOUBLE_EQ(p.shard_out, 1e6);          // 0.5e6 x 2 B, once
}

TEST(Plan, ColocatedNodesTwoFetchPasses) {
  PlanInput in;
  in.params = 1e9;  // 2 GB of bf16: over the 1 GiB window, fetched for forward and backward
  in.nodes = 2;
  in.gpus_per_node = 8;
  in.shards = 2;
  in.grad = Format::kBf16;
  in.link_gbps = 100;
  in.link_efficiency = 0.9;
  Plan p = Value(MakePlan(in));
  EXPECT_EQ(p.workers, 16);
  EXPECT_EQ(p.fetch_passes, 2);
  EXPECT_DOUBLE_EQ(p.shard_out, 32e9);  // 16 x 0.5e9 x 2 B x 2 passes
  EXPECT_DOUBLE_EQ(p.shard_in, 16e9);   // 16 x 0.5e9 x 2 B
  // Half of each node's traffic stays on it: 8 x 2e9 / 2 pushed + 32e9 / 2 served.
  EXPECT_DOUBLE_EQ(p.worker_host.out, 24e9);
  EXPECT_DOUBLE_EQ(p.worker_host.in, 24e9);         // 8 x 4e9 / 2 fetched + 16e9 / 2 received
  EXPECT_NEAR(p.t_network, 24e9 / 11.25e9, 1e-12);  // 100 Gbit/s x 0.9 = 11.25e9 B/s
  // Forward: half of each node's fetch-side traffic (16e9 B each way); backward: the other half
  // and the pushes (8e9 B each way).
  EXPECT_NEAR(p.t_network_forward, 8e9 / 11.25e9, 1e-12);
  EXPECT_NEAR(p.t_network_backward, 16e9 / 11.25e9, 1e-12);
  // 16 server-sum slots of bf16 + the fp32 sum slot, over 0.5e9 parameters.
  EXPECT_DOUBLE_EQ(p.shard_grad_bytes, 0.5e9 * (16 * 2 + 4));
}

TEST(Plan, SpillToNvme) {
  PlanInput in;
  in.params = 1e9;
  in.nodes = 1;  // one node: nothing crosses a link
  in.shards = 1;
  in.shard_ram_bytes = 4e9;
  in.optimizer_rate = 1e9;
  EXPECT_THAT(MakePlan(in), StatusIs(Code::kInvalidArgument, HasSubstr("nvme")));
  in.nvme_gbytes_s = 4;
  Plan p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.shard_nvme_bytes, 8e9);              // 1e9 x 12 B - 4e9
  EXPECT_DOUBLE_EQ(p.shard_ram_bytes, 4e9 + 2e9 + 32e9);  // budget + serving + 8 fp32 slots
  EXPECT_DOUBLE_EQ(p.t_network, 0);
  EXPECT_DOUBLE_EQ(p.t_nvme, 4);  // 8e9 read + 8e9 written at 4 GB/s
  EXPECT_DOUBLE_EQ(p.t_optimizer, 1);
  EXPECT_DOUBLE_EQ(p.t_lower, 4);
  EXPECT_DOUBLE_EQ(p.t_upper, 5);
}

TEST(Plan, QuantizedGradientsKeepAResidual) {
  PlanInput in = Testbed();
  in.grad = Format::kInt4;
  in.grad_block = 1000;
  in.weight_block = 1;  // not what a gradient is measured in
  Plan p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.grad_bytes, 0.504);  // 0.5 + 4 / 1000
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 0.504e6);
  EXPECT_DOUBLE_EQ(p.worker_residual_bytes, 4e6);  // fp32 of the whole gradient
  in.pre_reduced = true;
  p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.worker_residual_bytes, 1e6);  // fp32 of its 1/4 slice
}

TEST(Plan, QuantizedWeightsAndGradientsUseTheirOwnBlocks) {
  PlanInput in = Testbed();
  in.fetch = Format::kInt8;
  in.grad = Format::kInt4;
  in.weight_block = 256;
  in.grad_block = 2048;
  Plan p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.fetch_bytes, 1.015625);           // 1 + 4 / 256
  EXPECT_DOUBLE_EQ(p.grad_bytes, 0.501953125);         // 0.5 + 4 / 2048
  EXPECT_DOUBLE_EQ(p.shard_out, 2.03125e6);            // 4 workers x 0.5e6 x 1.015625 B
  EXPECT_DOUBLE_EQ(p.shard_in, 1.00390625e6);          // 4 workers x 0.5e6 x 0.501953125 B
  EXPECT_DOUBLE_EQ(p.state_bytes, 13.015625);          // 4 + 2 x 4 + 1.015625 serving
  EXPECT_DOUBLE_EQ(p.shard_state_bytes, 6.5078125e6);  // 0.5e6 x 13.015625
  EXPECT_DOUBLE_EQ(p.shard_grad_bytes, 3.00390625e6);  // 0.5e6 x (4 x 0.501953125 + 4)
  EXPECT_DOUBLE_EQ(p.t_network, 0.01625);              // the shards' 2.03125e6 B out at 125e6 B/s
}

// An int8 fetch is 1.015625 B on the wire but 4 B in the live window: the worker dequantizes it
// into fp32 (Client::serving_dtype), and the window (zps-train's --max-live-bytes) counts that.
TEST(Plan, QuantizedFetchesFillTheWindowInFp32) {
  PlanInput in = Testbed();
  in.params = 300e6;  // 304.7e6 B of int8 on the wire, 1.2e9 B of fp32 in the window
  in.fetch = Format::kInt8;
  in.grad = Format::kInt4;
  Plan p = Value(MakePlan(in));
  EXPECT_EQ(WindowElementBytes(Format::kInt8), 4);
  EXPECT_EQ(WindowElementBytes(Format::kInt4), 4);
  EXPECT_EQ(WindowElementBytes(Format::kBf16), 2);
  EXPECT_EQ(p.fetch_passes, 2);  // 1.2e9 > 1 GiB = 1,073,741,824: forward, then backward again
  EXPECT_DOUBLE_EQ(p.shard_out, 1.21875e9);       // 4 workers x 150e6 x 1.015625 B x 2 passes
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 609.375e6);  // 300e6 x 1.015625 B x 2 passes
  // The window's 1 GiB and the prefetch's 256 MiB, both full of fp32.
  EXPECT_DOUBLE_EQ(p.worker_window_bytes, 1073741824.0 + 268435456.0);
  // bf16 fetches of the same model: 600e6 B fit the window, one pass.
  in.fetch = Format::kBf16;
  p = Value(MakePlan(in));
  EXPECT_EQ(p.fetch_passes, 1);
  EXPECT_DOUBLE_EQ(p.worker_window_bytes, 600e6 + 268435456.0);
}

// With the model's tensors the quantized bytes are the pieces' own, short blocks and shared
// blocks included. Tensors of 300 and 5,000 elements, chunks of 4,096, aligned to 64: t0 is
// [0, 300) of chunk 0; t1 starts at 320 and is [320, 4096) of chunk 0 (3,776) and [0, 1224) of
// chunk 1, which is 1,224 elements long.
TEST(Plan, QuantizedBytesFromTheTensorsPieces) {
  PlanInput in = Testbed();
  in.params = 0;
  in.tensors = {300, 5000};
  in.chunk_elems = 4096;
  in.align_elems = 64;       // zps.torch's layout
  in.fetch = Format::kInt8;  // blocks of 256: 260 B each (4 B scale + 256 codes)
  in.grad = Format::kInt4;   // blocks of 256: 132 B each (4 B scale + 128 codes)
  Plan p = Value(MakePlan(in));
  // Push, each piece on its own: t0 132 + (4 + 22) = 158; t1 (14 x 132 + 4 + 96) +
  // (4 x 132 + 4 + 100) = 2580.
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 2738);
  // Fetch, the covering blocks: t0 blocks 0-1 = 520; t1 blocks 1-15 of chunk 0 = 15 x 260 (block
  // 1 is fetched again: it holds t0's end and t1's start) and chunk 1's 4 full blocks and its
  // 200-element last one, 4 x 260 + 204.
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 520 + 3900 + 1244);
  EXPECT_DOUBLE_EQ(p.shard_in, 5476);    // 4 workers x 2738 / 2 shards
  EXPECT_DOUBLE_EQ(p.shard_out, 11328);  // 4 workers x 5664 / 2 shards
  // From the parameter count alone: 5,300 x (0.5 + 4 / 256) and 5,300 x (1 + 4 / 256).
  in.tensors.clear();
  in.params = 5300;
  p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 2732.8125);
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 5382.8125);
  // 16-bit formats: the pieces add nothing, the same bytes either way.
  in.tensors = {300, 5000};
  in.params = 5300;  // may be given too, if it is the sum
  in.fetch = in.grad = Format::kBf16;
  p = Value(MakePlan(in));
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 10600);
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 10600);
  in.params = 5301;
  EXPECT_THAT(MakePlan(in), StatusIs(Code::kInvalidArgument, HasSubstr("sum")));
}

// The default alignment with an int8 fetch is zps-train's: each tensor on blocks of its own.
// The same tensors: t0 is [0, 300) of chunk 0; t1 starts at 512 and is [512, 4096) of chunk 0
// (3,584) and [0, 1416) of chunk 1, which is 1,416 elements long.
TEST(Plan, QuantizedFetchAlignsTensorsToTheWeightBlock) {
  PlanInput in = Testbed();
  in.params = 0;
  in.tensors = {300, 5000};
  in.chunk_elems = 4096;
  in.fetch = Format::kInt8;
  in.grad = Format::kInt4;
  Plan p = Value(MakePlan(in));
  // Fetch: t0 blocks 0-1 = 520; t1 blocks 2-15 of chunk 0 = 14 x 260, none shared, and chunk
  // 1's 5 full blocks and its 136-element last one, 5 x 260 + 140.
  EXPECT_DOUBLE_EQ(p.worker_rank.in, 520 + 3640 + 1440);
  // Push: t0 132 + (4 + 22) = 158; t1 14 x 132 + (5 x 132 + 4 + 68) = 2580.
  EXPECT_DOUBLE_EQ(p.worker_rank.out, 2738);
  // An explicit alignment wins.
  in.align_elems = 64;
  EXPECT_DOUBLE_EQ(Value(MakePlan(in)).worker_rank.in, 520 + 3900 + 1244);
}

TEST(PlanFormats, TensorList) {
  EXPECT_EQ(Value(ParseTensorList("[4096, [64, 3], [2, 2, 2]]")),
            (std::vector<uint64_t>{4096, 192, 8}));
  EXPECT_THAT(ParseTensorList("[]"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(ParseTensorList("{\"a\": 1}"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(ParseTensorList("[1, 0]"), StatusIs(Code::kInvalidArgument, HasSubstr("[1]")));
  EXPECT_THAT(ParseTensorList("[[3, -1]]"), StatusIs(Code::kInvalidArgument, HasSubstr("[0]")));
  EXPECT_THAT(ParseTensorList("[1.5]"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(ParseTensorList("[[1048576, 1048576, 2]]"),  // 2^41 elements
              StatusIs(Code::kInvalidArgument, HasSubstr("2^40")));
  // A count the layout cannot hold is refused by the plan, not wrapped around.
  PlanInput in = Testbed();
  in.params = 0;
  in.tensors = {uint64_t{1} << 41};
  EXPECT_THAT(MakePlan(in), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(ParseTensorList("not json"), StatusIs(Code::kInvalidArgument));
}

TEST(Plan, ComputeFromTokens) {
  PlanInput in;
  in.params = 7e9;
  in.tokens_per_gpu = 4096;
  in.gpu_tflops = 100;
  Plan p = Value(MakePlan(in));
  EXPECT_NEAR(p.t_compute, 1.72032, 1e-12);  // 6 x 7e9 x 4096 / 1e14
}

TEST(Plan, RejectsBadInput) {
  PlanInput in;
  EXPECT_THAT(MakePlan(in), StatusIs(Code::kInvalidArgument, HasSubstr("params")));
  in.params = 1e6;
  in.link_gbps = 0;
  EXPECT_THAT(MakePlan(in), StatusIs(Code::kInvalidArgument));
  in.link_gbps = 10;
  in.state = Format::kInt4;
  EXPECT_THAT(MakePlan(in), StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace zps::plan
