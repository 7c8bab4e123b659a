// Retries: a task created with max_attempts and backoff_s that fails or
// loses its worker goes back to pending after its backoff, keeps its ID and
// its place in D1 order, counts its attempts, and survives a restart; many
// leased workers, a quarter of them killed mid-task, finish a tree of
// 2,000 tasks with every task completed exactly once.

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/messages/clock.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono;
using json = nlohmann::json;

namespace {

task_info task_of(runtime& rt, const std::string& id) {
  auto t = rt.task(id);
  REQUIRE(t);
  return *t;
}

// Claims with a lease until a task comes, for at most `limit`.
task_claim claim_within(runtime& rt, const std::string& worker,
                        milliseconds limit) {
  auto until = steady_clock::now() + limit;
  for (;;) {
    auto c = rt.claim_task(worker, milliseconds{30000});
    REQUIRE(c);
    if (c->claimed || steady_clock::now() >= until)
      return *c;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

} // namespace

TEST_CASE("retries: a failed task with attempts left is pending again after "
          "its doubling backoff and its last failure stays failed") {
  runtime rt;
  auto orch = rt.create_orchestration("job", task_retry{3, 300});
  REQUIRE(orch);
  auto fresh = task_of(rt, *orch);
  CHECK(fresh.attempts == 0);
  CHECK(fresh.max_attempts == 3);
  CHECK(fresh.backoff_ms == 300);
  auto c = claim_within(rt, "w", seconds(5));
  REQUIRE(c.claimed);
  CHECK(c.task.attempts == 1);
  int64_t backoff = 300;
  for (uint32_t attempt = 1; attempt < 3; ++attempt, backoff *= 2) {
    INFO("attempt " << attempt);
    auto failed_at = unix_time_ms();
    auto reason = "\"boom " + std::to_string(attempt) + "\"";
    auto f = rt.fail_task(*orch, reason, c.lease);
    REQUIRE(f);
    CHECK(f->state == task_state::pending);
    CHECK(f->outcome == reason); // why the last attempt ended
    CHECK(f->retry_at_ms >= failed_at + backoff);
    CHECK(f->retry_at_ms <= unix_time_ms() + backoff);
    // Not executable during its backoff.
    auto early = rt.claim_task("w", milliseconds{30000});
    REQUIRE(early);
    CHECK_FALSE(early->claimed);
    CHECK(rt.executable_tasks().value().empty());
    auto start = steady_clock::now();
    c = claim_within(rt, "w", seconds(10));
    REQUIRE(c.claimed);
    CHECK(steady_clock::now() - start >= milliseconds(backoff - 100));
    CHECK(c.task.id == *orch);
    CHECK(c.task.attempts == attempt + 1);
    CHECK(c.task.retry_at_ms == 0);
  }
  auto f = rt.fail_task(*orch, "\"boom 3\"", c.lease);
  REQUIRE(f);
  CHECK(f->state == task_state::failed);
  CHECK(f->outcome == "\"boom 3\"");
  CHECK(f->attempts == 3);
  CHECK(f->retry_at_ms == 0);
  // A task without retries fails at once, as before.
  auto plain = rt.create_orchestration("plain");
  REQUIRE(plain);
  auto p = claim_within(rt, "w", seconds(5));
  REQUIRE(p.claimed);
  auto pf = rt.fail_task(*plain, "\"no\"", p.lease);
  REQUIRE(pf);
  CHECK(pf->state == task_state::failed);
}

TEST_CASE("retries: a retried task keeps its ID and its place in D1 order") {
  runtime rt;
  auto root = rt.create_orchestration("root");
  REQUIRE(root);
  auto kids = rt.spawn_subtasks(*root, {"a", "b", "c"}, task_retry{2, 0});
  REQUIRE(kids);
  // D1: the highest sequence number first.
  auto first = claim_within(rt, "w", seconds(5));
  REQUIRE(first.task.id == "0001_t3");
  auto f = rt.fail_task("0001_t3", "\"flaky\"", first.lease);
  REQUIRE(f);
  CHECK(f->state == task_state::pending);
  CHECK(rt.executable_tasks().value()
        == std::vector<std::string>{"0001_t3", "0001_t2", "0001_t1"});
  auto again = claim_within(rt, "w", seconds(5));
  CHECK(again.task.id == "0001_t3");
  CHECK(again.task.attempts == 2);
  // Worker gone (a lease that expires) counts as an attempt too: the
  // second was the last, so it is stale now.
  auto lost = rt.claim_task("q", milliseconds{1000});
  REQUIRE(lost);
  REQUIRE(lost->claimed);
  CHECK(lost->task.id == "0001_t2");
  auto until = steady_clock::now() + seconds(5);
  while (task_of(rt, "0001_t2").state == task_state::running
         && steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(10));
  auto t2 = task_of(rt, "0001_t2");
  CHECK(t2.state == task_state::pending); // its first attempt of two
  CHECK(t2.attempts == 1);
  CHECK(json::parse(t2.outcome)["worker"] == "q");
  CHECK(rt.executable_tasks().value()
        == std::vector<std::string>{"0001_t2", "0001_t1"});
}

TEST_CASE("retries: attempts and a running backoff survive a restart and a "
          "task running at the restart is retried when it has attempts "
          "left") {
  test::temp_dir dir;
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  int64_t retry_at = 0;
  {
    runtime rt{opts};
    auto a = rt.create_orchestration("a", task_retry{3, 60'000});
    auto b = rt.create_orchestration("b", task_retry{2, 0});
    auto c = rt.create_orchestration("c");
    REQUIRE((a && b && c));
    // D1 between orchestrations: by value descending, so c, b, a.
    auto cc = claim_within(rt, "w", seconds(5));
    auto cb = claim_within(rt, "w", seconds(5));
    auto ca = claim_within(rt, "w", seconds(5));
    REQUIRE(ca.task.id == "0001");
    auto f = rt.fail_task("0001", "\"later\"", ca.lease);
    REQUIRE(f);
    REQUIRE(f->state == task_state::pending);
    retry_at = f->retry_at_ms;
    // 0002 and 0003 are running when the process goes.
  }
  runtime rt{opts};
  auto a = task_of(rt, "0001");
  CHECK(a.state == task_state::pending);
  CHECK(a.attempts == 1);
  CHECK(a.retry_at_ms == retry_at);
  CHECK(a.outcome == "\"later\"");
  auto b = task_of(rt, "0002");
  CHECK(b.state == task_state::pending); // retried: one attempt left
  CHECK(b.attempts == 1);
  auto c = task_of(rt, "0003");
  CHECK(c.state == task_state::stale); // no retries
  // Only 0002 is executable: 0001 waits out its minute.
  CHECK(rt.executable_tasks().value() == std::vector<std::string>{"0002"});
}

TEST_CASE("retries: bad retry settings over HTTP are refused and create "
          "nothing") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  for (auto bad : {json{{"payload", 1}, {"max_attempts", 0}},
                   json{{"payload", 1}, {"max_attempts", 101}},
                   json{{"payload", 1}, {"max_attempts", 2.5}},
                   json{{"payload", 1}, {"max_attempts", "3"}},
                   json{{"payload", 1}, {"backoff_s", -1}},
                   json{{"payload", 1}, {"backoff_s", 3601}},
                   json{{"payload", 1}, {"backoff_s", "soon"}}}) {
    INFO(bad.dump());
    auto [status, body] = test::post_json(cli, "/v1/orchestrations", bad);
    CHECK(status == 400);
    auto param = bad.contains("max_attempts") ? "max_attempts" : "backoff_s";
    CHECK(body["error"]["param"] == param);
  }
  CHECK(test::get_json(cli, "/v1/orchestrations/0001").first == 404);
  auto [status, created] = test::post_json(
    cli, "/v1/orchestrations",
    {{"payload", 1}, {"max_attempts", 4}, {"backoff_s", 0.25}});
  REQUIRE(status == 201);
  CHECK(created["id"] == "0001");
  auto [ss, sub] = test::post_json(cli, "/v1/tasks/0001/subtasks",
                                   {{"payload", 2}, {"max_attempts", 0}});
  CHECK(ss == 400);
  auto [gs, task] = test::get_json(cli, "/v1/tasks/0001");
  REQUIRE(gs == 200);
  CHECK(task["max_attempts"] == 4);
  CHECK(task["backoff_s"] == 0.25);
  CHECK(task["attempts"] == 0);
  CHECK(task["retry_at"].is_null());
  CHECK(task["children"].is_null());
  CHECK(task["incomplete_children"] == 0);
}

TEST_CASE("retries: a silent worker's task goes to another worker within its "
          "lease and a second and its late complete is lease_lost") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  REQUIRE(test::post_json(cli, "/v1/orchestrations",
                          {{"payload", "job"}, {"max_attempts", 2}})
            .first
          == 201);
  auto [s1, silent] = test::post_json(
    cli, "/v1/tasks/claim", {{"worker", "silent"}, {"lease_s", 1}});
  REQUIRE(s1 == 200);
  auto start = steady_clock::now();
  httplib::Client other{"127.0.0.1", srv.port()};
  other.set_read_timeout(10, 0);
  auto [s2, taken] = test::post_json(
    other, "/v1/tasks/claim",
    {{"worker", "second"}, {"lease_s", 30}, {"wait_s", 5}});
  auto took = steady_clock::now() - start;
  REQUIRE(s2 == 200);
  CHECK(taken["id"] == "0001");
  CHECK(taken["attempts"] == 2);
  CHECK(taken["worker"] == "second");
  CHECK(taken["last_error"]["worker"] == "silent");
  CHECK(took >= milliseconds(900));
  CHECK(took <= milliseconds(2000));
  auto [s3, late] = test::post_json(
    cli, "/v1/tasks/0001/complete",
    {{"result", "late"}, {"lease", silent["lease"]["token"]}});
  CHECK(s3 == 409);
  CHECK(late["error"]["code"] == "lease_lost");
  auto [gs, task] = test::get_json(cli, "/v1/tasks/0001");
  REQUIRE(gs == 200);
  CHECK(task["state"] == "running");
  CHECK(task["worker"] == "second");
  auto [s4, done] = test::post_json(
    cli, "/v1/tasks/0001/complete",
    {{"result", "ok"}, {"lease", taken["lease"]["token"]}});
  CHECK(s4 == 200);
  CHECK(done["result"] == "ok");
}

namespace {

// One claim as a worker saw it.
struct claim_record {
  std::string task;
  std::string worker;
  int64_t granted_ms = 0; // the lease's start: expires_at - lease
  int64_t expires_ms = 0;
  bool killed = false;    // the worker died holding it
};

} // namespace

TEST_CASE("retries: 64 leased workers over a tree of 2000 tasks with a "
          "quarter of them killed mid-task complete every task exactly "
          "once") {
  test::raise_fd_limit();
  test::server_process srv;
  // The tree: the root, 40 children, 49 grandchildren each (2001 tasks),
  // every task with attempts to spare for the killed workers.
  const json retry{{"max_attempts", 20}, {"backoff_s", 0}};
  {
    httplib::Client cli{"127.0.0.1", srv.port()};
    auto body = retry;
    body["payload"] = "root";
    REQUIRE(test::post_json(cli, "/v1/orchestrations", body).first == 201);
    for (int c = 1; c <= 40; ++c) {
      REQUIRE(test::post_json(cli, "/v1/tasks/0001/subtasks", body).first
              == 201);
      for (int g = 1; g <= 49; ++g)
        REQUIRE(test::post_json(cli,
                                "/v1/tasks/0001_t" + std::to_string(c)
                                  + "/subtasks",
                                body)
                  .first
                == 201);
    }
  }
  // The stream of claims in commit order, to check D1.
  test::sse_client claims{srv.port(), "/v1/events?types=task.claimed,"
                                      "task.completed"};
  REQUIRE(claims.wait_status(seconds(5)) == 200);
  constexpr int workers = 64;
  constexpr int lease_s = 1;
  std::mutex mx;
  std::vector<claim_record> records;
  std::map<std::string, int> completions;
  std::atomic<bool> finished{false};
  std::atomic<int> killed{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      std::mt19937 rng{static_cast<unsigned>(w)};
      httplib::Client cli{"127.0.0.1", srv.port()};
      cli.set_read_timeout(10, 0);
      auto name = "worker-" + std::to_string(w);
      // A quarter die holding their n-th task.
      int dies_at = w % 4 == 0 ? 1 + static_cast<int>(rng() % 30) : -1;
      for (int n = 1; !finished; ++n) {
        auto c = cli.Post("/v1/tasks/claim",
                          json{{"worker", name},
                               {"lease_s", lease_s},
                               {"wait_s", 1}}
                            .dump(),
                          "application/json");
        if (!c)
          return;
        if (c->status == 204)
          continue;
        if (c->status != 200)
          return;
        auto t = json::parse(c->body);
        claim_record rec;
        rec.task = t["id"].get<std::string>();
        rec.worker = name;
        rec.expires_ms = t["lease"]["expires_at"].get<int64_t>();
        rec.granted_ms = rec.expires_ms - lease_s * 1000;
        if (n == dies_at) {
          rec.killed = true;
          ++killed;
          std::lock_guard<std::mutex> guard{mx};
          records.push_back(rec);
          return; // gone, holding the task
        }
        {
          std::lock_guard<std::mutex> guard{mx};
          records.push_back(rec);
        }
        std::this_thread::sleep_for(microseconds(rng() % 2000));
        auto done = cli.Post("/v1/tasks/" + rec.task + "/complete",
                             json{{"result", name},
                                  {"lease", t["lease"]["token"]}}
                               .dump(),
                             "application/json");
        if (!done || done->status != 200)
          continue; // lease_lost would be a failure: counted below
        std::lock_guard<std::mutex> guard{mx};
        ++completions[rec.task];
        if (rec.task == "0001")
          finished = true;
      }
    });
  for (auto& t : pool)
    t.join();
  REQUIRE(finished);
  CHECK(killed == workers / 4);
  // Every task completed exactly once.
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto [status, tree] = test::get_json(cli, "/v1/orchestrations/0001");
  REQUIRE(status == 200);
  REQUIRE(tree["tasks"].size() == 2001);
  size_t not_completed = 0;
  for (auto& t : tree["tasks"])
    if (t["state"] != "completed")
      ++not_completed;
  CHECK(not_completed == 0);
  CHECK(completions.size() == 2001);
  size_t twice = 0;
  for (auto& [task, n] : completions)
    if (n != 1)
      ++twice;
  CHECK(twice == 0);
  // No task was held by two live leases at once: a task claimed again was
  // held by a killed worker, and the new lease began after the old one
  // expired.
  std::map<std::string, std::vector<claim_record>> by_task;
  for (auto& r : records)
    by_task[r.task].push_back(r);
  size_t overlaps = 0, retaken_from_live = 0, retaken = 0;
  for (auto& [task, rs] : by_task) {
    std::sort(rs.begin(), rs.end(), [](auto& x, auto& y) {
      return x.granted_ms < y.granted_ms;
    });
    for (size_t i = 1; i < rs.size(); ++i) {
      ++retaken;
      if (!rs[i - 1].killed)
        ++retaken_from_live;
      if (rs[i].granted_ms < rs[i - 1].expires_ms)
        ++overlaps;
    }
  }
  CHECK(retaken >= static_cast<size_t>(workers / 4));
  CHECK(retaken_from_live == 0);
  CHECK(overlaps == 0);
  // D1 per claim: the first claims of the grandchildren, all executable
  // from the start, came in exactly D1 order, and every parent was claimed
  // only after all its children completed.
  REQUIRE(claims.wait_for(2001 + records.size(), seconds(30)));
  std::map<std::string, std::vector<std::string>> children;
  for (auto& t : tree["tasks"])
    if (t["parent"].is_string())
      children[t["parent"].get<std::string>()].push_back(
        t["id"].get<std::string>());
  std::vector<std::string> first_claims;
  std::set<std::string> claimed_once, completed;
  size_t parent_too_early = 0;
  for (auto& e : claims.events()) {
    auto task = e.data["task"].get<std::string>();
    if (e.type == "task.completed") {
      completed.insert(task);
      continue;
    }
    if (task_id::parse(task)->depth() == 2) {
      if (claimed_once.insert(task).second)
        first_claims.push_back(task);
      continue;
    }
    for (auto& child : children[task])
      if (completed.count(child) == 0)
        ++parent_too_early;
  }
  CHECK(parent_too_early == 0);
  auto d1 = first_claims;
  std::sort(d1.begin(), d1.end(), [](auto& x, auto& y) {
    return claimed_before(*task_id::parse(x), *task_id::parse(y));
  });
  CHECK(first_claims.size() == 40 * 49);
  CHECK(first_claims == d1);
}
