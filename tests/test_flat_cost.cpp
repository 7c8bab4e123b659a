// Flat cost (docs/threads.md, "Flat cost"): the work one exchange does
// does not grow with its thread or with its user's long-term memory. The
// tests count work (turns copied, loaded and summarized; memory rows and
// postings read and written: messages/work.hpp) over a number of
// exchanges while the thread, and then the user's scope, grow, and hold
// the count per exchange under a constant at every size.

#include <chrono>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <httplib.h>

#include "spindle/messages/work.hpp"
#include "spindle/runtime/memory.hpp"
#include "spindle/runtime/runtime.hpp"
#include "storage/sql_connection.hpp"
#include "support.hpp"
#include "memory/memory_index.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

// What users send: 12 words of 26 words x 1,000 numbers ("kilo417").
std::string random_words(std::mt19937& gen, int n = 12) {
  static const char* words[]
    = {"alpha",   "bravo",  "charlie", "delta",  "echo",     "foxtrot",
       "golf",    "hotel",  "india",   "juliett", "kilo",    "lima",
       "mike",    "november", "oscar", "papa",   "quebec",   "romeo",
       "sierra",  "tango",  "uniform", "victor", "whiskey",  "xray",
       "yankee",  "zulu"};
  std::string out;
  for (int i = 0; i < n; ++i) {
    if (i > 0)
      out += ' ';
    out += words[gen() % 26];
    out += std::to_string(gen() % 1000);
  }
  return out;
}

runtime_options durable(const test::test_store& dir) {
  runtime_options opts;
  dir.apply(opts.storage);
  opts.storage.sync = sync_mode::normal;
  return opts;
}

// Waits until no compaction job runs (they run after the reply).
void settle(runtime& rt) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (rt.compaction().running > 0
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  REQUIRE(rt.compaction().running == 0);
}

// The work of `n` exchanges on `thread` for `user`, once their compaction
// jobs and memory stores are done (a store sent after them is answered
// after theirs: the writer stores in arrival order).
work_snapshot work_of(runtime& rt, const std::string& thread,
                      const std::string& user, int n, std::mt19937& gen) {
  settle(rt);
  REQUIRE(rt.store_memory("barrier " + random_words(gen, 2),
                          memory_tags(user, thread)));
  auto before = read_work();
  for (int i = 0; i < n; ++i) {
    auto r = rt.send_message(thread, random_words(gen), user);
    REQUIRE(r);
  }
  settle(rt);
  REQUIRE(rt.store_memory("barrier " + random_words(gen, 2),
                          memory_tags(user, thread)));
  return read_work() - before;
}


} // namespace

TEST_CASE("flat cost: the turns an exchange copies, loads and summarizes "
          "stay under a constant while its thread grows from 10 to 10,000 "
          "turns") {
  test::test_store dir;
  runtime rt{durable(dir)};
  std::mt19937 gen{7};
  std::string thread = "long";
  std::string user = "heavy";
  const int per_point = 20;
  // Per exchange: the builder may copy its window (at most 12 turns);
  // compaction copies and folds the two turns an exchange pushes out of
  // the window (four every other exchange). A snapshot of the thread, as
  // compaction once took, is 50 per exchange at 100 turns already.
  const double bound = 32;
  std::vector<std::pair<uint64_t, double>> seen;
  uint64_t turns = 0;
  for (uint64_t target : {10u, 100u, 1000u, 10000u}) {
    while (turns < target) {
      auto r = rt.send_message(thread, random_words(gen), user);
      REQUIRE(r);
      turns = r->turns;
    }
    auto w = work_of(rt, thread, user, per_point, gen);
    auto per = static_cast<double>(w[work_kind::turns_copied] + w[work_kind::turns_loaded]
                                   + w[work_kind::turns_summarized])
               / per_point;
    INFO("at " << turns << " turns: " << w[work_kind::turns_copied] << " copied, "
               << w[work_kind::turns_loaded] << " loaded, " << w[work_kind::turns_summarized]
               << " summarized over " << per_point << " exchanges");
    CHECK(per <= bound);
    // Compaction keeps up: it folds what leaves the window, not less.
    CHECK(w[work_kind::turns_summarized] >= 2 * per_point - 16);
    seen.emplace_back(turns, per);
  }
  // And the summary keeps covering all but the window.
  auto snap = rt.snapshot(thread);
  REQUIRE(snap);
  CHECK(snap->summary.upto + 24 >= snap->turns.size());
  REQUIRE(seen.size() == 4);
  CHECK(seen.back().first >= 10000);
}

TEST_CASE("flat cost: the memory rows and postings an exchange reads and "
          "writes stay under a constant while its user's scope grows from "
          "10 to 50,000 entries") {
  test::test_store dir;
  std::mt19937 gen{11};
  std::string user = "writer";
  const int per_point = 20;
  // Per exchange, whatever the scope holds: one store (the entry, the
  // scope's row read and written, a term list read and written per
  // distinct word: at most 64 words in a message and its offline reply)
  // and one retrieval (the scope, at most 32 lists, at most 64 entries);
  // a list holds at most 64 postings. A scan of the scope would read
  // thousands of rows.
  const double rows_bound = 4 + 2 * 64 + 1 + 32 + 64;
  const double postings_bound = 64 * (2 * 64 + 32);
  size_t stored = 0;
  for (size_t target : {size_t{10}, size_t{1000}, size_t{10000},
                        size_t{50000}}) {
    {
      // The scope grows through the memory writer, a batch at a time, as
      // months of exchanges would grow it.
      auto db = dir.memory_connection();
      auto writer = memory_writer::open(*db);
      REQUIRE(writer);
      std::vector<memory_entry> batch;
      while (stored < target) {
        batch.push_back({"User: " + random_words(gen) + "\nAssistant: "
                           + random_words(gen, 8),
                         memory_scope{user, ""}});
        ++stored;
        if (batch.size() == 5000 || stored == target) {
          REQUIRE((*writer)->store_all(batch));
          batch.clear();
        }
      }
    }
    runtime rt{durable(dir)};
    std::string thread = "t" + std::to_string(target);
    // The thread's activation and the readers' first reads are not what
    // is measured.
    for (int i = 0; i < 3; ++i)
      REQUIRE(rt.send_message(thread, random_words(gen), user));
    auto w = work_of(rt, thread, user, per_point, gen);
    auto rows = static_cast<double>(w[work_kind::memory_rows_read] + w[work_kind::memory_rows_written])
                / per_point;
    auto postings = static_cast<double>(w[work_kind::memory_postings_read]
                                        + w[work_kind::memory_postings_written])
                    / per_point;
    INFO("at " << target << " entries: " << w[work_kind::memory_rows_read]
               << " rows read, " << w[work_kind::memory_rows_written] << " written, "
               << w[work_kind::memory_postings_read] << " postings read, "
               << w[work_kind::memory_postings_written] << " written over " << per_point
               << " exchanges");
    CHECK(rows <= rows_bound);
    CHECK(postings <= postings_bound);
    // Something was counted: each exchange stores its entry.
    CHECK(w[work_kind::memory_rows_written] >= static_cast<uint64_t>(per_point));
  }
}

TEST_CASE("flat cost: /metrics shows the counted work by kind, and the "
          "turns a server's compaction summarized") {
  test::temp_dir dir;
  test::server_process srv{{"--data", dir.str()}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  cli.set_read_timeout(30, 0);
  // A window of 2 turns: from the third message on, turns leave it.
  for (int i = 0; i < 8; ++i) {
    auto [code, body] = test::post_json(
      cli, "/v1/threads/counted/messages",
      {{"content", "message number " + std::to_string(i)},
       {"user_id", "counter"},
       {"max_turns", 2}});
    REQUIRE(code == 200);
  }
  auto value = [&](const std::string& kind) {
    auto m = cli.Get("/metrics");
    REQUIRE(m);
    std::smatch match;
    std::regex line{"spindle_work_total\\{kind=\"" + kind
                    + "\"\\} ([0-9.e+]+)"};
    REQUIRE(std::regex_search(m->body, match, line));
    return std::stod(match[1].str());
  };
  for (auto* kind : work_kind_names)
    value(kind);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (value("turns_summarized") < 4
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  CHECK(value("turns_summarized") >= 4);
  CHECK(value("memory_rows_written") >= 8);
}
