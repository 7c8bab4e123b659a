// File-counter claims (`spindle id next`, seed 003, D2, D3): sequences per
// prefix, concurrent processes with and without seed-protocol neighbours,
// recovery of a dead claimer's file, and bad input.

#include <cstdio>
#include <fstream>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <unistd.h>

#include "spindle/messages/error.hpp"
#include "files/file_counter.hpp"
#include "spindle/runtime/process.hpp"
#include "support.hpp"

using namespace spindle;
namespace fs = std::filesystem;

namespace {

std::string next_id(const test::temp_dir& root,
                    const std::string& prefix = "global") {
  auto r = test::run({test::spindle_binary(), "id", "next", "--root",
                      root.str(), "--prefix", prefix});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto ls = test::lines(r.out);
  REQUIRE(ls.size() == 1);
  return ls[0];
}

fs::path counters(const test::temp_dir& root) {
  return root.path() / "ai_comms" / "counters";
}

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream{p} << text;
}

std::string read_file(const fs::path& p) {
  std::ifstream in{p};
  return std::string{std::istreambuf_iterator<char>{in}, {}};
}

std::string seed_script() {
  return std::string{SPINDLE_SOURCE_DIR} + "/bench/seed_claim.sh";
}

// Runs `loops` shell loops at once, each claiming `per_loop` IDs, and
// returns every ID printed.
std::vector<std::string> claim_concurrently(const test::temp_dir& root,
                                            int spindle_loops, int per_loop,
                                            int seed_loops = 0,
                                            int per_seed_loop = 0) {
  std::vector<std::string> outputs(spindle_loops + seed_loops);
  std::vector<int> codes(outputs.size(), -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < spindle_loops; ++i)
    threads.emplace_back([&, i] {
      auto script = "for i in $(seq " + std::to_string(per_loop) + "); do '"
                    + test::spindle_binary() + "' id next --root '"
                    + root.str() + "' || exit 1; done";
      auto r = test::run({"bash", "-c", script});
      outputs[i] = r.out;
      codes[i] = r.exit_code;
    });
  for (int i = 0; i < seed_loops; ++i)
    threads.emplace_back([&, i] {
      auto r = test::run({"bash", seed_script(), root.str(), "global",
                          std::to_string(per_seed_loop)});
      outputs[spindle_loops + i] = r.out;
      codes[spindle_loops + i] = r.exit_code;
    });
  for (auto& t : threads)
    t.join();
  for (auto code : codes)
    REQUIRE(code == 0);
  std::vector<std::string> all;
  for (auto& out : outputs)
    for (auto& line : test::lines(out))
      all.push_back(line);
  return all;
}

size_t duplicates(const std::vector<std::string>& ids) {
  std::set<std::string> unique(ids.begin(), ids.end());
  return ids.size() - unique.size();
}

} // namespace

TEST_CASE("id next: global, orchestration and task prefixes give the D2 "
          "sequences") {
  test::temp_dir root;
  CHECK(next_id(root) == "0001");
  CHECK(next_id(root) == "0002");
  CHECK(next_id(root, "0001") == "0001_t1");
  CHECK(next_id(root, "0001") == "0001_t2");
  CHECK(next_id(root, "0001_t1") == "0001_t1.1");
  CHECK(next_id(root, "0001_t1.1") == "0001_t1.1.1");
  CHECK(read_file(counters(root) / "global.NextId") == "0003\n");
}

TEST_CASE("id next: counters cross tiers - task levels render as decimals") {
  test::temp_dir root;
  write_file(counters(root) / "global.NextId", "9999\n");
  CHECK(next_id(root) == "9999");
  CHECK(next_id(root) == "A000");
  CHECK(read_file(counters(root) / "global.NextId") == "A001\n");
  write_file(counters(root) / "0001.NextId", "A000\n");
  CHECK(next_id(root, "0001") == "0001_t10000");
  write_file(counters(root) / "0002.NextId", "0012\n");
  CHECK(next_id(root, "0002") == "0002_t12");
}

TEST_CASE("id next: a counter holding 0000 hands out 0001") {
  test::temp_dir root;
  write_file(counters(root) / "global.NextId", "0000\n");
  CHECK(next_id(root) == "0001");
  CHECK(next_id(root) == "0002");
}

TEST_CASE("id next: ZZZY and ZZZZ are handed out - then the counter is "
          "exhausted and says so with exit code 1") {
  test::temp_dir root;
  auto file = counters(root) / "global.NextId";
  write_file(file, "ZZZY\n");
  CHECK(next_id(root) == "ZZZY");
  CHECK(read_file(file) == "ZZZZ\n");
  CHECK(next_id(root) == "ZZZZ");
  // Past ZZZZ the file holds the end marker, which is no hybrid value.
  CHECK(read_file(file) == "exhausted\n");
  for (int again = 0; again < 2; ++again) {
    auto r = test::run({test::spindle_binary(), "id", "next", "--root",
                        root.str()});
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK(r.err.find("spindle id next: exhausted: counter '" + file.string()
                     + "' is exhausted: ZZZZ, the last 4-character value, "
                       "was handed out")
          != std::string::npos);
    CHECK(read_file(file) == "exhausted\n");
  }
  // The library call says the same, and task levels end the same way.
  auto direct = claim_next_id(root.path(), "global");
  REQUIRE_FALSE(direct);
  CHECK(classify(direct.error()) == errc::exhausted);
  write_file(counters(root) / "0001.NextId", "ZZZZ\n");
  CHECK(next_id(root, "0001") == "0001_t736335");
  auto task = claim_next_id(root.path(), "0001");
  REQUIRE_FALSE(task);
  CHECK(classify(task.error()) == errc::exhausted);
}

TEST_CASE("id next: a dead claimer at the end of the sequence never makes "
          "ZZZZ come back") {
  test::temp_dir root;
  auto dir = counters(root);
  write_file(dir / "global.NextId", "0001\n");
  REQUIRE(next_id(root) == "0001");
  fs::remove(dir / "global.NextId");
  auto claim = dir / ("global.NextId.claimed."
                      + std::to_string(test::dead_pid()));
  std::vector<std::string> expected;
  SECTION("it held ZZZY: ZZZY is skipped, ZZZZ is still handed out") {
    write_file(claim, "ZZZY\n");
    expected = {"ZZZZ"};
  }
  SECTION("it held ZZZZ and may have handed it out") {
    write_file(claim, "ZZZZ\n");
  }
  SECTION("it held the end marker") {
    write_file(claim, "exhausted\n");
  }
  auto claim_args = std::vector<std::string>{
    test::spindle_binary(), "id", "next", "--root", root.str(),
    "--stale-grace", "0", "--timeout", "10"};
  for (auto& id : expected) {
    auto r = test::run(claim_args);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == id + "\n");
  }
  auto r = test::run(claim_args);
  CHECK(r.exit_code == 1);
  CHECK(r.out.empty());
  CHECK(r.err.find("exhausted") != std::string::npos);
  CHECK(read_file(dir / "global.NextId") == "exhausted\n");
  CHECK_FALSE(fs::exists(claim));
}

TEST_CASE("id next: an invalid prefix or root is refused with exit code 2 "
          "and touches no file") {
  test::temp_dir root;
  for (auto bad : {"../x", "", "0000", "ctx", "0001/../x", "0001_t0",
                   "global/x", "a b"}) {
    INFO(bad);
    auto r = test::run({test::spindle_binary(), "id", "next", "--root",
                        root.str(), "--prefix", bad});
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK_FALSE(r.err.empty());
  }
  CHECK(fs::is_empty(root.path()));
  auto r = test::run({test::spindle_binary(), "id", "next", "--root",
                      (root.path() / "missing").string()});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("is not a directory") != std::string::npos);
  CHECK(fs::is_empty(root.path()));
}

TEST_CASE("id next: root defaults to $AI_ROOT") {
  test::temp_dir root;
  auto r = test::run({test::spindle_binary(), "id", "next"}, "",
                     {{"AI_ROOT", root.str()}});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "0001\n");
  CHECK(fs::exists(counters(root) / "global.NextId"));
}

// Each claim is a `spindle id next` process: 4,000 of them take about a
// minute, and about 70 under ASan, whose every start costs about a
// second; .ci/sanitize asks for fewer with SPINDLE_ID_CLAIMS.
TEST_CASE("id next: 8 concurrent processes x 500 claims on a fresh root "
          "give 0 duplicates and no gaps (SPINDLE_ID_CLAIMS per process)") {
  test::temp_dir root;
  auto per_process = test::env_number("SPINDLE_ID_CLAIMS", 500);
  REQUIRE(per_process > 0);
  REQUIRE(per_process <= 1000);
  auto ids = claim_concurrently(root, 8, static_cast<int>(per_process));
  REQUIRE(ids.size() == 8 * per_process);
  CHECK(duplicates(ids) == 0);
  std::set<std::string> unique(ids.begin(), ids.end());
  CHECK(*unique.begin() == "0001");
  char last[16];
  std::snprintf(last, sizeof last, "%04u",
                static_cast<unsigned>(8 * per_process));
  CHECK(*unique.rbegin() == last);
}

TEST_CASE("id next: spindle claims beside seed-protocol shell loops give 0 "
          "duplicates") {
  test::temp_dir root;
  REQUIRE(next_id(root) == "0001"); // the seed's loop needs the counter
  auto ids = claim_concurrently(root, 4, 150, 4, 60);
  REQUIRE(ids.size() == 4 * 150 + 4 * 60);
  CHECK(duplicates(ids) == 0);
  CHECK(std::find(ids.begin(), ids.end(), "0001") == ids.end());
}

TEST_CASE("id next: threads of one process claim side by side without "
          "duplicates") {
  test::temp_dir root;
  std::vector<std::vector<std::string>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        auto id = claim_next_id(root.path(), "0001_t3");
        if (id)
          got[t].push_back(*id);
      }
    });
  for (auto& t : threads)
    t.join();
  std::vector<std::string> all;
  for (auto& g : got) {
    REQUIRE(g.size() == 100);
    all.insert(all.end(), g.begin(), g.end());
  }
  CHECK(duplicates(all) == 0);
}

TEST_CASE("id next: a claim file left by a killed claimer is recovered and "
          "its value is never reissued") {
  test::temp_dir root;
  REQUIRE(next_id(root) == "0001");
  auto dir = counters(root);
  SECTION("a seed-style claim file of a dead PID") {
    // The claimer renamed the counter (holding 0005) and was killed.
    fs::remove(dir / "global.NextId");
    auto dead = test::dead_pid();
    write_file(dir / ("global.NextId.claimed." + std::to_string(dead)),
               "0005\n");
  }
  SECTION("a spindle claim file whose PID now belongs to another process") {
    fs::remove(dir / "global.NextId");
    auto alive = self_identity();
    write_file(dir / ("global.NextId.claimed." + std::to_string(alive.pid)
                      + "." + std::to_string(alive.start_time + 12345)
                      + ".1"),
               "0005\n");
  }
  auto r = test::run({test::spindle_binary(), "id", "next", "--root",
                      root.str(), "--stale-grace", "0", "--timeout", "10"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "0006\n"); // 0005 may have been handed out: skipped
  CHECK(next_id(root) == "0007");
  for (auto& entry : fs::directory_iterator{dir})
    CHECK(entry.path().filename().string().find(".claimed.")
          == std::string::npos);
}

TEST_CASE("id next: a dead claimer's file is left alone during the grace "
          "period") {
  test::temp_dir root;
  REQUIRE(next_id(root) == "0001");
  auto dir = counters(root);
  fs::remove(dir / "global.NextId");
  auto claim = dir / ("global.NextId.claimed."
                      + std::to_string(test::dead_pid()));
  write_file(claim, "0002\n");
  auto r = test::run({test::spindle_binary(), "id", "next", "--root",
                      root.str(), "--stale-grace", "60000", "--timeout",
                      "0.3"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("timeout") != std::string::npos);
  CHECK(read_file(claim) == "0002\n");
}

TEST_CASE("id next: a live claimer's file is left alone - the caller times "
          "out with who holds it") {
  test::temp_dir root;
  REQUIRE(next_id(root) == "0001");
  auto dir = counters(root);
  fs::remove(dir / "global.NextId");
  auto me = self_identity();
  auto claim = dir / ("global.NextId.claimed." + std::to_string(me.pid) + "."
                      + std::to_string(me.start_time) + ".1");
  write_file(claim, "0002\n");
  auto r = test::run({test::spindle_binary(), "id", "next", "--root",
                      root.str(), "--stale-grace", "0", "--timeout", "0.3"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("held by process " + std::to_string(me.pid))
        != std::string::npos);
  CHECK(read_file(claim) == "0002\n");
  CHECK_FALSE(fs::exists(dir / "global.NextId"));
  // Once the holder releases, claims continue where it left off.
  fs::rename(claim, dir / "global.NextId");
  CHECK(next_id(root) == "0002");
}

TEST_CASE("id next: a leftover claim file of a claimer that released before "
          "dying is removed, not restored") {
  test::temp_dir root;
  auto dir = counters(root);
  write_file(dir / "global.NextId", "0007\n");
  write_file(dir / "global.NextId.init", "done\n");
  // The seed's release writes the counter first and removes its claim
  // second; a claimer killed in between leaves this behind.
  write_file(dir / ("global.NextId.claimed."
                    + std::to_string(test::dead_pid())),
             "0006\n");
  CHECK(next_id(root) == "0007");
  CHECK(next_id(root) == "0008");
}

TEST_CASE("id next --count: 4 concurrent processes claiming 300 each give "
          "1..1200 with each process's IDs increasing") {
  test::temp_dir root;
  std::vector<std::string> outs(4);
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p)
    threads.emplace_back([&, p] {
      auto r = test::run({test::spindle_binary(), "id", "next", "--count",
                          "300", "--root", root.str()});
      outs[p] = r.exit_code == 0 ? r.out : "";
    });
  for (auto& t : threads)
    t.join();
  std::set<std::string> all;
  for (auto& out : outs) {
    auto ids = test::lines(out);
    REQUIRE(ids.size() == 300);
    for (size_t i = 1; i < ids.size(); ++i)
      REQUIRE(ids[i - 1] < ids[i]); // 4-digit tier: string order is value order
    all.insert(ids.begin(), ids.end());
  }
  CHECK(all.size() == 1200);
  CHECK(*all.begin() == "0001");
  CHECK(*all.rbegin() == "1200");
}
