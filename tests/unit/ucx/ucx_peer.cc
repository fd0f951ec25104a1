// test_ucx_peer: the second process of the UCX tests (started with fork + exec, never fork
// alone, so UCX state is never shared across a fork).
//
//   test_ucx_peer <transports>
//
// Prints, one per line on stdout: "ADDR <hex>", "RKEY <hex>", "RADDR <decimal>", "READY".
// Serves AM id 1 as an echo: receives the payload (eager or rendezvous) and sends it back as
// AM id 2, with the same header, through the reply endpoint. Exposes a 4 MiB registered region
// whose byte i is (i * 131 + 7) & 0xff for RMA get. Exits when stdin reaches EOF.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "zps/common/ucx.h"

namespace {

std::string Hex(std::span<const std::byte> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    out.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
    out.push_back(kDigits[static_cast<unsigned>(b) & 15]);
  }
  return out;
}

int Fail(const zps::Status& s) {
  std::fprintf(stderr, "test_ucx_peer: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zps::ucx;
  std::string tls = argc > 1 ? argv[1] : "tcp";
  auto ctx =
      Context::Create({.transports = tls, .keepalive_interval = std::chrono::milliseconds(200)});
  if (!ctx.ok()) return Fail(ctx.status());
  auto worker_or = Worker::Create(**ctx, {.thread_name = "peer-ucx"});
  if (!worker_or.ok()) return Fail(worker_or.status());
  Worker* worker = worker_or->get();

  std::vector<std::byte> region_mem(4 << 20);
  for (size_t i = 0; i < region_mem.size(); ++i) region_mem[i] = std::byte((i * 131 + 7) & 0xff);
  auto region = (*ctx)->Register(region_mem);
  if (!region.ok()) return Fail(region.status());

  zps::Status st = worker->SetAmHandler(1, [worker](AmMessage& m) {
    auto buf = std::make_shared<std::vector<std::byte>>(m.data_length());
    auto header = std::make_shared<std::vector<std::byte>>(m.header().begin(), m.header().end());
    Endpoint reply = m.reply_endpoint();
    // The reply endpoint may be used in the Receive callback when it reports OK.
    m.Receive(*buf, [worker, reply, buf, header](zps::Status s) {
       if (!s.ok()) return;
       SendOptions opts;
       opts.force_rendezvous = buf->size() > 65536;
       worker->SendAm(reply, 2, *header, *buf, buf, nullptr, opts);
     }).IgnoreError();
  });
  if (!st.ok()) return Fail(st);
  st = worker->Start();
  if (!st.ok()) return Fail(st);

  std::printf("ADDR %s\nRKEY %s\nRADDR %llu\nREADY\n", Hex(worker->Address()).c_str(),
              Hex((*region)->rkey()).c_str(),
              static_cast<unsigned long long>((*region)->remote_address()));
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  worker->Stop();
  return 0;
}
