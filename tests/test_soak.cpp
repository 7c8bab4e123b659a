// The soak: `spindle stress` drives a durable `spindle serve` with mixed
// load for SPINDLE_SOAK_SECONDS (60 in CTest; `.ci/soak` runs 1,800) while
// the server's resident memory, open files and threads are sampled every
// second. After the warm-up they stay flat within the bounds below, every
// response keeps stress's invariants, and the server stops cleanly with
// its databases intact (docs/reliability.md, "Soak").

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support.hpp"

using json = nlohmann::json;
using namespace std::chrono;
using spindle::test::env_number;
using spindle::test::integrity_check;
using spindle::test::run;
using spindle::test::server_process;
using spindle::test::spindle_binary;
using spindle::test::temp_dir;

namespace {

/// One look at the server process.
struct sample {
  double seconds = 0;
  uint64_t rss_kib = 0;  // VmRSS
  uint64_t anon_kib = 0; // RssAnon: the heap and stacks
  uint64_t file_kib = 0; // RssFile: mapped files (memory.db's mmap)
  uint64_t fds = 0;
  uint64_t threads = 0;
  // The allocator's figures from GET /metrics (jemalloc; 0 otherwise).
  uint64_t allocated_kib = 0;
  uint64_t active_kib = 0;
  uint64_t dirty_kib = 0;
};

// Reads spindle_allocator_bytes{kind="KIND"} from a /metrics page.
uint64_t allocator_kib(const std::string& page, const std::string& kind) {
  auto key = "spindle_allocator_bytes{kind=\"" + kind + "\"} ";
  auto at = page.find(key);
  if (at == std::string::npos)
    return 0;
  return static_cast<uint64_t>(std::stod(page.substr(at + key.size())))
         / 1024;
}

std::optional<sample> look(pid_t pid, double at) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  if (!in)
    return std::nullopt;
  sample s;
  s.seconds = at;
  std::string line;
  auto field = [&](const char* name, uint64_t& out) {
    auto n = std::strlen(name);
    if (line.compare(0, n, name) == 0)
      out = std::stoull(line.substr(n));
  };
  while (std::getline(in, line)) {
    field("VmRSS:", s.rss_kib);
    field("RssAnon:", s.anon_kib);
    field("RssFile:", s.file_kib);
    field("Threads:", s.threads);
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator{
         "/proc/" + std::to_string(pid) + "/fd", ec};
       !ec && it != std::filesystem::directory_iterator{}; it.increment(ec))
    ++s.fds;
  return s;
}

template <class F>
uint64_t max_of(const std::vector<sample>& xs, size_t from, size_t to, F f) {
  uint64_t m = 0;
  for (size_t i = from; i < to; ++i)
    m = std::max(m, f(xs[i]));
  return m;
}

template <class F>
double mean_of(const std::vector<sample>& xs, size_t from, size_t to, F f) {
  double sum = 0;
  for (size_t i = from; i < to; ++i)
    sum += static_cast<double>(f(xs[i]));
  return to > from ? sum / static_cast<double>(to - from) : 0;
}

} // namespace

TEST_CASE("soak: mixed load through spindle stress keeps every invariant "
          "and the server's memory, open files and threads flat after "
          "warm-up") {
  auto run_seconds = env_number("SPINDLE_SOAK_SECONDS", 60);
  auto clients = env_number("SPINDLE_SOAK_CLIENTS", 16);
  REQUIRE(run_seconds >= 45);
  // The warm-up: a quarter of the run, at least 30 s and at most five
  // minutes. Conversations end after 100 turns and idle threads passivate
  // after 10 s, so the set of resident threads reaches its steady size
  // well within it; on a loaded machine the short run's caches and pending
  // request timeouts (30 s for the scheduler's) fill in about 30 s.
  auto warmup = std::min<double>(
    std::max<double>(static_cast<double>(run_seconds) / 4, 30), 300);

  temp_dir data;
  server_process srv{{"--data", data.str(), "--idle-timeout", "10"}};
  auto url = "http://127.0.0.1:" + std::to_string(srv.port());

  auto started = steady_clock::now();
  auto elapsed = [&] {
    return duration<double>(steady_clock::now() - started).count();
  };
  auto stress = std::async(std::launch::async, [&] {
    return run({spindle_binary(), "stress", "--url", url, "--clients",
                std::to_string(clients), "--duration", std::to_string(run_seconds),
                "--thread-turns", "100", "--seed",
                std::to_string(env_number("SPINDLE_SOAK_SEED", 1)), "--json",
                "--no-progress"});
  });
  std::vector<sample> samples;
  httplib::Client scraper{"127.0.0.1", srv.port()};
  scraper.set_read_timeout(5, 0);
  while (stress.wait_for(seconds{1}) != std::future_status::ready)
    if (auto s = look(srv.pid(), elapsed())) {
      if (auto page = scraper.Get("/metrics"); page && page->status == 200) {
        s->allocated_kib = allocator_kib(page->body, "allocated");
        s->active_kib = allocator_kib(page->body, "active");
        s->dirty_kib = allocator_kib(page->body, "dirty");
      }
      samples.push_back(*s);
    }
  auto result = stress.get();

  // The samples and a summary for .ci/soak, which writes them into
  // docs/reliability.md.
  if (const char* path = std::getenv("SPINDLE_SOAK_SAMPLES")) {
    std::ofstream out{path};
    out << "seconds\trss_kib\tanon_kib\tfile_kib\tfds\tthreads"
           "\tallocated_kib\tactive_kib\tdirty_kib\n";
    for (auto& s : samples)
      out << s.seconds << '\t' << s.rss_kib << '\t' << s.anon_kib << '\t'
          << s.file_kib << '\t' << s.fds << '\t' << s.threads << '\t'
          << s.allocated_kib << '\t' << s.active_kib << '\t'
          << s.dirty_kib << '\n';
  }

  INFO(result.err);
  INFO(result.out.substr(0, 4000));
  REQUIRE(result.exit_code == 0);
  auto report = json::parse(result.out, nullptr, false);
  REQUIRE(report.is_object());
  CHECK(report["violations"].empty());
  CHECK(report["errors"] == 0);
  REQUIRE(report["operations"].get<uint64_t>() > 0);

  // Split at the warm-up; the rest in thirds for the drift.
  auto after = static_cast<size_t>(
    std::find_if(samples.begin(), samples.end(),
                 [&](const sample& s) { return s.seconds >= warmup; })
    - samples.begin());
  REQUIRE(after >= 5);
  REQUIRE(samples.size() - after >= 9);
  auto n = samples.size();
  auto third = (n - after) / 3;
  auto anon = [](const sample& s) { return s.anon_kib; };
  auto rss = [](const sample& s) { return s.rss_kib; };
  auto fds = [](const sample& s) { return s.fds; };
  auto threads = [](const sample& s) { return s.threads; };

  auto warm_anon = max_of(samples, 0, after, anon);
  auto later_anon = max_of(samples, after, n, anon);
  auto first_third = mean_of(samples, after, after + third, anon);
  auto last_third = mean_of(samples, n - third, n, anon);
  auto warm_fds = max_of(samples, 0, after, fds);
  auto later_fds = max_of(samples, after, n, fds);
  auto warm_threads = max_of(samples, 0, after, threads);
  auto later_threads = max_of(samples, after, n, threads);
  json summary{{"seconds", run_seconds},
               {"clients", clients},
               {"warmup_seconds", warmup},
               {"samples", n},
               {"operations", report["operations"]},
               {"throughput", report["throughput"]},
               {"errors", report["errors"]},
               {"violations", report["violations"].size()},
               {"operations_by_kind", report["operations_by_kind"]},
               {"anon_kib_warmup_max", warm_anon},
               {"anon_kib_after_max", later_anon},
               {"anon_kib_first_third_mean", first_third},
               {"anon_kib_last_third_mean", last_third},
               {"rss_kib_after_max", max_of(samples, after, n, rss)},
               {"fds_warmup_max", warm_fds},
               {"fds_after_max", later_fds},
               {"threads_warmup_max", warm_threads},
               {"threads_after_max", later_threads}};
  std::cout << "soak summary: " << summary.dump() << std::endl;
  INFO(summary.dump(2));

  // The bounds (docs/reliability.md, "Soak"). The heap after the warm-up
  // stays within 10% + 16 MiB of its peak during it, and drifts by at most
  // 5% + 8 MiB from the first third after the warm-up to the last: a leak
  // of a few hundred bytes an operation fails one or the other. Mapped
  // database pages (RssFile) are the kernel's page cache, capped by
  // memory.db's 256 MiB mmap_size, and not judged. Open files stay within
  // 16 of their warm-up peak (connections come and go), threads within 2.
  // Under ThreadSanitizer (.ci/sanitize tsan builds the server with it
  // too) the heap holds TSan's own shadow and access histories, which
  // grow with every access: the heap is judged on the other runs (plain
  // and ASan), the load's invariants, files and threads on every run.
#if !defined(__SANITIZE_THREAD__)
  CHECK(static_cast<double>(later_anon)
        <= static_cast<double>(warm_anon) * 1.10 + 16 * 1024);
  CHECK(last_third <= first_third * 1.05 + 8 * 1024);
#endif
  CHECK(later_fds <= warm_fds + 16);
  CHECK(later_threads <= warm_threads + 2);

  // Still serving, and a clean stop leaves intact databases.
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto health = cli.Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(srv.stop(SIGTERM) == 0);
  for (auto& entry : std::filesystem::directory_iterator{data.path()})
    if (entry.path().extension() == ".db") {
      INFO(entry.path());
      CHECK(integrity_check(entry.path()) == "ok");
    }
}
