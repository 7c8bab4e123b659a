// spindle serve under load: requests per second and latency of
// POST /v1/threads/{id}/messages (offline provider) at 1, 8 and 64
// keep-alive connections, beside GET /healthz on the same server in the
// same run (the HTTP layer's own ceiling).
//
// Usage: bench_server [--quick] [--json PATH]

#include <atomic>
#include <thread>

#include <httplib.h>

#include "report.hpp"

using namespace spindle::bench;

namespace {

struct load_result {
  double rps = 0, p50 = 0, p99 = 0;
  uint64_t errors = 0;
};

load_result drive(int port, size_t connections, double seconds,
                  bool messages) {
  std::vector<std::vector<double>> samples(connections);
  std::atomic<uint64_t> errors{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  auto start = clock::now();
  for (size_t c = 0; c < connections; ++c)
    clients.emplace_back([&, c] {
      httplib::Client cli{"127.0.0.1", port};
      cli.set_keep_alive(true);
      cli.set_tcp_nodelay(true);
      auto path = "/v1/threads/bench-" + std::to_string(c % 8) + "/messages";
      while (!stop) {
        auto t0 = clock::now();
        auto r = messages ? cli.Post(path.c_str(),
                                     R"({"content":"how are you?"})",
                                     "application/json")
                          : cli.Get("/healthz");
        if (!r || r->status != 200)
          ++errors;
        samples[c].push_back(seconds_since(t0) * 1000.0);
      }
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : clients)
    t.join();
  auto elapsed = seconds_since(start);
  std::vector<double> all;
  for (auto& s : samples)
    all.insert(all.end(), s.begin(), s.end());
  load_result out;
  out.rps = static_cast<double>(all.size()) / elapsed;
  out.p50 = percentile(all, 50);
  out.p99 = percentile(all, 99);
  out.errors = errors;
  return out;
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  double seconds = quick ? 1.0 : 5.0;
  report rep{"server"};
  serve_child srv{{"--data", ":memory:"}};
  table t;
  t.title = "spindle serve: POST messages (offline provider) beside GET "
            "/healthz, keep-alive connections";
  t.columns = {"connections", "messages req/s", "messages p50 ms",
               "messages p99 ms", "healthz req/s", "healthz p50 ms",
               "healthz p99 ms", "errors"};
  for (size_t conns : {1, 8, 64}) {
    auto m = drive(srv.port(), conns, seconds, true);
    auto h = drive(srv.port(), conns, seconds, false);
    t.add_row(conns, m.rps, fmt(m.p50, 3), fmt(m.p99, 3), h.rps,
              fmt(h.p50, 3), fmt(h.p99, 3), m.errors + h.errors);
  }
  t.notes = {"Each message is a whole exchange: history read, user turn "
             "stored, offline reply generated and streamed internally, "
             "assistant turn stored, memory stored. Messages go to 8 threads "
             "(connection i writes to thread i mod 8), so exchanges on one "
             "thread queue (D9). /healthz is the HTTP layer alone. Client "
             "and server share the machine's cores."};
  rep.add(std::move(t));
  rep.write(report::json_path(argc, argv, "server"));
  return 0;
}
