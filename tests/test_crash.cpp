// Crash safety end to end: the real server with a data directory, writers
// over HTTP, `kill -9` at a random moment, a restart on the same directory.
// Every acknowledged turn, item, memory and task change is present, in
// order, and no ID is ever handed out twice, over several crashes in a row.

#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include "support.hpp"

using json = nlohmann::json;
using spindle::test::server_process;
using spindle::test::temp_dir;

namespace {

constexpr size_t writers = 6;

// What the server acknowledged to one writer, over every run.
struct acked {
  std::vector<std::string> messages; // contents, in order
  std::vector<std::string> items;    // item IDs, in order
  std::vector<std::string> memories; // unique tokens
  std::vector<std::string> orchestrations; // created
  std::vector<std::string> completed;      // tasks completed
};

std::string thread_of(size_t w) {
  return "crash-w" + std::to_string(w);
}

std::string user_of(size_t w) {
  return "user" + std::to_string(w);
}

// Drives the server until it dies; records only what was acknowledged.
void write_until_killed(int port, size_t w, int run, acked& out,
                        std::vector<std::string>& ids, std::mutex& ids_mtx) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(std::chrono::seconds(10));
  cli.set_connection_timeout(std::chrono::seconds(2));
  for (int k = 0;; ++k) {
    auto tag = "r" + std::to_string(run) + "k" + std::to_string(k);
    auto content = "w" + std::to_string(w) + " " + tag;
    auto r = cli.Post(("/v1/threads/" + thread_of(w) + "/messages").c_str(),
                      json{{"content", content}}.dump(), "application/json");
    if (!r)
      return; // the server is gone
    if (r->status == 200)
      out.messages.push_back(content);
    r = cli.Post(("/v1/threads/" + thread_of(w) + "/items").c_str(),
                 json{{"type", "text"}, {"content", content}}.dump(),
                 "application/json");
    if (!r)
      return;
    if (r->status == 201)
      out.items.push_back(json::parse(r->body)["item"]["id"]);
    if (k % 3 == 0) {
      auto token = "zq" + std::to_string(w) + "x" + tag;
      r = cli.Post("/v1/memories",
                   json{{"content", "remember " + token},
                        {"user_id", user_of(w)}}
                     .dump(),
                   "application/json");
      if (!r)
        return;
      if (r->status == 201)
        out.memories.push_back(token);
    }
    if (k % 2 == 0) {
      // A task change: create an orchestration, claim a task, complete it.
      r = cli.Post("/v1/orchestrations", json{{"payload", tag}}.dump(),
                   "application/json");
      if (!r)
        return;
      if (r->status == 201)
        out.orchestrations.push_back(json::parse(r->body)["id"]);
      r = cli.Post("/v1/tasks/claim",
                   json{{"worker", "crash-w" + std::to_string(w)}}.dump(),
                   "application/json");
      if (!r)
        return;
      if (r->status == 200) {
        auto claimed = json::parse(r->body);
        std::string task = claimed["id"];
        r = cli.Post(("/v1/tasks/" + task + "/complete").c_str(),
                     json{{"result", tag},
                          {"lease", claimed["lease"]["token"]}}
                       .dump(),
                     "application/json");
        if (!r)
          return;
        if (r->status == 200)
          out.completed.push_back(task);
      }
    }
    r = cli.Post("/v1/ids", json{{"kind", "context"}}.dump(),
                 "application/json");
    if (!r)
      return;
    if (r->status == 200 || r->status == 201) {
      std::lock_guard<std::mutex> guard{ids_mtx};
      ids.push_back(json::parse(r->body)["id"]);
    }
  }
}

json get(httplib::Client& cli, const std::string& path) {
  auto r = cli.Get(path.c_str());
  REQUIRE(r);
  INFO(path << " -> " << r->status << " " << r->body);
  REQUIRE(r->status == 200);
  return json::parse(r->body);
}

// Everything acknowledged so far is on the restarted server.
void verify(int port, const std::vector<acked>& all) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(std::chrono::seconds(30));
  for (size_t w = 0; w < all.size(); ++w) {
    auto& a = all[w];
    if (!a.messages.empty()) {
      auto h = get(cli, "/v1/threads/" + thread_of(w)
                          + "/history?max_turns=100000");
      // Acknowledged messages appear in order, each answered.
      size_t next = 0;
      auto& turns = h["turns"];
      for (size_t i = 0; i < turns.size(); ++i) {
        if (next < a.messages.size() && turns[i]["role"] == "user"
            && turns[i]["content"] == a.messages[next]) {
          INFO("writer " << w << " message " << a.messages[next]);
          REQUIRE(i + 1 < turns.size());
          CHECK(turns[i + 1]["role"] == "assistant");
          ++next;
        }
      }
      INFO("writer " << w << ": " << next << " of " << a.messages.size()
                     << " acknowledged messages found in order");
      CHECK(next == a.messages.size());
    }
    // The window holds the newest items: every acknowledged one among the
    // last 40 (one unacknowledged add may have been stored as well).
    auto items = get(cli, "/v1/threads/" + thread_of(w) + "/items");
    std::vector<std::string> stored;
    for (auto& item : items["items"])
      stored.push_back(item["id"]);
    auto first = a.items.size() > 40 ? a.items.size() - 40 : 0;
    for (size_t i = first; i < a.items.size(); ++i) {
      INFO("writer " << w << " item " << a.items[i]);
      CHECK(std::find(stored.begin(), stored.end(), a.items[i])
            != stored.end());
    }
    for (auto& id : a.orchestrations) {
      INFO("writer " << w << " orchestration " << id);
      auto tree = get(cli, "/v1/orchestrations/" + id);
      CHECK(tree["id"] == id);
    }
    for (auto& id : a.completed) {
      INFO("writer " << w << " completed task " << id);
      auto task = get(cli, "/v1/tasks/" + id);
      CHECK(task["state"] == "completed");
    }
    for (auto& token : a.memories) {
      auto m = get(cli, "/v1/memories?user_id=" + user_of(w) + "&thread_id="
                          + thread_of(w) + "&q=" + token);
      INFO("writer " << w << " memory " << token);
      CHECK(m["snippet"].get<std::string>().find(token) != std::string::npos);
    }
  }
}

} // namespace

TEST_CASE("crash: kill -9 at a random moment loses nothing acknowledged, "
          "several times in a row") {
  temp_dir dir;
  std::vector<acked> all(writers);
  std::vector<std::string> ids;
  std::mutex ids_mtx;
  std::mt19937 rng{std::random_device{}()};
  constexpr int runs = 3;
  for (int run = 0; run < runs; ++run) {
    server_process srv{{"--data", dir.str(), "--sync", "normal",
                        "--max-resident", "4"}};
    if (run > 0)
      verify(srv.port(), all); // the previous crash lost nothing
    std::vector<std::thread> pool;
    for (size_t w = 0; w < writers; ++w)
      pool.emplace_back([&, w] {
        write_until_killed(srv.port(), w, run, all[w], ids, ids_mtx);
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(
      std::uniform_int_distribution<int>{300, 1500}(rng)));
    CHECK(srv.stop(SIGKILL) == -1);
    for (auto& t : pool)
      t.join();
  }
  size_t messages = 0;
  for (auto& a : all)
    messages += a.messages.size();
  INFO(messages << " messages acknowledged over " << runs << " crashes");
  CHECK(messages > 0);
  {
    server_process srv{{"--data", dir.str()}};
    verify(srv.port(), all);
  }
  // No ID was handed out twice: not by /v1/ids, not to items.
  std::set<std::string> unique(ids.begin(), ids.end());
  for (auto& a : all)
    for (auto& id : a.items)
      unique.insert(id);
  size_t total = ids.size();
  for (auto& a : all)
    total += a.items.size();
  CHECK(unique.size() == total);
  std::set<std::string> orchestrations;
  size_t created = 0;
  for (auto& a : all) {
    orchestrations.insert(a.orchestrations.begin(), a.orchestrations.end());
    created += a.orchestrations.size();
  }
  CHECK(orchestrations.size() == created);
}
