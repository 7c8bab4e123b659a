// What deciding a call's admission costs (docs/limits.md): a call that
// arrives (its tenant's requests and tokens counted, a slot of its
// tenant's calls at once, the upstream's fair queue) and a call that ends
// (its reservations settled and the next waiting call sent), with 1,000
// calls queued across 100 tenants, beside the same decisions with nothing
// queued.
//
// The load has the shape a shared upstream sees: one hot tenant holding
// half of the queue, 99 others a few calls each, weights from 1 to 10,
// four calls at once to the upstream; every end sends the next call, and
// every send is answered by a new call of a tenant drawn with the same
// skew, so the queue stays at 1,000. Each decision is timed on its own
// (steady clock), and the table gives p50, p99 and the largest.
//
// Target: p99 at most 1 ms with 1,000 queued.
//
// Usage: bench_admission [--quick] [--json PATH]

#include <algorithm>
#include <deque>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "admission/limiter.hpp"
#include "admission/upstream.hpp"
#include "report.hpp"

using namespace spindle;
using namespace spindle::admission;
using namespace spindle::bench;

namespace {

constexpr int tenants = 100;
constexpr uint64_t at_once = 4;

[[noreturn]] void die(const std::string& what) {
  std::cerr << "bench_admission: " << what << "\n";
  std::exit(1);
}

struct figures {
  std::vector<double> arrive_us;
  std::vector<double> end_us;
};

// `queued` calls waiting (0: the baseline, each call sent at once), then
// `n` calls arriving and as many ending.
figures run(size_t queued, size_t n) {
  rate_limits l;
  l.requests_per_min = 1000000000;
  l.tokens_per_min = 1000000000000;
  l.concurrent_exchanges = 100000;
  l.max_queued = 100000;
  auto limits = limiter::make([l](std::string_view) { return l; });
  auto upstream = upstream_queue::make(
    upstream_limits{at_once, 0, 1024}, [](std::string_view t) {
      // Weights 1 to 10 by the tenant's number.
      return uint64_t{1} + std::stoull(std::string{t.substr(1)}) % 10;
    });
  std::vector<std::string> names;
  for (int i = 0; i < tenants; ++i)
    names.push_back("t" + std::to_string(i));
  std::mt19937_64 rng{7};
  // Half the calls are the hot tenant's.
  auto draw = [&] {
    return rng() % 2 == 0 ? names[0] : names[1 + rng() % (tenants - 1)];
  };
  struct call {
    grant_ptr g;
    upstream_slot_ptr s;
  };
  std::deque<call> running;
  std::vector<upstream_slot_ptr> sent_now;
  auto arrive = [&](const std::string& tenant) {
    request_ticket t;
    auto state = limits->take_request(tenant, t);
    if (!state.refused_by.empty())
      die("refused by the requests per minute");
    auto a = limits->admit(tenant, 500, 0, {});
    if (a.result != admission::admission::outcome::admitted)
      die("not admitted by the tenant's limits");
    auto g = a.granted;
    auto w = upstream->acquire(tenant, 1524,
                               [&sent_now](upstream_slot_ptr s, int64_t) {
                                 sent_now.push_back(std::move(s));
                               });
    if (w.slot)
      running.push_back({g, std::move(w.slot)});
    else
      // The grant goes with the call when it is sent: kept aside here.
      running.push_back({g, nullptr});
  };
  // Fill: the first four are sent, the rest wait.
  for (size_t i = 0; i < at_once + queued; ++i)
    arrive(i < queued / 2 ? names[0] : draw());
  if (upstream->counts().waiting != queued)
    die("the queue does not hold what was sent");
  // Calls whose slot is held (the first `at_once` with a slot).
  std::deque<upstream_slot_ptr> holding;
  std::deque<grant_ptr> grants;
  for (auto& c : running) {
    if (c.s)
      holding.push_back(std::move(c.s));
    grants.push_back(std::move(c.g));
  }
  running.clear();
  figures f;
  f.arrive_us.reserve(n);
  f.end_us.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // A call ends: its tenant's grant and its upstream slot settle, which
    // sends the next waiting call.
    auto s = std::move(holding.front());
    holding.pop_front();
    auto g = std::move(grants.front());
    grants.pop_front();
    auto start = clock::now();
    g->settle(1500);
    s->settle(1500);
    f.end_us.push_back(seconds_since(start) * 1e6);
    for (auto& x : sent_now)
      holding.push_back(std::move(x));
    sent_now.clear();
    // A new call arrives.
    auto tenant = draw();
    start = clock::now();
    arrive(tenant);
    f.arrive_us.push_back(seconds_since(start) * 1e6);
    for (auto& c : running) {
      if (c.s)
        holding.push_back(std::move(c.s));
      grants.push_back(std::move(c.g));
    }
    running.clear();
    if (holding.empty())
      die("nothing holds the upstream");
  }
  if (upstream->counts().waiting != queued)
    die("the queue did not stay at its size");
  return f;
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  size_t n = quick ? 20000 : 200000;
  spdlog::set_level(spdlog::level::warn);
  report rep{"admission"};
  table t;
  t.title = "Deciding a call's admission with 1,000 calls queued across 100 "
            "tenants (microseconds)";
  t.columns = {"decision", "queued", "p50 µs", "p99 µs", "max µs",
               "baseline: nothing queued, p99 µs"};
  t.notes = {
    "A call arriving: its tenant's requests and tokens counted and a slot "
    "of its calls at once (admission::limiter), then the upstream's fair "
    "queue (admission::upstream_queue, 4 calls at once). A call ending: "
    "both settled, and the next waiting call chosen by its tenant's "
    "weight and sent. One hot tenant holds half of the queue, 99 others "
    "the rest, weights 1 to 10. Target: p99 at most 1,000 µs with 1,000 "
    "queued."};
  auto base = run(0, n);
  auto loaded = run(1000, n);
  t.add_row("a call arrives", 1000, bench::fmt(percentile(loaded.arrive_us, 50), 2),
            bench::fmt(percentile(loaded.arrive_us, 99), 2),
            bench::fmt(percentile(loaded.arrive_us, 100), 1),
            bench::fmt(percentile(base.arrive_us, 99), 2));
  t.add_row("a call ends, the next is sent", 1000,
            bench::fmt(percentile(loaded.end_us, 50), 2),
            bench::fmt(percentile(loaded.end_us, 99), 2),
            bench::fmt(percentile(loaded.end_us, 100), 1),
            bench::fmt(percentile(base.end_us, 99), 2));
  bool met = percentile(loaded.arrive_us, 99) <= 1000
             && percentile(loaded.end_us, 99) <= 1000;
  t.notes.push_back(std::string{"target: "} + (met ? "met" : "NOT met"));
  rep.add(std::move(t));
  if (!rep.write(report::json_path(argc, argv, "admission")))
    return 1;
  return 0;
}
