// Leases on tasks claimed by remote workers: a silent worker's task is
// stale within its lease and a second, its late calls are refused
// (lease_lost) and change nothing; heartbeats keep a task; many workers
// under leases, some of them silent, finish every task exactly once.

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <poll.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono;
using json = nlohmann::json;

namespace {

task_state state_of(runtime& rt, const std::string& id) {
  auto t = rt.task(id);
  REQUIRE(t);
  return t->state;
}

} // namespace

TEST_CASE("leases: a silent worker's task is stale within its lease and a "
          "second and its late complete is refused and changes nothing") {
  runtime rt;
  auto orch = rt.create_orchestration("job");
  REQUIRE(orch);
  auto claimed = rt.claim_task("silent", milliseconds{1000});
  REQUIRE(claimed);
  REQUIRE(claimed->claimed);
  CHECK(claimed->task.id == *orch);
  CHECK(claimed->lease.size() == 32);
  auto now_ms = duration_cast<milliseconds>(
                  system_clock::now().time_since_epoch())
                  .count();
  CHECK(claimed->lease_expires_ms > now_ms + 800);
  CHECK(claimed->lease_expires_ms <= now_ms + 1000);
  auto start = steady_clock::now();
  while (state_of(rt, *orch) == task_state::running
         && steady_clock::now() - start < seconds(5))
    std::this_thread::sleep_for(milliseconds(10));
  auto took = steady_clock::now() - start;
  CHECK(took >= milliseconds(900));
  CHECK(took <= milliseconds(2000));
  auto stale = rt.task(*orch);
  REQUIRE(stale);
  REQUIRE(stale->state == task_state::stale);
  CHECK(stale->worker == "silent");
  auto why = json::parse(stale->outcome);
  CHECK(why["worker"] == "silent");
  CHECK(why["lease_expired_at"] == claimed->lease_expires_ms);
  // The late worker: refused, and nothing changes.
  auto late = rt.complete_task(*orch, "\"done\"", claimed->lease);
  REQUIRE_FALSE(late);
  CHECK(classify(late.error()) == errc::lease_lost);
  auto beat = rt.heartbeat_task(*orch, claimed->lease, milliseconds{5000});
  REQUIRE_FALSE(beat);
  CHECK(classify(beat.error()) == errc::lease_lost);
  auto after = rt.task(*orch);
  REQUIRE(after);
  CHECK(after->state == task_state::stale);
  CHECK(after->outcome == stale->outcome);
  // Another worker takes it over once it is pending again.
  REQUIRE(rt.requeue_task(*orch));
  auto second = rt.claim_task("second", milliseconds{30000});
  REQUIRE(second);
  REQUIRE(second->claimed);
  CHECK(second->lease != claimed->lease);
  auto stolen = rt.fail_task(*orch, "\"no\"", claimed->lease);
  REQUIRE_FALSE(stolen);
  CHECK(classify(stolen.error()) == errc::lease_lost);
  auto unleased = rt.complete_task(*orch, "\"no\"");
  REQUIRE_FALSE(unleased);
  CHECK(classify(unleased.error()) == errc::lease_lost);
  CHECK(state_of(rt, *orch) == task_state::running);
  auto done = rt.complete_task(*orch, "\"done\"", second->lease);
  REQUIRE(done);
  CHECK(done->state == task_state::completed);
  CHECK(done->worker == "second");
}

TEST_CASE("leases: heartbeats keep a task for as long as they come and "
          "bad leases are refused") {
  runtime rt;
  auto orch = rt.create_orchestration("job");
  REQUIRE(orch);
  auto other = rt.create_orchestration("other");
  REQUIRE(other);
  auto claimed = rt.claim_task("w", milliseconds{1000});
  REQUIRE(claimed);
  REQUIRE(claimed->claimed);
  auto id = claimed->task.id;
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(milliseconds(300));
    auto beat = rt.heartbeat_task(id, claimed->lease, milliseconds{1000});
    REQUIRE(beat);
    CHECK(beat->lease == claimed->lease);
    CHECK(beat->task.state == task_state::running);
  }
  CHECK(state_of(rt, id) == task_state::running);
  for (auto bad : {uint64_t{0}, uint64_t{999}, uint64_t{3'600'001}}) {
    auto r = rt.heartbeat_task(id, claimed->lease, milliseconds{bad});
    REQUIRE_FALSE(r);
    CHECK(classify(r.error()) == errc::invalid_argument);
    auto c = rt.claim_task("w2", milliseconds{bad});
    REQUIRE_FALSE(c);
    CHECK(classify(c.error()) == errc::invalid_argument);
  }
  // The task this lease does not hold (D1 claims the newest first).
  auto unheld = id == *orch ? *other : *orch;
  auto wrong_task = rt.heartbeat_task(unheld, claimed->lease,
                                      milliseconds{1000});
  REQUIRE_FALSE(wrong_task);
  CHECK(classify(wrong_task.error()) == errc::lease_lost);
  auto made_up = rt.heartbeat_task(id, std::string(32, 'a'),
                                   milliseconds{1000});
  REQUIRE_FALSE(made_up);
  CHECK(classify(made_up.error()) == errc::lease_lost);
  auto none = rt.heartbeat_task(id, "", milliseconds{1000});
  REQUIRE_FALSE(none);
  CHECK(classify(none.error()) == errc::lease_lost);
  auto unknown = rt.heartbeat_task("0042", claimed->lease,
                                   milliseconds{1000});
  REQUIRE_FALSE(unknown);
  CHECK(classify(unknown.error()) == errc::not_found);
  auto hostile = rt.heartbeat_task("../x", claimed->lease,
                                   milliseconds{1000});
  REQUIRE_FALSE(hostile);
  CHECK(classify(hostile.error()) == errc::invalid_id);
  CHECK(state_of(rt, id) == task_state::running);
  auto done = rt.complete_task(id, "1", claimed->lease);
  REQUIRE(done);
  CHECK(done->state == task_state::completed);
  // Finished: its lease is gone with it.
  auto again = rt.heartbeat_task(id, claimed->lease, milliseconds{1000});
  REQUIRE_FALSE(again);
  CHECK(classify(again.error()) == errc::lease_lost);
}

TEST_CASE("leases: 16 workers under leases with a quarter of them going "
          "silent mid-task complete every task exactly once") {
  test::temp_dir dir;
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  opts.storage.sync = sync_mode::normal;
  runtime rt{opts};
  constexpr int tasks = 200;
  std::vector<std::string> payloads;
  for (int i = 0; i < tasks - 1; ++i)
    payloads.push_back(std::to_string(i));
  auto orch = rt.create_orchestration("root");
  REQUIRE(orch);
  REQUIRE(rt.spawn_subtasks(*orch, payloads));
  std::mutex mtx;
  std::map<std::string, int> completions;
  std::atomic<int> refused_late{0};
  std::atomic<int> other_errors{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < 16; ++w)
    workers.emplace_back([&, w] {
      auto name = "w" + std::to_string(w);
      std::mt19937 rng{static_cast<unsigned>(w)};
      while (!stop) {
        // A quarter of the claims of every fourth worker: it goes quiet
        // past its (short) lease, then tries to complete anyway.
        bool silent = w % 4 == 0 && rng() % 4 == 0;
        auto c = rt.claim_task(name, milliseconds{silent ? 1000 : 10000});
        if (!c) {
          ++other_errors;
          return;
        }
        if (!c->claimed) {
          std::this_thread::sleep_for(milliseconds(20));
          continue;
        }
        if (silent) {
          std::this_thread::sleep_for(milliseconds(1400));
          auto late = rt.complete_task(c->task.id, "\"late\"", c->lease);
          if (late)
            ++other_errors; // the lease had expired: must be refused
          else if (classify(late.error()) == errc::lease_lost)
            ++refused_late;
          else
            ++other_errors;
          continue;
        }
        std::this_thread::sleep_for(milliseconds(rng() % 5));
        auto done = rt.complete_task(c->task.id, "\"" + name + "\"",
                                     c->lease);
        if (done) {
          std::lock_guard<std::mutex> guard{mtx};
          ++completions[c->task.id];
        } else {
          ++other_errors;
        }
      }
    });
  // The operator's part until retries exist: stale tasks go back.
  auto deadline = steady_clock::now() + seconds(120);
  for (;;) {
    auto tree = rt.orchestration_tree(*orch);
    REQUIRE(tree);
    size_t completed = 0;
    for (auto& t : tree->tasks) {
      if (t.state == task_state::stale)
        rt.requeue_task(t.id);
      completed += t.state == task_state::completed ? 1 : 0;
    }
    if (completed == tree->tasks.size() || steady_clock::now() > deadline)
      break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  stop = true;
  for (auto& t : workers)
    t.join();
  CHECK(other_errors == 0);
  CHECK(refused_late > 0);
  auto tree = rt.orchestration_tree(*orch);
  REQUIRE(tree);
  REQUIRE(tree->tasks.size() == static_cast<size_t>(tasks));
  for (auto& t : tree->tasks) {
    INFO(t.id);
    CHECK(t.state == task_state::completed);
    CHECK(completions[t.id] == 1);
    CHECK(t.outcome != "\"late\"");
  }
}

TEST_CASE("leases: over HTTP a claim carries its lease and heartbeats "
          "complete and bad input answer as documented") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto post = [&](const std::string& path, const json& body) {
    return test::post_json(cli, path, body);
  };
  REQUIRE(post("/v1/orchestrations", {{"payload", "a"}}).first == 201);
  for (auto bad : {json{{"worker", "w"}, {"lease_s", 0}},
                   json{{"worker", "w"}, {"lease_s", -5}},
                   json{{"worker", "w"}, {"lease_s", 3601}},
                   json{{"worker", "w"}, {"lease_s", "long"}}}) {
    INFO(bad.dump());
    auto [status, body] = post("/v1/tasks/claim", bad);
    CHECK(status == 400);
    CHECK(body["error"]["param"] == "lease_s");
  }
  auto [status, claimed] = post("/v1/tasks/claim",
                                {{"worker", "w"}, {"lease_s", 2}});
  REQUIRE(status == 200);
  auto id = claimed["id"].get<std::string>();
  auto token = claimed["lease"]["token"].get<std::string>();
  CHECK(claimed["state"] == "running");
  CHECK(claimed["lease"]["expires_at"].is_number_integer());
  auto [hs, beat] = post("/v1/tasks/" + id + "/heartbeat",
                         {{"lease", token}, {"lease_s", 60}});
  CHECK(hs == 200);
  CHECK(beat["lease"]["expires_at"].get<int64_t>()
        > claimed["lease"]["expires_at"].get<int64_t>());
  // Past the first lease, the heartbeat's holds.
  std::this_thread::sleep_for(milliseconds(2500));
  auto [ls, lost] = post("/v1/tasks/" + id + "/heartbeat",
                         {{"lease", std::string(32, 'f')}});
  CHECK(ls == 409);
  CHECK(lost["error"]["code"] == "lease_lost");
  CHECK(post("/v1/tasks/" + id + "/heartbeat", json::object()).first == 400);
  auto [us, unleased] = post("/v1/tasks/" + id + "/complete",
                             {{"result", 1}});
  CHECK(us == 409);
  CHECK(unleased["error"]["code"] == "lease_lost");
  auto [cs, done] = post("/v1/tasks/" + id + "/complete",
                         {{"result", 1}, {"lease", token}});
  CHECK(cs == 200);
  CHECK(done["state"] == "completed");
  auto [ds, twice] = post("/v1/tasks/" + id + "/complete",
                          {{"result", 2}, {"lease", token}});
  CHECK(ds == 409);
  CHECK(twice["error"]["code"] == "lease_lost");
  // A silent worker: stale within its lease and a second, shown with why.
  REQUIRE(post("/v1/orchestrations", {{"payload", "b"}}).first == 201);
  auto [s2, quiet] = post("/v1/tasks/claim", {{"worker", "q"}, {"lease_s", 1}});
  REQUIRE(s2 == 200);
  std::this_thread::sleep_for(milliseconds(2000));
  auto got = cli.Get("/v1/tasks/" + quiet["id"].get<std::string>());
  REQUIRE(got);
  auto task = json::parse(got->body);
  CHECK(task["state"] == "stale");
  CHECK(task["worker"] == "q");
  CHECK(task["stale"]["worker"] == "q");
  CHECK(task["stale"]["lease_expired_at"] == quiet["lease"]["expires_at"]);
  auto [rs, requeued] = post("/v1/tasks/" + quiet["id"].get<std::string>()
                               + "/requeue",
                             json::object());
  CHECK(rs == 200);
  CHECK(requeued["state"] == "pending");
  auto [s3, again] = post("/v1/tasks/claim", {{"worker", "r"}});
  REQUIRE(s3 == 200);
  CHECK(again["id"] == quiet["id"]);
  auto [ns, not_stale] = post("/v1/tasks/" + again["id"].get<std::string>()
                                + "/requeue",
                              json::object());
  CHECK(ns == 409);
}

TEST_CASE("leases: hostile input over HTTP is a clear 4xx and changes "
          "nothing") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  REQUIRE(test::post_json(cli, "/v1/orchestrations", {{"payload", "a"}}).first
          == 201);
  REQUIRE(test::post_json(cli, "/v1/tasks/0001/subtasks", {{"payload", "b"}})
            .first
          == 201);
  auto [cs, claimed] = test::post_json(cli, "/v1/tasks/claim",
                                       {{"worker", "w"}, {"lease_s", 60}});
  REQUIRE(cs == 200);
  REQUIRE(claimed["id"] == "0001_t1");
  auto token = claimed["lease"]["token"].get<std::string>();
  auto before = test::get_json(cli, "/v1/orchestrations/0001").second;
  struct attempt {
    std::string path;
    json body;
    int status;
    std::string code;
  };
  std::string huge(5000, '7');
  for (auto& a : std::vector<attempt>{
         // A task never claimed (the parent is pending): no lease holds it.
         {"/v1/tasks/0001/heartbeat", {{"lease", token}}, 409, "lease_lost"},
         {"/v1/tasks/0001/complete", {{"lease", token}}, 409, "lease_lost"},
         // Made-up and foreign tokens.
         {"/v1/tasks/0001_t1/heartbeat", {{"lease", "x"}}, 409, "lease_lost"},
         {"/v1/tasks/0001_t1/fail", {{"lease", std::string(32, '0')}}, 409,
          "lease_lost"},
         {"/v1/tasks/0001_t1/heartbeat", {{"lease", 42}}, 400, "malformed"},
         // Lengths out of range or of the wrong type.
         {"/v1/tasks/0001_t1/heartbeat", {{"lease", token}, {"lease_s", -1}},
          400, "invalid_argument"},
         {"/v1/tasks/0001_t1/heartbeat",
          {{"lease", token}, {"lease_s", 1e300}}, 400, "invalid_argument"},
         {"/v1/tasks/claim", {{"worker", "v"}, {"wait_s", -0.5}}, 400,
          "invalid_argument"},
         {"/v1/tasks/claim", {{"worker", "v"}, {"wait_s", 61}}, 400,
          "invalid_argument"},
         {"/v1/tasks/claim", {{"worker", "v"}, {"wait_s", "soon"}}, 400,
          "malformed"},
         {"/v1/tasks/claim", {{"worker", "a b"}}, 400, "invalid_argument"},
         {"/v1/tasks/claim", {{"worker", "v"}, {"lease", token}}, 400,
          "unknown_field"},
         // Hostile task IDs.
         // (an encoded slash splits the path: no route matches)
         {"/v1/tasks/..%2F..%2Fetc/heartbeat", {{"lease", token}}, 404,
          "not_found"},
         {"/v1/tasks/..%2E/heartbeat", {{"lease", token}}, 400,
          "invalid_id"},
         {"/v1/tasks/0001_t1%00/complete", {{"lease", token}}, 400,
          "invalid_id"},
         {"/v1/tasks/" + huge + "/fail", {{"lease", token}}, 400,
          "invalid_id"},
         {"/v1/tasks/0001_t-1/heartbeat", {{"lease", token}}, 400,
          "invalid_id"},
         {"/v1/tasks/ZZZZZ/requeue", json::object(), 400, "invalid_id"},
         {"/v1/tasks/0042/heartbeat", {{"lease", token}}, 404, "not_found"},
       }) {
    INFO(a.path.substr(0, 80) << " " << a.body.dump());
    auto [status, body] = test::post_json(cli, a.path, a.body);
    CHECK(status == a.status);
    CHECK(body["error"]["code"] == a.code);
  }
  // Nothing changed: the same tree, and the lease still holds.
  CHECK(test::get_json(cli, "/v1/orchestrations/0001").second == before);
  auto [hs, beat] = test::post_json(cli, "/v1/tasks/0001_t1/heartbeat",
                                    {{"lease", token}});
  CHECK(hs == 200);
  CHECK(beat["state"] == "running");
}

// -- waiting claims --------------------------------------------------------------

namespace {

// Threads of process `pid` (from /proc).
int threads_of(pid_t pid) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0)
      return std::stoi(line.substr(8));
  return -1;
}

} // namespace

TEST_CASE("waiting claims: a claim waits for a task to become executable "
          "and is answered empty when its time is up") {
  runtime rt;
  auto start = steady_clock::now();
  auto none = rt.claim_task("w", milliseconds{5000}, milliseconds{300});
  REQUIRE(none);
  CHECK_FALSE(none->claimed);
  CHECK(steady_clock::now() - start >= milliseconds(290));
  CHECK(steady_clock::now() - start < milliseconds(3000));
  auto bad = rt.claim_task("w", milliseconds{5000}, milliseconds{60001});
  REQUIRE_FALSE(bad);
  CHECK(classify(bad.error()) == errc::invalid_argument);
  // A child's completion makes its parent executable: a waiting claim
  // gets it.
  auto root = rt.create_orchestration("root");
  REQUIRE(root);
  auto kid = rt.spawn_subtask(*root, "kid");
  REQUIRE(kid);
  auto first = rt.claim_task("w", milliseconds{5000}, milliseconds{0});
  REQUIRE(first);
  REQUIRE(first->claimed);
  CHECK(first->task.id == *kid);
  std::promise<caf::expected<task_claim>> waited;
  auto got = waited.get_future();
  rt.claim_task_async("w2", milliseconds{5000}, milliseconds{10000},
                      [&](caf::expected<task_claim> c) {
                        waited.set_value(std::move(c));
                      });
  std::this_thread::sleep_for(milliseconds(200));
  CHECK(got.wait_for(milliseconds(0)) == std::future_status::timeout);
  auto finished = steady_clock::now();
  REQUIRE(rt.complete_task(*kid, "1", first->lease));
  auto parent = got.get();
  CHECK(steady_clock::now() - finished < milliseconds(100));
  REQUIRE(parent);
  REQUIRE(parent->claimed);
  CHECK(parent->task.id == *root);
  CHECK(parent->task.worker == "w2");
  CHECK(parent->lease.size() == 32);
}

TEST_CASE("waiting claims: 1,000 claims wait over HTTP at once and each task "
          "created then goes to exactly one of them within 100 ms without "
          "a thread per claim") {
  test::raise_fd_limit();
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  REQUIRE(cli.Get("/healthz"));
  constexpr int claims = 1000;
  auto idle_threads = threads_of(srv.pid());
  REQUIRE(idle_threads > 0);
  test::fd_guard socks;
  std::string request_head = "POST /v1/tasks/claim HTTP/1.1\r\n"
                             "Host: 127.0.0.1\r\n"
                             "Content-Type: application/json\r\n";
  for (int i = 0; i < claims; ++i) {
    auto body = json{{"worker", "waiter-" + std::to_string(i)},
                     {"wait_s", 60}}
                  .dump();
    int fd = test::connect_to(srv.port());
    REQUIRE(fd >= 0);
    socks.fds.push_back(fd);
    REQUIRE(test::send_all(fd, request_head + "Content-Length: "
                                 + std::to_string(body.size()) + "\r\n\r\n"
                                 + body));
  }
  std::this_thread::sleep_for(milliseconds(500));
  auto waiting_threads = threads_of(srv.pid());
  CHECK(waiting_threads <= idle_threads + 4);
  std::vector<pollfd> polls;
  for (int fd : socks.fds)
    polls.push_back(pollfd{fd, POLLIN, 0});
  std::set<std::string> handed;
  std::vector<bool> answered(claims, false);
  milliseconds slowest{0};
  for (int n = 0; n < claims; ++n) {
    auto made = cli.Post("/v1/orchestrations",
                         json{{"payload", n}}.dump(), "application/json");
    REQUIRE(made);
    REQUIRE(made->status == 201);
    auto created = steady_clock::now();
    auto id = json::parse(made->body)["id"].get<std::string>();
    // Exactly one waiting claim answers with it.
    int got = -1;
    while (got < 0 && steady_clock::now() - created < seconds(5)) {
      for (auto& p : polls)
        p.revents = 0;
      if (poll(polls.data(), polls.size(), 50) <= 0)
        continue;
      for (size_t i = 0; i < polls.size(); ++i) {
        if (!(polls[i].revents & (POLLIN | POLLHUP)) || answered[i])
          continue;
        char buf[4096];
        auto r = ::recv(polls[i].fd, buf, sizeof buf, 0);
        REQUIRE(r > 0);
        std::string reply(buf, static_cast<size_t>(r));
        REQUIRE(reply.rfind("HTTP/1.1 200", 0) == 0);
        auto body = json::parse(reply.substr(reply.find("\r\n\r\n") + 4));
        CHECK(body["id"] == id);
        CHECK(body["lease"]["token"].get<std::string>().size() == 32);
        answered[i] = true;
        polls[i].events = 0;
        CHECK(got < 0);
        got = static_cast<int>(i);
      }
    }
    REQUIRE(got >= 0);
    slowest = std::max(slowest, duration_cast<milliseconds>(
                                  steady_clock::now() - created));
    CHECK(handed.insert(id).second);
  }
  INFO("slowest hand-over " << slowest.count() << " ms");
  CHECK(slowest < milliseconds(100));
  CHECK(std::count(answered.begin(), answered.end(), true) == claims);
}
