// Injected storage faults (docs/reliability.md, "Injected faults"): a
// fault-injecting SQLite VFS (fault_vfs.hpp) under a runtime on a data
// directory. I/O errors on writes and on fsyncs, and slow fsyncs: writes
// are refused with a clear error, reads go on, nothing acknowledged is
// lost, no ID is handed out twice, and writes succeed again by themselves
// once the fault ends. The full disk is `test_server`'s (a real, small
// filesystem under `spindle serve`).

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "fault_vfs.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using spindle::test::fault_vfs;

namespace {

runtime_options on_disk(const std::string& dir) {
  runtime_options opts;
  opts.storage.data_dir = dir;
  opts.storage.sync = sync_mode::full; // every commit syncs
  opts.conversation.memory = false;
  return opts;
}

std::string thread_of(int n) {
  return "fault-" + std::to_string(n % 4);
}

// Every acknowledged turn is in its thread, in order, and nothing else is.
void check_threads(runtime& rt,
                   const std::map<std::string, std::vector<std::string>>& acked) {
  for (auto& [thread, contents] : acked) {
    auto snap = rt.snapshot(thread);
    REQUIRE(snap);
    std::vector<std::string> stored;
    for (auto& t : snap->turns)
      stored.push_back(t.content);
    INFO("thread " << thread);
    CHECK(stored == contents);
  }
}

struct fault_case {
  const char* name;
  void (*inject)(fault_vfs&);
};

} // namespace

TEST_CASE("injected faults: writes and fsyncs that fail are refused with "
          "storage_failure - reads go on - nothing acknowledged is lost or "
          "reissued - writes succeed again when the fault ends") {
  auto& faults = fault_vfs::install();
  const fault_case cases[] = {
    {"write errors", [](fault_vfs& f) { f.fail_writes = true; }},
    {"fsync errors", [](fault_vfs& f) { f.fail_syncs = true; }},
  };
  for (auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      spindle::test::temp_dir dir;
      faults.heal();
      faults.match(dir.str());
      std::map<std::string, std::vector<std::string>> acked;
      std::set<std::string> ids;
      auto take_id = [&](runtime& rt) {
        auto id = rt.next_context_id();
        if (id) {
          INFO(*id);
          CHECK(ids.insert(*id).second); // never handed out twice
        } else {
          CHECK(is_storage_error(id.error()));
        }
        return static_cast<bool>(id);
      };
      {
        runtime rt{on_disk(dir.str())};
        for (int n = 0; n < 40; ++n) {
          auto content = "before " + std::to_string(n);
          REQUIRE(rt.add_turn(thread_of(n), make_user_turn(content)));
          acked[thread_of(n)].push_back(content);
          REQUIRE(take_id(rt));
        }
      }
      {
        // A new runtime: the threads are read from the file during the
        // fault.
        runtime rt{on_disk(dir.str())};
        auto before = faults.injected.load();
        c.inject(faults);
        // Four writers at once: every write is refused, none is kept.
        std::atomic<int> refused{0}, unclear{0}, stored{0};
        std::vector<std::thread> writers;
        for (int w = 0; w < 4; ++w)
          writers.emplace_back([&, w] {
            for (int k = 0; k < 5; ++k) {
              auto got = rt.add_turn(thread_of(w),
                                     make_user_turn("refused " + std::to_string(k)));
              if (got)
                ++stored;
              else if (classify(got.error()) == errc::storage_failure)
                ++refused;
              else
                ++unclear;
            }
          });
        for (auto& t : writers)
          t.join();
        CHECK(stored == 0);
        CHECK(unclear == 0);
        CHECK(refused == 20);
        CHECK(faults.injected.load() > before);
        // Reads go on: from the file and from the threads' memory.
        check_threads(rt, acked);
        for (int k = 0; k < 2000; ++k)
          if (!take_id(rt))
            break; // the reservation ran out: refused, not reissued
        auto built = rt.build_context(thread_of(0), "", "and now?");
        REQUIRE(built);
        CHECK(built->history_turns == 10);
        // The fault ends: the next writes succeed, without a restart.
        faults.heal();
        for (int n = 0; n < 8; ++n) {
          auto content = "after " + std::to_string(n);
          auto got = rt.add_turn(thread_of(n), make_user_turn(content));
          INFO(describe(got ? caf::error{} : got.error()));
          REQUIRE(got);
          acked[thread_of(n)].push_back(content);
          REQUIRE(take_id(rt));
        }
        check_threads(rt, acked);
      }
      // After a restart: exactly what was acknowledged, and no ID again.
      runtime rt{on_disk(dir.str())};
      check_threads(rt, acked);
      for (int k = 0; k < 20; ++k)
        CHECK(take_id(rt));
      CHECK(spindle::test::integrity_check(dir.path() / "spindle.db") == "ok");
      faults.match("no file matches this");
    }
  }
}

TEST_CASE("injected faults: a slow fsync delays only the writes waiting "
          "for it - reads and context builds are answered while it "
          "lasts") {
  auto& faults = fault_vfs::install();
  spindle::test::temp_dir dir;
  faults.heal();
  faults.match(dir.str());
  runtime rt{on_disk(dir.str())};
  REQUIRE(rt.add_turn("slow", make_user_turn("first")));
  REQUIRE(rt.add_turn("other", make_user_turn("unrelated")));
  faults.sync_delay_ms = 3000;
  std::atomic<bool> written{false}, stored{false};
  std::thread writer{[&] {
    stored = static_cast<bool>(rt.add_turn("slow", make_user_turn("second")));
    written = true;
  }};
  // Wait until the writer's commit is inside its fsync.
  for (int k = 0; k < 2000 && faults.syncing.load() == 0; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  REQUIRE(faults.syncing.load() > 0);
  // While it lasts: reads of both threads, a build, an ID from the
  // reservation.
  auto other = rt.history("other");
  auto slow = rt.history("slow");
  auto built = rt.build_context("other", "", "and then?");
  bool during = faults.syncing.load() > 0 && !written.load();
  faults.sync_delay_ms = 0;
  writer.join();
  CHECK(during); // all of them answered before the fsync returned
  REQUIRE(other);
  CHECK(other->size() == 1);
  REQUIRE(slow);
  CHECK(slow->front().content == "first");
  REQUIRE(built);
  CHECK(stored);
  auto snap = rt.snapshot("slow");
  REQUIRE(snap);
  CHECK(snap->turns.size() == 2);
  faults.match("no file matches this");
}
