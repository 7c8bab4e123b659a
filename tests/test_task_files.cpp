// The seed's task directories through `spindle task ...` (the built binary)
// and the library behind it: queueing with file-counter IDs, D1 claims on
// files, exactly-once claims under concurrent processes, stale owners
// (dead, kill -9'd, PID reused), requeue, listing, and bad input.

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files/task_files.hpp"
#include "support.hpp"

using namespace spindle;
namespace fs = std::filesystem;

namespace {

test::process_result task(const test::temp_dir& root,
                          std::vector<std::string> args,
                          const std::string& input = {}) {
  std::vector<std::string> argv{test::spindle_binary(), "task"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--root");
  argv.push_back(root.str());
  return test::run(argv, input);
}

std::string queue(const test::temp_dir& root, const std::string& agent,
                  const std::string& body, const std::string& parent = {}) {
  std::vector<std::string> args{"queue", "--agent", agent};
  if (!parent.empty()) {
    args.push_back("--parent");
    args.push_back(parent);
  }
  auto r = task(root, args, body);
  REQUIRE(r.exit_code == 0);
  auto out = test::lines(r.out);
  REQUIRE(out.size() == 1);
  return out[0];
}

// Claims one task; returns its ID, or "" when the command exits 3.
std::string next(const test::temp_dir& root, const std::string& agent,
                 pid_t worker = 0) {
  std::vector<std::string> args{"next", "--agent", agent};
  if (worker > 0) {
    args.push_back("--worker-pid");
    args.push_back(std::to_string(worker));
  }
  auto r = task(root, args);
  if (r.exit_code == 3) {
    REQUIRE(r.out.empty());
    return {};
  }
  REQUIRE(r.exit_code == 0);
  auto out = test::lines(r.out);
  REQUIRE(out.size() == 2);
  return out[0];
}

void complete(const test::temp_dir& root, const std::string& agent,
              const std::string& id) {
  auto r = task(root, {"complete", id, "--agent", agent});
  REQUIRE(r.exit_code == 0);
}

// The seed's tree: 0001 with t1{t1.1, t1.2} and t2, plus 0002.
void seed_tree(const test::temp_dir& root, const std::string& agent = "a") {
  REQUIRE(queue(root, agent, "orchestration 1") == "0001");
  REQUIRE(queue(root, agent, "t1", "0001") == "0001_t1");
  REQUIRE(queue(root, agent, "t2", "0001") == "0001_t2");
  REQUIRE(queue(root, agent, "t1.1", "0001_t1") == "0001_t1.1");
  REQUIRE(queue(root, agent, "t1.2", "0001_t1") == "0001_t1.2");
  REQUIRE(queue(root, agent, "orchestration 2") == "0002");
}

fs::path tasks_dir(const test::temp_dir& root, const std::string& agent) {
  return root.path() / "ai_comms" / agent / "tasks";
}

std::string slurp(const fs::path& p) {
  std::ifstream in{p};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

// Every path under `dir` with the content of each file.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir))
    out[e.path().string()] = e.is_regular_file() ? slurp(e.path()) : "<dir>";
  return out;
}

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream out{p};
  out << text;
}

} // namespace

TEST_CASE("task files: queue writes to_execute/ID/ID.md with IDs from the "
          "file counters") {
  test::temp_dir root;
  seed_tree(root);
  auto dir = tasks_dir(root, "a") / "to_execute";
  CHECK(slurp(dir / "0001" / "0001.md") == "orchestration 1");
  CHECK(slurp(dir / "0001_t1.2" / "0001_t1.2.md") == "t1.2");
  CHECK(fs::exists(root.path() / "ai_comms" / "counters" / "0001_t1.NextId"));
  // Nothing half-written is left behind.
  for (auto& e : fs::directory_iterator(dir))
    CHECK(task_id::parse(e.path().filename().string()));
}

TEST_CASE("task files: next claims in D1 order with a completion between "
          "claims: t1.2, t1.1, t2, t1, 0002, 0001") {
  test::temp_dir root;
  seed_tree(root);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    auto id = next(root, "a");
    REQUIRE_FALSE(id.empty());
    order.push_back(id);
    complete(root, "a", id);
  }
  CHECK(order
        == std::vector<std::string>{"0001_t1.2", "0001_t1.1", "0001_t2",
                                    "0001_t1", "0002", "0001"});
  CHECK(next(root, "a").empty());
}

TEST_CASE("task files: four claims before any completion: t1.2, t1.1, t2, "
          "0002, then nothing (exit 3)") {
  test::temp_dir root;
  seed_tree(root);
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i)
    order.push_back(next(root, "a"));
  CHECK(order
        == std::vector<std::string>{"0001_t1.2", "0001_t1.1", "0001_t2",
                                    "0002"});
  CHECK(next(root, "a").empty());
}

TEST_CASE("task files: a claim moves the task to in_progress/ID/ID.PID.md "
          "with PID:START of the calling process in ID.owner") {
  test::temp_dir root;
  REQUIRE(queue(root, "a", "body") == "0001");
  auto r = task(root, {"next", "--agent", "a"});
  REQUIRE(r.exit_code == 0);
  auto out = test::lines(r.out);
  REQUIRE(out.size() == 2);
  CHECK(out[0] == "0001");
  // spindle's parent is this test process: it is the worker.
  auto me = self_identity();
  auto dir = tasks_dir(root, "a") / "in_progress" / "0001";
  auto marker = dir / ("0001." + std::to_string(me.pid) + ".md");
  CHECK(out[1] == marker.string());
  CHECK(slurp(marker) == "body");
  auto owner = test::lines(slurp(dir / "0001.owner"));
  REQUIRE(owner.size() == 2);
  CHECK(owner[0] == me.to_string());
  CHECK_FALSE(fs::exists(tasks_dir(root, "a") / "to_execute" / "0001"));
}

TEST_CASE("task files: orchestration IDs from the files cross tier "
          "boundaries: 9998, 9999, A000") {
  test::temp_dir root;
  write_file(root.path() / "ai_comms" / "counters" / "global.NextId", "9998\n");
  CHECK(queue(root, "a", "x") == "9998");
  CHECK(queue(root, "a", "x") == "9999");
  CHECK(queue(root, "a", "x") == "A000");
  CHECK(queue(root, "a", "x", "A000") == "A000_t1");
  // A000_t1 first (deepest), then depth 0 by sequence: 9999, 9998.
  CHECK(next(root, "a") == "A000_t1");
  CHECK(next(root, "a") == "9999");
  CHECK(next(root, "a") == "9998");
}

TEST_CASE("task files: concurrent `spindle task next` processes claim every "
          "task exactly once, parents only after their children") {
  for (size_t procs : {1, 4, 8}) {
    DYNAMIC_SECTION(procs << " concurrent claiming processes") {
      test::temp_dir root;
      auto files = task_files::open(root.path(), "a").value();
      std::vector<std::string> all;
      for (int o = 0; o < 2; ++o) {
        auto orch = files.queue("o").value();
        all.push_back(orch.to_string());
        for (int t = 0; t < 4; ++t) {
          auto tid = files.queue("t", orch).value();
          all.push_back(tid.to_string());
          for (int s = 0; s < 5; ++s)
            all.push_back(files.queue("s", tid).value().to_string());
        }
      }
      std::mutex mtx;
      std::map<std::string, int> claims;
      std::vector<std::string> completion_order;
      std::map<std::string, size_t> claimed_at;
      std::atomic<size_t> done{0};
      std::atomic<int> failures{0};
      std::vector<std::thread> workers;
      for (size_t p = 0; p < procs; ++p)
        workers.emplace_back([&] {
          while (done.load() < all.size()) {
            auto r = task(root, {"next", "--agent", "a"});
            if (r.exit_code == 3) {
              std::this_thread::yield();
              continue;
            }
            if (r.exit_code != 0) {
              ++failures;
              return;
            }
            auto id = test::lines(r.out).at(0);
            {
              std::lock_guard<std::mutex> guard{mtx};
              ++claims[id];
              claimed_at[id] = completion_order.size();
              completion_order.push_back(id); // completes before next claim
            }
            if (task(root, {"complete", id, "--agent", "a"}).exit_code != 0)
              ++failures;
            ++done;
          }
        });
      for (auto& w : workers)
        w.join();
      REQUIRE(failures == 0);
      REQUIRE(claims.size() == all.size());
      for (auto& id : all) {
        REQUIRE(claims[id] == 1);
        if (auto parent = task_id::parse(id)->parent())
          REQUIRE(claimed_at[id] < claimed_at[parent->to_string()]);
        REQUIRE(fs::exists(tasks_dir(root, "a") / "completed" / id));
      }
    }
  }
}

TEST_CASE("task files: concurrent claimers in threads of one process claim "
          "each task exactly once") {
  for (size_t threads : {2, 4, 8, 16}) {
    DYNAMIC_SECTION(threads << " threads") {
      test::temp_dir root;
      auto files = task_files::open(root.path(), "a").value();
      auto orch = files.queue("o").value();
      constexpr size_t n = 300;
      for (size_t i = 0; i < n; ++i)
        REQUIRE(files.queue("t", orch));
      std::mutex mtx;
      std::map<std::string, int> claims;
      std::atomic<int> failures{0};
      std::vector<std::thread> workers;
      for (size_t t = 0; t < threads; ++t)
        workers.emplace_back([&] {
          auto mine = task_files::open(root.path(), "a").value();
          while (true) {
            auto got = mine.claim_next(self_identity());
            if (!got) {
              ++failures;
              return;
            }
            if (!*got)
              return;
            std::lock_guard<std::mutex> guard{mtx};
            ++claims[(*got)->id.to_string()];
          }
        });
      for (auto& w : workers)
        w.join();
      REQUIRE(failures == 0);
      // Every subtask once; the orchestration waits for its children.
      REQUIRE(claims.size() == n);
      for (auto& [id, count] : claims)
        REQUIRE(count == 1);
    }
  }
}

TEST_CASE("task files: a kill -9'd worker's task is found by `task stale` "
          "and moved to stale/ - a live worker's task stays") {
  test::temp_dir root;
  REQUIRE(queue(root, "a", "x") == "0001");
  REQUIRE(queue(root, "a", "x", "0001") == "0001_t1");
  REQUIRE(queue(root, "a", "x", "0001") == "0001_t2");
  test::child doomed{{"sleep", "30"}};
  test::child alive{{"sleep", "30"}};
  REQUIRE(next(root, "a", doomed.pid()) == "0001_t2");
  REQUIRE(next(root, "a", alive.pid()) == "0001_t1");
  auto r = task(root, {"stale", "--agent", "a"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.empty());
  doomed.kill(SIGKILL);
  doomed.wait();
  r = task(root, {"stale", "--agent", "a"});
  REQUIRE(r.exit_code == 0);
  CHECK(test::lines(r.out) == std::vector<std::string>{"0001_t2"});
  CHECK(r.err.find("is gone") != std::string::npos);
  auto dir = tasks_dir(root, "a");
  CHECK(fs::exists(dir / "stale" / "0001_t2"
                   / ("0001_t2." + std::to_string(doomed.pid()) + ".md")));
  CHECK(fs::exists(dir / "in_progress" / "0001_t1"));
}

TEST_CASE("task files: a marker whose PID now belongs to another process "
          "(same PID, other start time) is stale - a seed-style marker with "
          "a live PID is not") {
  test::temp_dir root;
  auto dir = tasks_dir(root, "a") / "in_progress";
  auto me = self_identity();
  REQUIRE(me.start_time > 0);
  // Reused: our live PID, but a start time that is not ours.
  write_file(dir / "0001" / ("0001." + std::to_string(me.pid) + ".md"), "x");
  write_file(dir / "0001" / "0001.owner",
             std::to_string(me.pid) + ":" + std::to_string(me.start_time + 7)
               + "\n2025-01-01T00:00:00+0000\n");
  // The seed's bare marker, PID alive: kept.
  write_file(dir / "0002" / ("0002." + std::to_string(me.pid) + ".md"), "x");
  // The seed's bare marker, PID dead: stale.
  auto gone = test::dead_pid();
  write_file(dir / "0003" / ("0003." + std::to_string(gone) + ".md"), "x");
  auto r = task(root, {"stale", "--agent", "a"});
  REQUIRE(r.exit_code == 0);
  CHECK(test::lines(r.out) == std::vector<std::string>{"0001", "0003"});
  CHECK(r.err.find("now belongs to another process") != std::string::npos);
  CHECK(fs::exists(tasks_dir(root, "a") / "stale" / "0001"));
  CHECK(fs::exists(dir / "0002"));
}

TEST_CASE("task files: an in-progress task without any owner record is "
          "stale only after the grace period") {
  test::temp_dir root;
  write_file(tasks_dir(root, "a") / "in_progress" / "0001" / "0001.md", "x");
  task_files_options patient;
  auto files = task_files::open(root.path(), "a", patient).value();
  CHECK(files.detect_stale().value().empty());
  task_files_options eager;
  eager.unowned_grace = std::chrono::milliseconds(0);
  auto moved = task_files::open(root.path(), "a", eager).value().detect_stale();
  REQUIRE(moved);
  REQUIRE(moved->size() == 1);
  CHECK(moved->front().id.to_string() == "0001");
  CHECK_FALSE(moved->front().owner);
}

TEST_CASE("task files: requeue moves a stale task back under its plain name "
          "and keeps the dead owner's record - it is claimed again") {
  test::temp_dir root;
  REQUIRE(queue(root, "a", "body") == "0001");
  test::child doomed{{"sleep", "30"}};
  auto doomed_id = identify(doomed.pid()).value();
  REQUIRE(next(root, "a", doomed.pid()) == "0001");
  doomed.kill(SIGKILL);
  doomed.wait();
  REQUIRE(task(root, {"stale", "--agent", "a"}).exit_code == 0);
  auto r = task(root, {"requeue", "0001", "--agent", "a"});
  REQUIRE(r.exit_code == 0);
  auto dir = tasks_dir(root, "a") / "to_execute" / "0001";
  CHECK(slurp(dir / "0001.md") == "body");
  CHECK(fs::exists(dir
                   / ("0001.owner." + std::to_string(doomed_id.pid) + "."
                      + std::to_string(doomed_id.start_time))));
  CHECK(next(root, "a") == "0001");
  // Requeue of a task that is not stale fails and changes nothing.
  auto before = snapshot(root.path());
  r = task(root, {"requeue", "0001", "--agent", "a"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("in_progress") != std::string::npos);
  CHECK(snapshot(root.path()) == before);
}

TEST_CASE("task files: complete refuses a task that is not in progress") {
  test::temp_dir root;
  REQUIRE(queue(root, "a", "x") == "0001");
  auto r = task(root, {"complete", "0001", "--agent", "a"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("to_execute") != std::string::npos);
  r = task(root, {"complete", "0007", "--agent", "a"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("does not exist") != std::string::npos);
}

TEST_CASE("task files: a child queued for another agent blocks its parent "
          "until it completes there") {
  test::temp_dir root;
  REQUIRE(queue(root, "planner", "plan") == "0001");
  REQUIRE(queue(root, "coder", "code", "0001") == "0001_t1");
  CHECK(next(root, "planner").empty());
  REQUIRE(next(root, "coder") == "0001_t1");
  CHECK(next(root, "planner").empty());
  complete(root, "coder", "0001_t1");
  CHECK(next(root, "planner") == "0001");
}

TEST_CASE("task files: list shows the tree with states, as text and JSON") {
  test::temp_dir root;
  seed_tree(root);
  REQUIRE(next(root, "a") == "0001_t1.2");
  complete(root, "a", "0001_t1.2");
  REQUIRE(next(root, "a") == "0001_t1.1");
  auto r = task(root, {"list", "--agent", "a", "--json"});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.size() == 6);
  std::vector<std::string> ids;
  std::map<std::string, nlohmann::json> by_id;
  for (auto& t : j) {
    ids.push_back(t["id"]);
    by_id[t["id"]] = t;
  }
  CHECK(ids
        == std::vector<std::string>{"0001", "0001_t1", "0001_t1.1",
                                    "0001_t1.2", "0001_t2", "0002"});
  CHECK(by_id["0001_t1.2"]["state"] == "completed");
  CHECK(by_id["0001_t1.1"]["state"] == "running");
  CHECK(by_id["0001_t1.1"]["owner"]["pid"] == ::getpid());
  CHECK(by_id["0001_t1"]["incomplete_children"] == 1);
  CHECK(by_id["0001_t1"]["executable"] == false);
  CHECK(by_id["0001_t2"]["executable"] == true);
  CHECK(by_id["0001_t1.1"]["parent"] == "0001_t1");
  r = task(root, {"list", "--agent", "a"});
  REQUIRE(r.exit_code == 0);
  auto text = test::lines(r.out);
  REQUIRE(text.size() == 6);
  CHECK(text[2].rfind("    0001_t1.1", 0) == 0);
  CHECK(text[2].find("running") != std::string::npos);
  CHECK(text[4].find("executable") != std::string::npos);
}

TEST_CASE("task files: invalid agent names, IDs and roots exit 2 and touch "
          "nothing") {
  test::temp_dir root;
  seed_tree(root);
  auto before = snapshot(root.path());
  for (std::string agent :
       std::vector<std::string>{"../a", "a/b", ".hidden", "-x", "", "a b",
                                std::string(65, 'a')}) {
    INFO("agent '" << agent << "'");
    CHECK(task(root, {"queue", "--agent", agent}, "x").exit_code == 2);
    CHECK(task(root, {"next", "--agent", agent}).exit_code == 2);
    CHECK(task(root, {"complete", "0001", "--agent", agent}).exit_code == 2);
    CHECK(task(root, {"stale", "--agent", agent}).exit_code == 2);
    CHECK(task(root, {"requeue", "0001", "--agent", agent}).exit_code == 2);
    CHECK(task(root, {"list", "--agent", agent}).exit_code == 2);
  }
  for (std::string id : {"../x", "0001/../../x", "0000", "0001_t0", "x",
                         "0001_t1.", "/etc/passwd"}) {
    INFO("id '" << id << "'");
    auto r = task(root, {"complete", id, "--agent", "a"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("not a task ID") != std::string::npos);
    CHECK(task(root, {"requeue", id, "--agent", "a"}).exit_code == 2);
    CHECK(task(root, {"queue", "--agent", "a", "--parent", id}, "x").exit_code
          == 2);
  }
  CHECK(task(root, {"next", "--agent", "a", "--worker-pid",
                    std::to_string(test::dead_pid())})
          .exit_code
        == 2);
  CHECK(task(root, {"next", "--agent", "a", "--worker-pid", "-5"}).exit_code
        == 2);
  CHECK(task(root, {"list"}).exit_code == 2); // --agent is required
  CHECK(snapshot(root.path()) == before);
  auto r = test::run({test::spindle_binary(), "task", "list", "--agent", "a",
                      "--root", (root.path() / "missing").string()});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("not a directory") != std::string::npos);
  CHECK_FALSE(fs::exists(root.path() / "missing"));
}

TEST_CASE("task files: the root defaults to $AI_ROOT") {
  test::temp_dir root;
  auto r = test::run({test::spindle_binary(), "task", "queue", "--agent", "a"},
                     "x", {{"AI_ROOT", root.str()}});
  REQUIRE(r.exit_code == 0);
  CHECK(test::lines(r.out) == std::vector<std::string>{"0001"});
  CHECK(fs::exists(tasks_dir(root, "a") / "to_execute" / "0001" / "0001.md"));
}
