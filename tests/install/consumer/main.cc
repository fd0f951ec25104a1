// Links an installed zps::worker: builds a Layout, registers the process metrics, allocates a
// worker buffer and gets a Status back from Client::Connect.
#include <chrono>
#include <cstdio>

#include "zps/common/layout.h"
#include "zps/common/metrics.h"
#include "zps/common/process_metrics.h"
#include "zps/worker/client.h"

int main() {
  auto layout = zps::Layout::Build({{"w", {1024, 1024}}, {"b", {1024}}}, {});
  if (!layout.ok()) return 1;
  std::printf("layout %u params, hash %016llx\n", layout->num_params(),
              static_cast<unsigned long long>(layout->Hash()));
  zps::metrics::Registry registry;
  auto pm = zps::metrics::ProcessMetrics::Create(registry, "worker");
  if (!pm.ok() || registry.Serialize().find("zps_build_info") == std::string::npos) return 2;
  auto buffer = zps::worker::CpuDevice::Default()->Allocate(4096);
  if (!buffer.ok()) return 3;
  zps::worker::WorkerOptions options;  // no endpoint: Connect must fail with a Status
  options.connect_timeout = std::chrono::milliseconds(100);
  auto client = zps::worker::Client::Connect(options, {}, 0);
  std::printf("connect without an endpoint: %s\n", client.status().ToString().c_str());
  return client.ok() ? 4 : 0;
}
