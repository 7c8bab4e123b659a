// Compaction off the reply path (docs/threads.md, "Compaction"): with a
// summary model that takes 5 s, messages whose prompts start a compaction
// job get their first delta and their whole reply as fast as messages that
// start none, measured in the same run side by side.
//
//   bench_compaction [--quick] [--json PATH]

#include <chrono>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "report.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/runtime/summarizer.hpp"

using namespace spindle;
using namespace spindle::bench;

namespace {

// A summary model that takes `delay` and answers with a short summary, as
// a remote model does: asynchronously, one timer thread for all calls (an
// OpenAI-compatible provider answers on its event loop the same way).
class slow_summarizer : public summarizer {
public:
  explicit slow_summarizer(std::chrono::milliseconds delay)
    : delay_(delay), timer_([this] { run(); }) {
  }
  ~slow_summarizer() override {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stop_ = true;
    }
    cv_.notify_all();
    timer_.join();
  }
  std::string name() const override {
    return "slow";
  }
  caf::expected<std::string> summarize(const summary_input& in) override {
    std::this_thread::sleep_for(delay_);
    return text(in);
  }
  bool start(summary_input in, summary_done done) override {
    std::lock_guard<std::mutex> guard{mtx_};
    queue_.push_back({clock::now() + delay_, text(in), std::move(done)});
    cv_.notify_all();
    return true;
  }

private:
  struct call {
    clock::time_point due;
    std::string text;
    summary_done done;
  };
  static std::string text(const summary_input& in) {
    return "a summary of " + std::to_string(in.turns.size()) + " turns";
  }
  void run() {
    std::unique_lock<std::mutex> guard{mtx_};
    for (;;) {
      cv_.wait(guard, [this] { return stop_ || !queue_.empty(); });
      if (stop_)
        break;
      auto due = queue_.front().due;
      if (cv_.wait_until(guard, due, [this] { return stop_; }))
        break;
      auto next = std::move(queue_.front());
      queue_.pop_front();
      guard.unlock();
      next.done(std::move(next.text));
      guard.lock();
    }
    // Calls still waiting fail: the runtime is stopping.
    for (auto& c : queue_)
      c.done(make_error(errc::unavailable, "stopping"));
  }

  std::chrono::milliseconds delay_;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<call> queue_;
  bool stop_ = false;
  std::thread timer_;
};

struct samples {
  std::vector<double> first_ms;
  std::vector<double> total_ms;
  size_t errors = 0;
};

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  report rep{"compaction"};
  spdlog::set_level(spdlog::level::warn);
  const int threads_per_group = quick ? 4 : 16;
  const int messages = quick ? 6 : 12;
  const auto summary_delay = std::chrono::milliseconds{5000};

  runtime_options opts;
  // Replies stream in 8 pieces 15 ms apart: about 120 ms each.
  opts.provider = std::make_shared<offline_provider>(
    std::chrono::milliseconds{15});
  auto model = std::make_shared<slow_summarizer>(summary_delay);
  opts.conversation.summary_maker = model;
  opts.conversation.compact_min_turns = 2;
  runtime rt{opts};

  // Two groups side by side: a window of 2 turns (from the third message
  // on, the prompt leaves turns out and asks for a 5 s summary job), and a
  // window of 1,000 turns (never).
  samples starting, during, plain;
  std::mutex mtx;
  std::vector<std::thread> clients;
  for (int g = 0; g < 2; ++g)
    for (int t = 0; t < threads_per_group; ++t)
      clients.emplace_back([&, g, t] {

        std::string id = (g == 0 ? "compacting-" : "plain-")
                         + std::to_string(t);
        for (int m = 0; m < messages; ++m) {
          exchange_request x;
          x.thread_id = id;
          x.content = "message " + std::to_string(m) + " about rivers";
          x.build.max_turns = g == 0 ? 2 : 1000;
          auto start = clock::now();
          double first = -1;
          auto r = rt.send_message(x, [&](std::string_view) {
            if (first < 0)
              first = seconds_since(start) * 1e3;
            return true;
          });
          auto total = seconds_since(start) * 1e3;
          std::lock_guard<std::mutex> guard{mtx};
          // A compacting thread's third message starts its job (the first
          // prompt that leaves 2 turns out); the later ones run while it
          // runs (one job per thread at a time, 5 s).
          auto& out = g == 1 ? plain : m == 2 ? starting : during;
          if (!r || first < 0) {
            ++out.errors;
            continue;
          }
          if (g == 0 && m < 2)
            continue;
          out.first_ms.push_back(first);
          out.total_ms.push_back(total);
        }
      });
  for (auto& c : clients)
    c.join();
  auto stats = rt.compaction();

  table t;
  t.title = "Reply latency with a 5 s summary model: messages that start "
            "compaction beside messages that do not (same run)";
  t.columns = {"messages", "count", "first delta p50 ms", "first delta p99 ms",
               "reply p50 ms", "reply p99 ms", "p50 first / plain",
               "p50 reply / plain", "within 5%"};
  auto p = [](std::vector<double> v, double q) { return percentile(v, q); };
  auto pf = p(plain.first_ms, 50), pt = p(plain.total_ms, 50);
  auto row = [&](const char* name, const samples& x) {
    auto f = p(x.first_ms, 50), r = p(x.total_ms, 50);
    bool ok = f <= 1.05 * pf && r <= 1.05 * pt;
    t.add_row(name, static_cast<double>(x.first_ms.size()), bench::fmt(f, 1),
              bench::fmt(p(x.first_ms, 99), 1), bench::fmt(r, 1),
              bench::fmt(p(x.total_ms, 99), 1), bench::fmt(f / pf, 3),
              bench::fmt(r / pt, 3), ok ? "yes" : "NO");
  };
  row("start a compaction job", starting);
  row("run while their thread's job runs", during);
  t.add_row("leave no turn out (window of 1,000)",
            static_cast<double>(plain.first_ms.size()), bench::fmt(pf, 1),
            bench::fmt(p(plain.first_ms, 99), 1), bench::fmt(pt, 1),
            bench::fmt(p(plain.total_ms, 99), 1), "1", "1", "baseline");
  t.notes = {
    std::to_string(2 * threads_per_group) + " client threads, " +
      std::to_string(messages) +
      " messages each in turn, half on threads whose prompts keep 2 turns "
      "(max_turns 2: from their third message on, each prompt leaves "
      "turns out and asks for a compaction job), half on threads that "
      "keep every turn; all at once, so the machine's noise falls on both. "
      "Offline provider streaming 8 pieces 15 ms apart; a summarizer that "
      "takes 5 s per summary (compact_min_turns 2). A compacting thread's "
      "first two messages leave nothing out and are not counted; its third "
      "starts its job; the later ones run while the job runs.",
    "Compaction jobs: " + std::to_string(stats.started) + " started, " +
      std::to_string(stats.stored) + " stored, " +
      std::to_string(stats.failed) + " failed during the run; errors: " +
      std::to_string(starting.errors + during.errors + plain.errors) +
      ". Target: p50 first delta and p50 reply of the compacting messages "
      "within 5% of the others (the reply never waits for a summary)."};
  rep.add(std::move(t));
  if (stats.started == 0 || starting.errors + during.errors + plain.errors > 0) {
    std::cerr << "compaction: no job started, or exchanges failed\n";
    return 1;
  }
  rep.write(report::json_path(argc, argv, "compaction"));
  return 0;
}
