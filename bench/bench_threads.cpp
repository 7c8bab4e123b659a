// Conversation threads: spindle's thread actors beside the seed's store (a
// module-level dict, in C++ a std::mutex + unordered_map), measured in the
// same run.
//
// 1. add_turn + history(12) operations per second over 10k threads with 1,
//    2, 4 and 8 clients, the actors driven four ways: the blocking facade
//    (runtime::add_turn / history), blocking requests to cached thread
//    handles, and event-based drivers keeping requests in flight (to cached
//    handles, and by thread ID through the registry).
// 2. Context builder latency at 64 concurrent builds (offline rewriter),
//    with and without long-term memory.
// 3. Resident memory of 100k threads of 10 turns, both stores, each in its
//    own child process.
//
// Usage: bench_threads [--quick] [--json PATH]
//        [--only throughput|builder|rss]

#include <algorithm>
#include <atomic>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <sys/wait.h>
#include <unistd.h>

#include "report.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using namespace spindle::bench;
using namespace std::chrono_literals;

namespace {

constexpr std::chrono::seconds request_timeout{30};

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch())
    .count();
}

std::string thread_name(size_t i) {
  return "thread-" + std::to_string(i);
}

turn op_turn(uint64_t client, uint64_t n) {
  return make_user_turn("client " + std::to_string(client) + " message "
                        + std::to_string(n) + " asks about the weather");
}

// -- the seed's store ---------------------------------------------------------

/// THREADS: Dict[str, Thread] behind one lock, as the seed's module-level
/// dict is used by a threaded server.
class mutex_store {
public:
  uint64_t add_turn(const std::string& id, turn t) {
    std::lock_guard<std::mutex> guard{mtx_};
    if (t.timestamp_ms == 0)
      t.timestamp_ms = now_ms();
    auto& turns = threads_[id];
    turns.push_back(std::move(t));
    return turns.size();
  }

  std::vector<turn> history(const std::string& id, size_t max_turns) {
    std::lock_guard<std::mutex> guard{mtx_};
    auto i = threads_.find(id);
    if (i == threads_.end())
      return {};
    auto& turns = i->second;
    auto first = history_window_start(turns, max_turns);
    return {turns.begin() + static_cast<ptrdiff_t>(first), turns.end()};
  }

private:
  std::mutex mtx_;
  std::unordered_map<std::string, std::vector<turn>> threads_;
};

// -- drivers ------------------------------------------------------------------

struct run_result {
  uint64_t ops = 0;
  uint64_t errors = 0;
  double seconds = 0;
  double per_second() const {
    return static_cast<double>(ops) / seconds;
  }
};

/// Runs `body(client, deadline) -> ops` on `clients` threads.
template <class Body>
run_result run_clients(size_t clients, double seconds, Body body) {
  std::atomic<uint64_t> ops{0}, errors{0};
  std::vector<std::thread> pool;
  auto start = clock::now();
  auto deadline = start + std::chrono::duration_cast<clock::duration>(
                            std::chrono::duration<double>(seconds));
  for (size_t c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      uint64_t e = 0;
      ops += body(c, deadline, e);
      errors += e;
    });
  for (auto& t : pool)
    t.join();
  return {ops, errors, seconds_since(start)};
}

struct pipeline_state {
  static inline const char* name = "bench.driver";
  std::mt19937_64 gen;
  size_t inflight = 0;
  uint64_t ops = 0;
  uint64_t errors = 0;
  uint64_t sent = 0;
};

struct pipeline_ctx {
  std::shared_ptr<const std::vector<thread_actor>> handles; // or empty
  std::shared_ptr<const std::vector<std::string>> ids;      // via registry
  thread_registry_actor registry;
  clock::time_point deadline;
  /// Request timeout; infinite only for the comparison column.
  caf::duration timeout{request_timeout};
  uint64_t client = 0;
  std::promise<run_result>* done = nullptr;
};

using pipeline_actor = caf::stateful_actor<pipeline_state>;

void start_op(pipeline_actor* self, const pipeline_ctx& ctx);

void finish_op(pipeline_actor* self, const pipeline_ctx& ctx) {
  auto& st = self->state;
  --st.inflight;
  ++st.ops;
  if (clock::now() < ctx.deadline) {
    start_op(self, ctx);
  } else if (st.inflight == 0) {
    ctx.done->set_value(run_result{st.ops, st.errors, 0});
    self->quit();
  }
}

void start_op(pipeline_actor* self, const pipeline_ctx& ctx) {
  auto& st = self->state;
  ++st.inflight;
  auto on_error = [self, ctx](caf::error&) {
    ++self->state.errors;
    finish_op(self, ctx);
  };
  auto t = op_turn(ctx.client, st.sent++);
  if (ctx.handles) {
    auto h = (*ctx.handles)[st.gen() % ctx.handles->size()];
    self->request(h, ctx.timeout, caf::add_atom::value, std::move(t))
      .then(
        [self, ctx, h, on_error](uint64_t) {
          self
            ->request(h, ctx.timeout, caf::get_atom::value,
                      history_atom::value, uint64_t{12})
            .then(
              [self, ctx](history_window& w) {
                if (w.turns.empty())
                  ++self->state.errors;
                finish_op(self, ctx);
              },
              on_error);
        },
        on_error);
  } else {
    auto& id = (*ctx.ids)[st.gen() % ctx.ids->size()];
    self
      ->request(ctx.registry, request_timeout, caf::add_atom::value, id,
                std::move(t))
      .then(
        [self, ctx, id, on_error](uint64_t) {
          self
            ->request(ctx.registry, request_timeout, caf::get_atom::value,
                      history_atom::value, id, uint64_t{12})
            .then(
              [self, ctx](history_window& w) {
                if (w.turns.empty())
                  ++self->state.errors;
                finish_op(self, ctx);
              },
              on_error);
        },
        on_error);
  }
}

caf::behavior pipeline_driver(pipeline_actor* self, pipeline_ctx ctx,
                              size_t window) {
  self->state.gen.seed(ctx.client * 7919 + 1);
  for (size_t i = 0; i < window; ++i)
    start_op(self, ctx);
  return {[](caf::unit_t) {}};
}

run_result run_pipelined(runtime& rt, size_t clients, double seconds,
                         size_t window, pipeline_ctx base) {
  std::vector<std::promise<run_result>> done(clients);
  auto start = clock::now();
  base.deadline = start + std::chrono::duration_cast<clock::duration>(
                            std::chrono::duration<double>(seconds));
  for (size_t c = 0; c < clients; ++c) {
    auto ctx = base;
    ctx.client = c;
    ctx.done = &done[c];
    rt.system().spawn(pipeline_driver, ctx, window);
  }
  run_result total;
  for (auto& d : done) {
    auto r = d.get_future().get();
    total.ops += r.ops;
    total.errors += r.errors;
  }
  total.seconds = seconds_since(start);
  return total;
}

// Preloads `threads` threads with `turns` alternating turns each, through
// the registry, `window` adds in flight; returns the thread handles.
std::vector<thread_actor> preload(runtime& rt, size_t threads, size_t turns,
                                  size_t content_bytes) {
  std::promise<void> finished;
  auto registry = rt.thread_registry();
  std::atomic<uint64_t> errors{0};
  rt.system().spawn([&, registry](caf::event_based_actor* self) {
    auto next = std::make_shared<size_t>(0);
    auto inflight = std::make_shared<size_t>(0);
    auto total = threads * turns;
    std::string filler(content_bytes, 'x');
    auto step = std::make_shared<std::function<void()>>();
    *step = [=, &finished, &errors] {
      while (*inflight < 512 && *next < total) {
        auto k = (*next)++;
        // Turn-major order: every thread gets turn i before any gets i + 1.
        auto thread = k % threads;
        auto i = k / threads;
        auto t = i % 2 == 0 ? make_user_turn(filler)
                            : make_assistant_turn(filler);
        ++*inflight;
        self
          ->request(registry, request_timeout, caf::add_atom::value,
                    thread_name(thread), std::move(t))
          .then(
            [=, &finished](uint64_t) {
              --*inflight;
              if (*next == total && *inflight == 0) {
                finished.set_value();
                self->quit();
                return;
              }
              (*step)();
            },
            [=, &finished, &errors](caf::error&) {
              ++errors;
              --*inflight;
              if (*next == total && *inflight == 0) {
                finished.set_value();
                self->quit();
                return;
              }
              (*step)();
            });
      }
    };
    (*step)();
  });
  finished.get_future().get();
  if (errors > 0)
    std::cerr << "preload: " << errors << " errors\n";
  std::vector<thread_actor> handles;
  handles.reserve(threads);
  caf::scoped_actor self{rt.system()};
  for (size_t i = 0; i < threads; ++i)
    self
      ->request(registry, request_timeout, caf::get_atom::value,
                thread_name(i))
      .receive([&](thread_ref& ref) { handles.push_back(ref.handle); },
               [&](caf::error&) { std::cerr << "preload: lookup failed\n"; });
  return handles;
}

// -- 1. throughput ------------------------------------------------------------

void throughput(report& rep, bool quick) {
  const size_t threads = quick ? 1000 : 10000;
  const double secs = quick ? 0.2 : 1.0;
  const size_t window = 64;
  runtime rt;
  auto handles = std::make_shared<const std::vector<thread_actor>>(
    preload(rt, threads, 12, 40));
  auto ids = std::make_shared<std::vector<std::string>>();
  for (size_t i = 0; i < threads; ++i)
    ids->push_back(thread_name(i));
  mutex_store seed;
  for (size_t i = 0; i < threads; ++i)
    for (size_t k = 0; k < 12; ++k)
      seed.add_turn(thread_name(i),
                    k % 2 == 0 ? make_user_turn(std::string(40, 'x'))
                               : make_assistant_turn(std::string(40, 'x')));
  table t;
  t.title = "add_turn + history(12) per second over "
            + std::to_string(threads) + " threads";
  t.columns = {"clients",
               "mutex store",
               "facade (blocking)",
               "handles (blocking)",
               "actors, pipelined",
               "registry, pipelined",
               "best actors / mutex",
               "pipelined, no timeouts",
               "no timeouts / mutex"};
  uint64_t errors = 0;
  for (size_t clients : {1, 2, 4, 8}) {
    auto m = run_clients(clients, secs, [&](size_t c, auto deadline,
                                             uint64_t& e) {
      std::mt19937_64 gen{c * 31 + 7};
      uint64_t ops = 0;
      while (clock::now() < deadline) {
        auto& id = (*ids)[gen() % ids->size()];
        seed.add_turn(id, op_turn(c, ops));
        if (seed.history(id, 12).empty())
          ++e;
        ++ops;
      }
      return ops;
    });
    auto f = run_clients(clients, secs, [&](size_t c, auto deadline,
                                             uint64_t& e) {
      std::mt19937_64 gen{c * 31 + 7};
      uint64_t ops = 0;
      while (clock::now() < deadline) {
        auto& id = (*ids)[gen() % ids->size()];
        if (!rt.add_turn(id, op_turn(c, ops)))
          ++e;
        auto h = rt.history(id, 12);
        if (!h || h->empty())
          ++e;
        ++ops;
      }
      return ops;
    });
    auto b = run_clients(clients, secs, [&](size_t c, auto deadline,
                                             uint64_t& e) {
      std::mt19937_64 gen{c * 31 + 7};
      caf::scoped_actor self{rt.system()};
      uint64_t ops = 0;
      while (clock::now() < deadline) {
        auto& h = (*handles)[gen() % handles->size()];
        self->request(h, request_timeout, caf::add_atom::value,
                      op_turn(c, ops))
          .receive([](uint64_t) {}, [&](caf::error&) { ++e; });
        self
          ->request(h, request_timeout, caf::get_atom::value,
                    history_atom::value, uint64_t{12})
          .receive(
            [&](history_window& w) {
              if (w.turns.empty())
                ++e;
            },
            [&](caf::error&) { ++e; });
        ++ops;
      }
      return ops;
    });
    pipeline_ctx by_handle;
    by_handle.handles = handles;
    auto p = run_pipelined(rt, clients, secs, window, by_handle);
    pipeline_ctx by_id;
    by_id.ids = ids;
    by_id.registry = rt.thread_registry();
    auto r = run_pipelined(rt, clients, secs, window, by_id);
    pipeline_ctx untimed = by_handle;
    untimed.timeout = caf::duration{caf::infinite};
    auto u = run_pipelined(rt, clients, secs, window, untimed);
    errors += m.errors + f.errors + b.errors + p.errors + r.errors + u.errors;
    auto best = std::max({f.per_second(), b.per_second(), p.per_second(),
                          r.per_second()});
    t.rows.push_back({clients, bench::fmt(m.per_second()),
                      bench::fmt(f.per_second()), bench::fmt(b.per_second()),
                      bench::fmt(p.per_second()), bench::fmt(r.per_second()),
                      bench::fmt(best / m.per_second(), 2),
                      bench::fmt(u.per_second()),
                      bench::fmt(u.per_second() / m.per_second(), 2)});
  }
  t.notes = {
    "One operation = add_turn of a ~45-byte user turn + history(12) of the "
    "same thread, on a thread picked at random. Each thread starts with 12 "
    "turns. Errors (failed calls or empty windows): "
      + std::to_string(errors) + ".",
    "mutex store: the seed's module-level dict in C++ (one std::mutex "
    "around unordered_map<string, vector<turn>>), called by each client "
    "thread directly. facade: runtime::add_turn + runtime::history (a "
    "scoped_actor per call, via the registry). handles: one scoped_actor "
    "per client, blocking request/receive to cached thread handles. "
    "pipelined: one event-based driver per client keeping "
      + std::to_string(window)
      + " operations in flight, to cached handles or by thread ID through "
        "the registry.",
    "no timeouts: the pipelined drivers again with caf::infinite request "
    "timeouts, which spindle's rule (every request has a finite timeout) "
    "forbids; shown because CAF 0.17's actor clock wakes its thread on "
    "every request with a timeout and again on its reply.",
    "Target: at least 0.5x the mutex store at 8 clients."};
  rep.add(std::move(t));
}

// -- 2. builder latency -------------------------------------------------------

struct latency_state {
  static inline const char* name = "bench.builder_driver";
  std::vector<double> samples;
  uint64_t sent = 0;
  size_t inflight = 0;
  uint64_t errors = 0;
};

struct latency_result {
  std::vector<double> samples_us;
  uint64_t errors = 0;
  double seconds = 0;
};

using latency_actor = caf::stateful_actor<latency_state>;

void start_build(latency_actor* self, context_builder_actor builder,
                 uint64_t total, size_t threads,
                 std::promise<latency_result>* done) {
  auto& st = self->state;
  if (st.sent == total) {
    if (st.inflight == 0) {
      done->set_value(latency_result{std::move(st.samples), st.errors, 0});
      self->quit();
    }
    return;
  }
  auto n = st.sent++;
  ++st.inflight;
  build_request req{thread_name(n % threads), "user-" + std::to_string(n % 16),
                    "what did we say about rivers and mountains?",
                    build_options{}};
  auto start = clock::now();
  auto next = [=] {
    --self->state.inflight;
    start_build(self, builder, total, threads, done);
  };
  self->request(builder, request_timeout, build_context_atom::value, req)
    .then(
      [=](built_context& ctx) {
        self->state.samples.push_back(seconds_since(start) * 1e6);
        if (ctx.short_term_history.empty())
          ++self->state.errors;
        next();
      },
      [=](caf::error&) {
        ++self->state.errors;
        next();
      });
}

latency_result measure_builds(runtime& rt, size_t concurrency, uint64_t total,
                              size_t threads) {
  std::promise<latency_result> done;
  auto builder = rt.context_builder();
  auto start = clock::now();
  rt.system().spawn([&, builder](latency_actor* self) -> caf::behavior {
    for (size_t i = 0; i < concurrency; ++i)
      start_build(self, builder, total, threads, &done);
    return {[](caf::unit_t) {}};
  });
  auto r = done.get_future().get();
  r.seconds = seconds_since(start);
  return r;
}

void builder_latency(report& rep, bool quick) {
  const size_t threads = 1000;
  const uint64_t builds = quick ? 40000 : 400000;
  table t;
  t.title = "Context builder latency (offline rewriter, history 12 of 12 "
            "turns)";
  t.columns = {"memory",     "concurrent", "builds/s", "p50 us",
               "p99 us",     "max us",     "p99 target met"};
  for (bool memory : {false, true}) {
    runtime_options opts;
    opts.conversation.memory = memory;
    runtime rt{opts};
    preload(rt, threads, 12, 40);
    if (memory)
      for (int i = 0; i < 2000; ++i)
        rt.store_memory("Note " + std::to_string(i)
                          + ": the user asked about rivers, lakes and "
                            "mountains. It prefers short answers.",
                        memory_tags("user-" + std::to_string(i % 16),
                                    thread_name(static_cast<size_t>(i))));
    // SQLite ranking is ~100x slower per build: fewer builds keep the run
    // short without changing the percentiles' meaning.
    auto n = memory ? builds / 100 : builds;
    for (size_t concurrency : {1, 64}) {
      measure_builds(rt, concurrency, n / 10, threads); // warm up
      auto r = measure_builds(rt, concurrency, n, threads);
      auto p50 = percentile(r.samples_us, 50);
      auto p99 = percentile(r.samples_us, 99);
      auto max = percentile(r.samples_us, 100);
      t.rows.push_back({memory ? "on (2000 entries, FTS5)" : "off", concurrency,
                        bench::fmt(static_cast<double>(n) / r.seconds),
                        bench::fmt(p50, 1), bench::fmt(p99, 1),
                        bench::fmt(max, 1),
                        concurrency == 64 ? (p99 < 1000 ? "yes" : "no") : "-"});
      if (r.errors > 0)
        std::cerr << "builder: " << r.errors << " errors\n";
    }
  }
  t.notes = {
    "Latency of one build: request sent to the context builder to prompt "
    "received (registry get -> thread history(12) and memory retrieval in "
    "parallel -> offline rewriter -> D7 assembly), measured by an "
    "event-based driver keeping `concurrent` builds in flight, "
      + std::to_string(builds) + " builds (memory on: "
      + std::to_string(builds / 100)
      + ") after a warm-up of a tenth as many. A build of a resident "
        "thread reads its published turn log (no message to the registry "
        "or the thread); builders are a round-robin pool, one per "
        "scheduler thread.",
    "memory on: each build also ranks the requesting user's entries with "
    "SQLite FTS5 (bm25) in the detached memory actor, which serialises "
    "retrievals.",
    "Target: p99 under 1 ms at 64 concurrent builds."};
  rep.add(std::move(t));
}

// The machine's own scheduling noise: threads that only read the clock, one
// per core, see gaps whenever the kernel or the hypervisor takes their CPU.
// Every in-flight build on a stalled core waits as long, so these gaps bound
// how low a latency tail can go here, whatever the runtime does.
void machine_noise(report& rep, bool quick) {
  const double secs = quick ? 0.3 : 2.0;
  auto cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::vector<double>> gaps(cores);
  std::vector<std::thread> pool;
  for (unsigned c = 0; c < cores; ++c)
    pool.emplace_back([&, c] {
      auto start = clock::now();
      auto last = start;
      for (;;) {
        auto now = clock::now();
        auto gap = std::chrono::duration<double, std::micro>(now - last).count();
        if (gap > 100)
          gaps[c].push_back(gap);
        last = now;
        if (now - start > std::chrono::duration<double>(secs))
          break;
      }
    });
  for (auto& t : pool)
    t.join();
  std::vector<double> all;
  for (auto& g : gaps)
    all.insert(all.end(), g.begin(), g.end());
  auto count_over = [&](double us) {
    return static_cast<double>(
             std::count_if(all.begin(), all.end(),
                           [us](double g) { return g > us; }))
           / secs / cores;
  };
  double stalled = 0;
  for (auto g : all)
    stalled += g;
  table t;
  t.title = "Scheduling noise of this machine (baseline of the latency tails)";
  t.columns = {"threads", "gaps over 0.5 ms per s per core",
               "gaps over 1 ms per s per core", "max gap us", "time stalled %"};
  t.add_row(cores, bench::fmt(count_over(500), 1),
            bench::fmt(count_over(1000), 1),
            bench::fmt(all.empty() ? 0.0 : *std::max_element(all.begin(),
                                                             all.end()),
                       1),
            bench::fmt(stalled / 1e6 / secs / cores * 100, 2));
  t.notes = {
    "One thread per core reading the clock in a loop for "
      + bench::fmt(secs, 1)
      + " s; a gap is time between two reads over 100 us, when the thread "
        "did not run (the kernel or the hypervisor took the core). A build "
        "in flight on a stalled core waits as long, so a p99 can only be "
        "under 1 ms where stalls over 1 ms take well under 1% of the time."};
  rep.add(std::move(t));
}

// -- 3. resident memory -------------------------------------------------------

void resident_memory(report& rep, bool quick) {
  const size_t threads = quick ? 10000 : 100000;
  const size_t turns = 10;
  const size_t content = 64;
  auto actor_bytes = in_child([&] {
    spdlog::set_level(spdlog::level::warn);
    runtime_options opts;
    opts.conversation.memory = false;
    runtime rt{opts};
    auto before = rss_bytes();
    auto handles = preload(rt, threads, turns, content);
    if (rt.count_threads() != threads || handles.size() != threads
        || rt.snapshot(thread_name(threads - 1))->turns.size() != turns)
      std::cerr << "rss: the actor store is incomplete\n";
    handles.clear();
    return rss_bytes() - before;
  });
  auto mutex_bytes = in_child([&] {
    auto before = rss_bytes();
    auto seed = std::make_unique<mutex_store>();
    std::string filler(content, 'x');
    for (size_t i = 0; i < turns; ++i)
      for (size_t th = 0; th < threads; ++th)
        seed->add_turn(thread_name(th), i % 2 == 0
                                          ? make_user_turn(filler)
                                          : make_assistant_turn(filler));
    auto after = rss_bytes();
    if (seed->history(thread_name(0), 100).size() != turns)
      std::cerr << "rss: the mutex store is incomplete\n";
    return after - before;
  });
  auto total_turns = static_cast<double>(threads * turns);
  table t;
  t.title = "Resident memory of " + bench::fmt(static_cast<double>(threads))
            + " threads x " + std::to_string(turns) + " turns ("
            + std::to_string(content) + "-byte contents)";
  t.columns = {"store", "RSS growth MiB", "bytes/turn", "bytes/thread"};
  auto row = [&](const char* name, uint64_t bytes) {
    t.rows.push_back(
      {name, bench::fmt(static_cast<double>(bytes) / 1048576.0, 1),
       bench::fmt(static_cast<double>(bytes) / total_turns),
       bench::fmt(static_cast<double>(bytes) / static_cast<double>(threads))});
  };
  row("thread actors", actor_bytes);
  row("mutex store", mutex_bytes);
  t.notes = {
    "RSS growth of a fresh child process while the store is filled (the "
    "actors through the registry, lazily spawned thread actors, memory "
    "off). bytes/turn includes each thread's share of its container: an "
    "actor (mailbox, state, registry entry) for spindle, a map node and "
    "vector for the mutex store.",
    "sizeof(turn) = " + std::to_string(sizeof(turn))
      + " bytes; a 64-byte content adds one heap block."};
  rep.add(std::move(t));
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  report rep{"threads"};
  if (report::selected(argc, argv, "throughput"))
    throughput(rep, quick);
  if (report::selected(argc, argv, "builder")) {
    builder_latency(rep, quick);
    machine_noise(rep, quick);
  }
  // Forks children; every runtime of this process has stopped by now, so
  // no other thread is running.
  if (report::selected(argc, argv, "rss"))
    resident_memory(rep, quick);
  rep.write(report::json_path(argc, argv, "threads"));
  return 0;
}
