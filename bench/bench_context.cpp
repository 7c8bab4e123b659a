// The cost of an add at capacity (the eviction path) for windows of 50, 500
// and 5000 items: spindle's deque window, measured directly and through the
// context manager actor, beside the seed's eviction (subseq + a new array
// on every add, seed 001), measured directly.
//
// Usage: bench_context [--quick] [--json PATH]

#include <iostream>
#include <memory>
#include <vector>

#include "report.hpp"
#include "spindle/messages/context_window.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using namespace spindle::bench;

namespace {

// Items ctx-1 .. ctx-n with a typical short code snippet.
std::vector<context_item> make_pool(uint64_t n) {
  std::vector<context_item> pool;
  pool.reserve(n);
  for (uint64_t i = 1; i <= n; ++i)
    pool.push_back(*context_item::make(
      format_context_id(i), context_type::code,
      "(defun f" + std::to_string(i) + " (x) (* x x))",
      {{"filename", "a.lisp"}, {"start_line", 1}, {"end_line", 1}},
      3910982400));
  return pool;
}

// ns per add at capacity, spindle's window: pre-filled, then `adds` more.
double deque_ns_per_add(uint64_t size, uint64_t adds) {
  auto pool = make_pool(size + adds);
  context_window window{{static_cast<int64_t>(size), 0}};
  for (uint64_t i = 0; i < size; ++i)
    window.push(std::move(pool[i]), nullptr);
  std::vector<context_item> evicted;
  evicted.reserve(1);
  auto start = clock::now();
  for (uint64_t i = size; i < size + adds; ++i) {
    evicted.clear();
    window.push(std::move(pool[i]), &evicted);
  }
  auto secs = seconds_since(start);
  if (window.size() != size || evicted.size() != 1)
    std::cerr << "deque window: unexpected state\n";
  return secs * 1e9 / static_cast<double>(adds);
}

// The seed's add-context at capacity: `(subseq items 1)` copies the array,
// `make-array :initial-contents` copies it again into an array of exactly
// that length, and `vector-push-extend` grows it. Lisp arrays hold
// references, so the baseline copies pointers, not items.
double seed_ns_per_add(uint64_t size, uint64_t adds) {
  auto pool = make_pool(size + adds);
  std::vector<const context_item*> items;
  for (uint64_t i = 0; i < size; ++i)
    items.push_back(&pool[i]);
  auto start = clock::now();
  for (uint64_t i = size; i < size + adds; ++i) {
    if (items.size() >= size) {
      std::vector<const context_item*> rest(items.begin() + 1, items.end());
      std::vector<const context_item*> fresh(rest);
      items = std::move(fresh);
    }
    items.push_back(&pool[i]);
  }
  auto secs = seconds_since(start);
  if (items.size() != size || items.back() != &pool.back())
    std::cerr << "seed baseline: unexpected state\n";
  return secs * 1e9 / static_cast<double>(adds);
}

struct actor_figures {
  double mean_us = 0;
  double p50_us = 0;
  double p99_us = 0;
};

// One caller adding to the manager of a full window, each add waiting for
// its reply (ID from the allocator, claim at the directory, push).
actor_figures actor_us_per_add(runtime& rt, uint64_t size, uint64_t adds) {
  auto thread = "bench-" + std::to_string(size);
  rt.configure_context(thread, {static_cast<int64_t>(size), 0});
  auto manager = rt.context_manager_of(thread, false);
  if (!manager) {
    std::cerr << describe(manager.error()) << "\n";
    return {};
  }
  auto draft = *make_context_draft(context_type::code, "(defun f (x) (* x x))",
                                   {{"filename", "a.lisp"}});
  auto add = [&] {
    return rt.call<context_add_result>(*manager, std::chrono::seconds(30),
                                       caf::add_atom::value, draft);
  };
  for (uint64_t i = 0; i < size; ++i)
    add();
  std::vector<double> samples;
  samples.reserve(adds);
  auto start = clock::now();
  for (uint64_t i = 0; i < adds; ++i) {
    auto t0 = clock::now();
    auto result = add();
    samples.push_back(seconds_since(t0) * 1e6);
    if (!result || result->evicted.size() != 1)
      std::cerr << "actor add: unexpected reply\n";
  }
  actor_figures out;
  out.mean_us = seconds_since(start) * 1e6 / static_cast<double>(adds);
  out.p50_us = percentile(samples, 50);
  out.p99_us = percentile(samples, 99);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  report rep{"context"};
  const std::vector<uint64_t> sizes{50, 500, 5000};
  const uint64_t direct_adds = quick ? 20000 : 400000;
  const uint64_t actor_adds = quick ? 500 : 5000;
  runtime rt;
  table t;
  t.title = "Add at capacity (one eviction per add) by window size";
  t.columns = {"window",          "deque ns/add", "seed copy ns/add",
               "seed / deque",    "actor us/add", "actor p50 us",
               "actor p99 us"};
  for (auto size : sizes) {
    // The seed's copy is O(n) per add: fewer adds keep the run short.
    auto seed_adds = std::max<uint64_t>(1000, direct_adds * 50 / size / 4);
    auto deque_ns = deque_ns_per_add(size, direct_adds);
    auto seed_ns = seed_ns_per_add(size, seed_adds);
    auto actor = actor_us_per_add(rt, size, actor_adds);
    t.rows.push_back({size, deque_ns, seed_ns, seed_ns / deque_ns,
                      actor.mean_us, actor.p50_us, actor.p99_us});
  }
  t.notes = {
    "deque: spindle's context_window (messages/context_window.hpp), pushed "
    "directly, " + std::to_string(direct_adds) + " adds per size. seed copy: "
    "subseq + make-array + vector-push-extend of a pointer array per add, "
    "as seed 001 evicts. actor: one caller, blocking on each add sent to "
    "the thread's context manager (ID from the ID allocator, claim at the "
    "context directory, push), " + std::to_string(actor_adds) + " adds.",
    "Target: deque and actor cost per add flat across window sizes; the "
    "seed's grows with the window."};
  rep.add(std::move(t));
  rep.write(report::json_path(argc, argv, "context"));
  return 0;
}
