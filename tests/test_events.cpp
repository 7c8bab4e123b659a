// The event stream (GET /v1/events): every task and thread change after its
// commit, in commit order, with IDs a client resumes from (Last-Event-ID)
// within a bounded backlog, `reset` beyond it; filters; many subscribers.

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include <poll.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/actors/event_log.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono;
using json = nlohmann::json;

namespace {

// The sequence number of an event ID "EPOCH-SEQ".
uint64_t seq_of(const std::string& id) {
  return std::stoull(id.substr(id.find('-') + 1));
}

std::string epoch_of(const std::string& id) {
  return id.substr(0, id.find('-'));
}

// Every event ID of one stream is of one epoch and numbered one after the
// other.
void check_consecutive(const std::vector<test::sse_event>& events) {
  for (size_t i = 1; i < events.size(); ++i) {
    INFO(events[i - 1].id << " then " << events[i].id);
    CHECK(epoch_of(events[i].id) == epoch_of(events[0].id));
    CHECK(seq_of(events[i].id) == seq_of(events[i - 1].id) + 1);
  }
}

// What happened to each task, in the order the stream told.
std::map<std::string, std::vector<std::string>>
by_task(const std::vector<test::sse_event>& events) {
  std::map<std::string, std::vector<std::string>> out;
  for (auto& e : events)
    if (e.type.rfind("task.", 0) == 0)
      out[e.data["task"].get<std::string>()].push_back(e.type);
  return out;
}

std::string claim(httplib::Client& cli, const std::string& worker,
                  std::string& lease) {
  auto [status, body] = test::post_json(
    cli, "/v1/tasks/claim", {{"worker", worker}, {"lease_s", 30}});
  REQUIRE(status == 200);
  lease = body["lease"]["token"].get<std::string>();
  return body["id"].get<std::string>();
}

} // namespace

TEST_CASE("events: a subscriber sees every task transition of a run in "
          "commit order with consecutive IDs") {
  test::temp_dir dir;
  test::server_process srv{{"--data", dir.str()}};
  test::sse_client sub{srv.port(), "/v1/events"};
  REQUIRE(sub.wait_status(seconds(5)) == 200);
  httplib::Client cli{"127.0.0.1", srv.port()};
  REQUIRE(test::post_json(cli, "/v1/orchestrations",
                          {{"payload", "root"}, {"max_attempts", 2}})
            .first
          == 201);
  for (auto p : {"a", "b"})
    REQUIRE(test::post_json(cli, "/v1/tasks/0001/subtasks",
                            {{"payload", p}, {"max_attempts", 2}})
              .first
            == 201);
  // D1: 0001_t2 first. It fails once (retried), then both complete, then
  // the root.
  std::string lease;
  REQUIRE(claim(cli, "w", lease) == "0001_t2");
  REQUIRE(test::post_json(cli, "/v1/tasks/0001_t2/fail",
                          {{"reason", "flaky"}, {"lease", lease}})
            .first
          == 200);
  for (auto expected : {"0001_t2", "0001_t1", "0001"}) {
    REQUIRE(claim(cli, "w", lease) == expected);
    REQUIRE(test::post_json(cli, std::string{"/v1/tasks/"} + expected
                                   + "/complete",
                            {{"result", 1}, {"lease", lease}})
              .first
            == 200);
  }
  // 3 created, 4 claimed, 1 retried, 3 completed.
  REQUIRE(sub.wait_for(11, seconds(10)));
  auto& events = sub.events();
  check_consecutive(events);
  auto seen = by_task(events);
  using v = std::vector<std::string>;
  CHECK(seen["0001"] == v{"task.created", "task.claimed", "task.completed"});
  CHECK(seen["0001_t1"] == v{"task.created", "task.claimed", "task.completed"});
  CHECK(seen["0001_t2"]
        == v{"task.created", "task.claimed", "task.retried", "task.claimed",
             "task.completed"});
  // Commit order across tasks: the root is claimed after both children
  // completed, and the events say who and which attempt.
  auto position = [&](const std::string& task, const std::string& type) {
    auto i = std::find_if(events.begin(), events.end(), [&](auto& e) {
      return e.type == type && e.data["task"] == task;
    });
    REQUIRE(i != events.end());
    return i - events.begin();
  };
  CHECK(position("0001", "task.claimed")
        > position("0001_t1", "task.completed"));
  CHECK(position("0001", "task.claimed")
        > position("0001_t2", "task.completed"));
  auto retried = events[static_cast<size_t>(
    position("0001_t2", "task.retried"))];
  CHECK(retried.data["state"] == "pending");
  CHECK(retried.data["attempts"] == 1);
  auto done = events.back();
  CHECK(done.type == "task.completed");
  CHECK(done.data["task"] == "0001");
  CHECK(done.data["worker"] == "w");
}

TEST_CASE("events: an event is sent only once what it reports is durable") {
  test::temp_dir dir;
  std::string completed;
  {
    test::server_process srv{{"--data", dir.str()}};
    httplib::Client cli{"127.0.0.1", srv.port()};
    for (int i = 0; i < 20; ++i)
      REQUIRE(test::post_json(cli, "/v1/orchestrations", {{"payload", i}})
                .first
              == 201);
    test::sse_client sub{srv.port(), "/v1/events?types=task.completed"};
    REQUIRE(sub.wait_status(seconds(5)) == 200);
    // A worker completes tasks as fast as it can; the server dies the
    // moment the first completion is seen.
    std::atomic<bool> stop{false};
    std::thread worker{[&] {
      httplib::Client w{"127.0.0.1", srv.port()};
      while (!stop) {
        auto c = w.Post("/v1/tasks/claim", R"({"worker":"w"})",
                        "application/json");
        if (!c || c->status != 200)
          return;
        auto t = json::parse(c->body);
        w.Post("/v1/tasks/" + t["id"].get<std::string>() + "/complete",
               json{{"result", 1}, {"lease", t["lease"]["token"]}}.dump(),
               "application/json");
      }
    }};
    REQUIRE(sub.wait_for(1, seconds(10)));
    srv.stop(SIGKILL);
    stop = true;
    worker.join();
    completed = sub.events().front().data["task"].get<std::string>();
  }
  test::server_process again{{"--data", dir.str()}};
  httplib::Client cli{"127.0.0.1", again.port()};
  auto [status, task] = test::get_json(cli, "/v1/tasks/" + completed);
  REQUIRE(status == 200);
  CHECK(task["state"] == "completed");
}

TEST_CASE("events: a client that resumes with Last-Event-ID gets what it "
          "missed and reset past the backlog") {
  test::server_process srv{{"--event-backlog", "30"}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto create = [&](int n) {
    for (int i = 0; i < n; ++i)
      REQUIRE(test::post_json(cli, "/v1/orchestrations", {{"payload", i}})
                .first
              == 201);
  };
  std::string last;
  {
    test::sse_client sub{srv.port(), "/v1/events"};
    REQUIRE(sub.wait_status(seconds(5)) == 200);
    create(5);
    REQUIRE(sub.wait_for(5, seconds(10)));
    last = sub.events().back().id;
  }
  create(10); // missed: events 6 to 15
  std::string resumed_last;
  {
    test::sse_client sub{srv.port(), "/v1/events",
                         {{"Last-Event-ID", last}}};
    REQUIRE(sub.wait_for(10, seconds(10)));
    auto& events = sub.events();
    CHECK(seq_of(events.front().id) == seq_of(last) + 1);
    CHECK(events.front().data["task"] == "0006");
    CHECK(events.back().data["task"] == "0015");
    check_consecutive(events);
    // Nothing more than what was missed.
    sub.read_some(300);
    CHECK(sub.events().size() == 10);
    resumed_last = events.back().id;
  }
  // The same through the query (for clients that cannot set headers).
  {
    test::sse_client sub{srv.port(), "/v1/events?last_event_id=" + last};
    REQUIRE(sub.wait_for(10, seconds(10)));
    CHECK(sub.events().front().data["task"] == "0006");
  }
  create(40); // the backlog of 30 no longer holds event 16
  {
    test::sse_client sub{srv.port(), "/v1/events",
                         {{"Last-Event-ID", resumed_last}}};
    REQUIRE(sub.wait_for(1, seconds(10)));
    auto reset = sub.events().front();
    CHECK(reset.type == "reset");
    CHECK(reset.data["last_event_id"] == resumed_last);
    CHECK(reset.data["reason"].get<std::string>().find("backlog")
          != std::string::npos);
    // It goes on live from there.
    create(1);
    REQUIRE(sub.wait_for(2, seconds(10)));
    CHECK(sub.events()[1].data["task"] == "0056");
    CHECK(seq_of(sub.events()[1].id) == seq_of(reset.id) + 1);
  }
  // An ID of an earlier process (another epoch): reset.
  {
    test::sse_client sub{srv.port(), "/v1/events",
                         {{"Last-Event-ID", "12345-7"}}};
    REQUIRE(sub.wait_for(1, seconds(10)));
    CHECK(sub.events().front().type == "reset");
    CHECK(sub.events().front().data["reason"].get<std::string>().find(
            "restarted")
          != std::string::npos);
  }
}

TEST_CASE("events: filters by type and family and orchestration and "
          "thread") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto [ts, thread] = test::post_json(cli, "/v1/threads", json::object());
  REQUIRE(ts == 201);
  auto thread_id = thread["thread_id"].get<std::string>();
  test::sse_client completed{srv.port(),
                             "/v1/events?types=task.completed,thread.cleared"};
  test::sse_client second{srv.port(), "/v1/events?orchestration=0002"};
  test::sse_client threads{srv.port(), "/v1/events?types=thread"};
  test::sse_client one{srv.port(), "/v1/events?thread=" + thread_id};
  for (auto* s : {&completed, &second, &threads, &one})
    REQUIRE(s->wait_status(seconds(5)) == 200);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(test::post_json(cli, "/v1/orchestrations", {{"payload", i}})
              .first
            == 201);
    std::string lease;
    auto id = claim(cli, "w", lease);
    REQUIRE(test::post_json(cli, "/v1/tasks/" + id + "/complete",
                            {{"result", i}, {"lease", lease}})
              .first
            == 200);
  }
  REQUIRE(test::post_json(cli, "/v1/threads/" + thread_id + "/messages",
                          {{"content", "hello"}})
            .first
          == 200);
  REQUIRE(test::post_json(cli, "/v1/threads/new/messages",
                          {{"content", "elsewhere"}})
            .first
          == 200);
  REQUIRE(cli.Delete("/v1/threads/" + thread_id + "/turns")->status == 200);
  REQUIRE(completed.wait_for(4, seconds(10)));
  REQUIRE(second.wait_for(3, seconds(10)));
  // thread.created, two turns, of each of the two threads, and the clear.
  REQUIRE(threads.wait_for(6, seconds(10)));
  REQUIRE(one.wait_for(3, seconds(10)));
  for (auto* s : {&completed, &second, &threads, &one})
    s->read_some(300); // nothing more arrives
  std::vector<std::string> types;
  for (auto& e : completed.events())
    types.push_back(e.type + " " + e.data.value("task", e.data.value("thread", "")));
  CHECK(types
        == std::vector<std::string>{"task.completed 0001", "task.completed 0002",
                                    "task.completed 0003",
                                    "thread.cleared " + thread_id});
  CHECK(second.events().size() == 3);
  for (auto& e : second.events())
    CHECK(e.data["task"] == "0002");
  CHECK(threads.events().size() == 6);
  for (auto& e : threads.events())
    CHECK(e.type.rfind("thread.", 0) == 0);
  CHECK(one.events().size() == 3);
  for (auto& e : one.events())
    CHECK(e.data["thread"] == thread_id);
  CHECK(one.events()[0].type == "thread.turn_appended");
  CHECK(one.events()[0].data["role"] == "user");
  CHECK(one.events()[1].data["role"] == "assistant");
  CHECK(one.events()[1].data["turns"] == 2);
  CHECK(one.events()[2].type == "thread.cleared");
}

TEST_CASE("events: thread creations and turns and forks and deletions are "
          "events after their commit") {
  test::temp_dir dir;
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  runtime rt{opts};
  auto source = std::string{"3f8e2a40-5c1d-4b7a-9e0f-1a2b3c4d5e6f"};
  REQUIRE(rt.add_turn(source, turn{turn_role::user, "hello"}));
  REQUIRE(rt.add_turn(source, turn{turn_role::assistant, "hi"}));
  caf::scoped_actor self{rt.system()};
  std::string copy;
  self->request(rt.thread_registry(), seconds(5), fork_atom::value, source)
    .receive([&](thread_ref& ref) { copy = ref.thread_id; },
             [&](caf::error& err) { FAIL(describe(err)); });
  REQUIRE(rt.clear_thread(copy));
  REQUIRE(rt.delete_thread(source));
  auto page = rt.events()->read(0, 100);
  CHECK_FALSE(page.reset);
  std::vector<std::string> seen;
  for (auto& e : page.events)
    seen.push_back(e->type + " " + json::parse(e->data)["thread"].get<std::string>());
  CHECK(seen
        == std::vector<std::string>{
          "thread.created " + source, "thread.turn_appended " + source,
          "thread.turn_appended " + source, "thread.forked " + copy,
          "thread.cleared " + copy, "thread.deleted " + source});
  auto forked = json::parse(page.events[3]->data);
  CHECK(forked["source"] == source);
  CHECK(forked["turns"] == 2);
  auto second = json::parse(page.events[2]->data);
  CHECK(second["role"] == "assistant");
  CHECK(second["turns"] == 2);
  CHECK(page.events[0]->thread == source);
  CHECK(page.events[0]->orchestration.empty());
}

TEST_CASE("events: 500 subscribers each receive every event in order") {
  test::raise_fd_limit();
  test::server_process srv;
  std::vector<std::unique_ptr<test::sse_client>> subs;
  for (int i = 0; i < 500; ++i)
    subs.push_back(
      std::make_unique<test::sse_client>(srv.port(), "/v1/events"));
  for (auto& s : subs)
    REQUIRE(s->wait_status(seconds(10)) == 200);
  // Writers on two connections: 100 orchestrations claimed and completed.
  constexpr int per_writer = 50;
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w)
    writers.emplace_back([&srv, w] {
      httplib::Client cli{"127.0.0.1", srv.port()};
      for (int i = 0; i < per_writer; ++i) {
        cli.Post("/v1/orchestrations", json{{"payload", i}}.dump(),
                 "application/json");
        auto c = cli.Post("/v1/tasks/claim",
                          json{{"worker", "w" + std::to_string(w)}}.dump(),
                          "application/json");
        if (!c || c->status != 200)
          continue;
        auto t = json::parse(c->body);
        cli.Post("/v1/tasks/" + t["id"].get<std::string>() + "/complete",
                 json{{"result", i}, {"lease", t["lease"]["token"]}}.dump(),
                 "application/json");
      }
    });
  for (auto& w : writers)
    w.join();
  constexpr size_t expected = 2 * per_writer * 3;
  auto until = steady_clock::now() + seconds(60);
  std::vector<pollfd> fds;
  while (steady_clock::now() < until) {
    bool all = true;
    fds.clear();
    for (auto& s : subs)
      if (s->events().size() < expected && !s->closed()) {
        all = false;
        fds.push_back(pollfd{s->fd(), POLLIN, 0});
      }
    if (all)
      break;
    ::poll(fds.data(), fds.size(), 50);
    for (auto& s : subs)
      if (s->events().size() < expected && !s->closed())
        s->read_some(0);
  }
  auto& reference = subs.front()->events();
  REQUIRE(reference.size() == expected);
  check_consecutive(reference);
  std::set<std::string> completed;
  for (auto& e : reference)
    if (e.type == "task.completed")
      completed.insert(e.data["task"].get<std::string>());
  CHECK(completed.size() == 2 * per_writer);
  size_t behind = 0, different = 0;
  for (auto& s : subs) {
    if (s->events().size() != expected) {
      ++behind;
      continue;
    }
    for (size_t i = 0; i < expected; ++i)
      if (s->events()[i].id != reference[i].id) {
        ++different;
        break;
      }
  }
  CHECK(behind == 0);
  CHECK(different == 0);
  // /metrics counts them.
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto metrics = cli.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("spindle_event_subscribers 500")
        != std::string::npos);
  CHECK(metrics->body.find("spindle_events_published "
                           + std::to_string(expected))
        != std::string::npos);
}

TEST_CASE("events: bad filters and event IDs are refused with 400 and no "
          "stream") {
  test::server_process srv;
  for (auto [target, param] :
       std::vector<std::pair<std::string, std::string>>{
         {"/v1/events?types=task.exploded", "types"},
         {"/v1/events?types=task,", "types"},
         {"/v1/events?orchestration=0001_t1", "orchestration"},
         {"/v1/events?orchestration=%00", "orchestration"},
         {"/v1/events?thread=a%2Fb", "thread"},
         {"/v1/events?last_event_id=zz-1", "last_event_id"},
         {"/v1/events?since=1", ""}}) {
    INFO(target);
    test::sse_client sub{srv.port(), target};
    REQUIRE(sub.wait_status(seconds(5)) == 400);
    auto body = json::parse(sub.body(), nullptr, false);
    REQUIRE(body.is_object());
    if (!param.empty())
      CHECK(body["error"]["param"] == param);
  }
  test::sse_client bad{srv.port(), "/v1/events",
                       {{"Last-Event-ID", "not-an-id"}}};
  CHECK(bad.wait_status(seconds(5)) == 400);
  // The server goes on serving streams.
  test::sse_client good{srv.port(), "/v1/events"};
  CHECK(good.wait_status(seconds(5)) == 200);
}

// -- the log itself ------------------------------------------------------------------

TEST_CASE("event log: a bounded backlog read in order and reset past it and "
          "paused subscribers are not woken") {
  event_log::options opts;
  opts.capacity = 10;
  opts.coalesce = milliseconds{1};
  auto log = std::make_shared<event_log>(opts);
  auto publish = [&](int n) {
    std::vector<event> batch;
    for (int i = 0; i < n; ++i) {
      event e;
      e.type = "task.created";
      e.data = "{}";
      batch.push_back(std::move(e));
    }
    log->publish(std::move(batch));
  };
  std::atomic<int> woken_a{0}, woken_b{0};
  auto a = log->subscribe([&](const event_log::round&) { ++woken_a; });
  auto b = log->subscribe([&](const event_log::round&) { ++woken_b; });
  b->pause();
  publish(4);
  auto until = steady_clock::now() + seconds(5);
  while (woken_a == 0 && steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(1));
  CHECK(woken_a > 0);
  CHECK(woken_b == 0);
  b->resume();
  until = steady_clock::now() + seconds(5);
  while (woken_b == 0 && steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(1));
  CHECK(woken_b > 0);
  auto page = log->read(0, 100);
  CHECK_FALSE(page.reset);
  REQUIRE(page.events.size() == 4);
  CHECK(page.events[0]->seq == 1);
  CHECK(page.next_after == 4);
  CHECK(page.events[0]->frame.find("event: task.created\ndata: {}\n\n")
        != std::string::npos);
  publish(10); // 14 published, 5 to 14 kept
  CHECK(log->last() == 14);
  CHECK(log->oldest() == 5);
  auto behind = log->read(2, 3);
  CHECK(behind.reset);
  REQUIRE(behind.events.size() == 3);
  CHECK(behind.events[0]->seq == 5);
  CHECK(behind.next_after == 7);
  auto edge = log->read(4, 100);
  CHECK_FALSE(edge.reset);
  CHECK(edge.events.size() == 10);
  auto future = log->read(99, 100);
  CHECK(future.reset);
  CHECK(future.events.empty());
  a.reset();
  CHECK(log->subscribers() == 1);
}
