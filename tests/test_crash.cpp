// Crash safety end to end, as a matrix of kill points: the real server with
// a data directory, writers over HTTP (turns on more threads than may stay
// resident, so threads passivate and activate again and every activation of
// a journaled thread folds the journal; context items; memories;
// orchestrations with subtasks, claims and completions; ID allocation),
// `kill -9` at a random moment, a restart on the same directory, again and
// again. After every kill each database file passes `PRAGMA
// integrity_check`; after every restart every acknowledged write is there
// (messages in order, items, memories, created tasks, claims and
// completions), no ID was handed out twice, and every orchestration tree
// holds together.
//
// SPINDLE_CRASH_KILLS sets the number of kills (default 30, what CTest
// runs; .ci/crash-matrix runs 200), SPINDLE_CRASH_SEED the seed of the kill
// points and of the load's choices (random by default; printed, so a
// failing matrix can be run again with it).

#include <algorithm>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include "spindle/messages/task_id.hpp"
#include "support.hpp"

using json = nlohmann::json;
using spindle::test::server_process;
using spindle::test::test_store;

namespace {

constexpr size_t writers = 6;
constexpr size_t threads_per_writer = 3;
// Fewer resident threads than threads written: activations all the time.
constexpr const char* max_resident = "4";
// Context items a window keeps (docs/context.md).
constexpr size_t window_items = 50;

std::string thread_name(size_t w, size_t t) {
  return "crash-w" + std::to_string(w) + "-" + std::to_string(t);
}

std::string user_of(size_t w) {
  return "user" + std::to_string(w);
}

std::string worker_of(size_t w) {
  return "crash-w" + std::to_string(w);
}

// The orchestration a task ID belongs to.
std::string orchestration_of(const std::string& task) {
  return task.substr(0, task.find("_t"));
}

// What the server acknowledged to one writer in one run, in order.
struct run_log {
  std::vector<std::pair<std::string, std::string>> messages; // thread, text
  std::vector<std::pair<std::string, std::string>> items;    // thread, ID
  std::vector<std::pair<std::string, std::string>> memories; // ID, content
  struct task {
    std::string id, parent; // parent empty for an orchestration
    json payload;
  };
  std::vector<task> tasks;
  std::vector<std::pair<std::string, std::string>> claims; // task, worker
  std::vector<std::pair<std::string, json>> completions;   // task, result
  std::vector<std::pair<std::string, std::string>> ids;    // kind, ID
};

bool created(const httplib::Result& r) {
  return r && (r->status == 200 || r->status == 201);
}

// Drives the server until it dies; records only what was acknowledged.
// `seed` makes the writer's choices.
void write_until_killed(int port, size_t w, size_t run, uint64_t seed,
                        run_log& out) {
  std::mt19937_64 rng{seed};
  auto one_in = [&](uint64_t n) { return rng() % n == 0; };
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(std::chrono::seconds(10));
  cli.set_connection_timeout(std::chrono::seconds(2));
  auto post = [&](const std::string& path, const json& body) {
    return cli.Post(path.c_str(), body.dump(), "application/json");
  };
  std::vector<std::string> roots; // orchestrations this writer made
  for (size_t k = 0;; ++k) {
    auto tag = "r" + std::to_string(run) + "k" + std::to_string(k);
    auto thread = thread_name(w, rng() % threads_per_writer);
    auto content = "w" + std::to_string(w) + " " + tag;
    auto r = post("/v1/threads/" + thread + "/messages", {{"content", content}});
    if (!r)
      return; // the server is gone
    if (r->status == 200)
      out.messages.emplace_back(thread, content);
    r = post("/v1/threads/" + thread + "/items",
             {{"type", "text"}, {"content", content}});
    if (!r)
      return;
    if (r->status == 201)
      out.items.emplace_back(
        thread, json::parse(r->body)["item"]["id"].get<std::string>());
    if (one_in(3)) {
      auto text = "remember zq" + std::to_string(w) + "x" + tag;
      r = post("/v1/memories", {{"content", text}, {"user_id", user_of(w)}});
      if (!r)
        return;
      if (r->status == 201)
        out.memories.emplace_back(json::parse(r->body)["id"].dump(), text);
    }
    if (one_in(2)) {
      // A tree: an orchestration, sometimes with subtasks, one level or two.
      json payload{{"w", w}, {"tag", tag}};
      r = post("/v1/orchestrations", {{"payload", payload}});
      if (!r)
        return;
      if (r->status == 201) {
        std::string root = json::parse(r->body)["id"];
        out.tasks.push_back({root, "", payload});
        roots.push_back(root);
        auto parent = root;
        for (uint64_t n = rng() % 3; n > 0; --n) {
          json sub{{"w", w}, {"tag", tag}, {"n", n}};
          r = post("/v1/tasks/" + parent + "/subtasks", {{"payload", sub}});
          if (!r)
            return;
          if (r->status != 201)
            break; // completed meanwhile by another writer's claim
          std::string id = json::parse(r->body)["id"];
          out.tasks.push_back({id, parent, sub});
          if (one_in(2))
            parent = id;
        }
      }
    }
    if (one_in(2)) {
      r = post("/v1/tasks/claim", {{"worker", worker_of(w)}});
      if (!r)
        return;
      if (r->status == 200) {
        auto claimed = json::parse(r->body);
        std::string task = claimed["id"];
        out.claims.emplace_back(task, worker_of(w));
        // Some claimed tasks are left running: the restart makes them stale.
        if (!one_in(8)) {
          json result{{"by", w}, {"tag", tag}};
          r = post("/v1/tasks/" + task + "/complete",
                   {{"result", result}, {"lease", claimed["lease"]["token"]}});
          if (!r)
            return;
          if (r->status == 200)
            out.completions.emplace_back(task, result);
        }
      }
    }
    json ask{{"kind", "context"}};
    if (one_in(4))
      ask = {{"kind", "orchestration"}};
    else if (one_in(4) && !roots.empty())
      ask = {{"kind", "task"}, {"parent", roots[rng() % roots.size()]}};
    r = post("/v1/ids", ask);
    if (!r)
      return;
    if (created(r))
      out.ids.emplace_back(ask["kind"].get<std::string>(),
                           json::parse(r->body)["id"].get<std::string>());
  }
}

// Counts the invariants checked and keeps the ones broken.
struct tally {
  size_t checked = 0;
  std::vector<std::string> violations;

  void expect(bool ok, const std::string& what) {
    ++checked;
    if (!ok)
      violations.push_back(what);
  }
};

// Everything acknowledged since the matrix began, and every ID the server
// showed or handed out.
struct ledger {
  std::map<std::string, std::vector<std::string>> messages; // by thread
  std::map<std::string, std::vector<std::string>> items;    // by thread
  std::map<std::string, std::map<std::string, std::string>> memories; // user
  std::map<std::string, run_log::task> tasks;
  std::map<std::string, std::string> claims;  // task -> worker
  std::map<std::string, json> completions;    // task -> result
  std::set<std::string> orchestrations; // acknowledged or holding a claim
  // IDs by kind (context, orchestration, task, memory): every one
  // acknowledged, and every one the server showed after a restart.
  std::map<std::string, std::set<std::string>> issued;
  std::map<std::string, std::set<std::string>> seen;

  // An ID of `kind` handed out now: never handed out nor seen before.
  void issue(tally& t, const std::string& kind, const std::string& id) {
    t.expect(!seen[kind].count(id),
             kind + " ID " + id + " handed out again (it was stored before)");
    t.expect(issued[kind].insert(id).second,
             kind + " ID " + id + " handed out twice");
  }

  // Adds one writer's run, checking that its IDs are new.
  void add(tally& t, size_t w, const run_log& log) {
    for (auto& [thread, text] : log.messages)
      messages[thread].push_back(text);
    for (auto& [thread, id] : log.items) {
      items[thread].push_back(id);
      issue(t, "context", id);
    }
    for (auto& [id, text] : log.memories) {
      memories[user_of(w)][id] = text;
      issue(t, "memory", id);
    }
    for (auto& task : log.tasks) {
      tasks[task.id] = task;
      orchestrations.insert(orchestration_of(task.id));
      issue(t, task.parent.empty() ? "orchestration" : "task", task.id);
    }
    for (auto& [task, worker] : log.claims) {
      t.expect(claims.emplace(task, worker).second,
               "task " + task + " claimed twice");
      orchestrations.insert(orchestration_of(task));
    }
    for (auto& [task, result] : log.completions)
      completions[task] = result;
    for (auto& [kind, id] : log.ids)
      issue(t, kind, id);
  }
};

// What the checks covered, for the summary.
struct coverage {
  size_t integrity = 0, messages = 0, items = 0, memories = 0, trees = 0,
         tasks = 0, claims = 0, completions = 0;
};

std::pair<int, json> get(httplib::Client& cli, const std::string& path) {
  auto r = cli.Get(path.c_str());
  if (!r)
    return {0, json{}};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// Acknowledged messages appear in each thread's history in order, each
// answered by the assistant.
void check_messages(httplib::Client& cli, const ledger& l, tally& t,
                    coverage& c) {
  for (auto& [thread, acked] : l.messages) {
    auto [status, h] = get(cli, "/v1/threads/" + thread
                                  + "/history?max_turns=100000");
    t.expect(status == 200, "history of " + thread + ": status "
                              + std::to_string(status));
    if (status != 200)
      continue;
    auto& turns = h["turns"];
    size_t next = 0;
    for (size_t i = 0; i < turns.size() && next < acked.size(); ++i) {
      if (turns[i]["role"] != "user" || turns[i]["content"] != acked[next])
        continue;
      t.expect(i + 1 < turns.size() && turns[i + 1]["role"] == "assistant",
               thread + ": message '" + acked[next] + "' has no reply");
      ++next;
    }
    t.expect(next == acked.size(),
             thread + ": " + std::to_string(next) + " of "
               + std::to_string(acked.size())
               + " acknowledged messages found in order; the first missing: '"
               + (next < acked.size() ? acked[next] : "") + "'");
    c.messages += acked.size();
  }
}

// Each window holds its newest items, oldest evicted first: every
// acknowledged item newer than the oldest one kept is there, in order.
void check_items(httplib::Client& cli, ledger& l, tally& t, coverage& c) {
  for (auto& [thread, acked] : l.items) {
    auto [status, body] = get(cli, "/v1/threads/" + thread + "/items");
    t.expect(status == 200, "items of " + thread + ": status "
                              + std::to_string(status));
    if (status != 200)
      continue;
    std::vector<std::string> stored;
    for (auto& item : body["items"]) {
      stored.push_back(item["id"].get<std::string>());
      l.seen["context"].insert(item["id"].get<std::string>());
    }
    // Where each acknowledged item is in the window, if it is.
    size_t first = acked.size();
    for (size_t i = 0; i < acked.size(); ++i)
      if (std::find(stored.begin(), stored.end(), acked[i]) != stored.end()) {
        first = i;
        break;
      }
    t.expect(first < acked.size() || stored.size() >= window_items,
             thread + ": none of " + std::to_string(acked.size())
               + " acknowledged items kept in a window of "
               + std::to_string(stored.size()));
    size_t at = 0;
    for (size_t i = first; i < acked.size(); ++i) {
      auto it = std::find(stored.begin() + static_cast<long>(at), stored.end(),
                          acked[i]);
      t.expect(it != stored.end(), thread + ": acknowledged item " + acked[i]
                                     + " missing or out of order");
      if (it != stored.end())
        at = static_cast<size_t>(it - stored.begin()) + 1;
    }
    t.expect(acked.size() < window_items || stored.size() == window_items,
             thread + ": a full window holds " + std::to_string(stored.size())
               + " items");
    c.items += acked.size() - first;
  }
}

// Every acknowledged memory is among its user's entries, with its content.
void check_memories(httplib::Client& cli, ledger& l, tally& t, coverage& c) {
  for (auto& [user, acked] : l.memories) {
    std::map<std::string, std::string> stored;
    std::string cursor;
    for (;;) {
      auto [status, page] = get(cli, "/v1/memories/entries?user_id=" + user
                                       + "&limit=1000"
                                       + (cursor.empty() ? "" : "&cursor="
                                                                  + cursor));
      t.expect(status == 200, "memories of " + user + ": status "
                                + std::to_string(status));
      if (status != 200)
        break;
      for (auto& e : page["entries"]) {
        auto id = e["id"].dump();
        t.expect(stored.emplace(id, e["content"].get<std::string>()).second,
                 user + ": memory " + id + " listed twice");
        l.seen["memory"].insert(id);
      }
      if (page["next_cursor"].is_null())
        break;
      cursor = page["next_cursor"].get<std::string>();
    }
    for (auto& [id, text] : acked) {
      auto it = stored.find(id);
      t.expect(it != stored.end() && it->second == text,
               user + ": acknowledged memory " + id + " ('" + text
                 + "') missing or changed");
    }
    c.memories += acked.size();
  }
}

// One orchestration's tree, read through the API, holds together and
// holds every acknowledged change of its tasks.
void check_tree(httplib::Client& cli, ledger& l, const std::string& root,
                tally& t, coverage& c) {
  auto [status, tree] = get(cli, "/v1/orchestrations/" + root);
  t.expect(status == 200, "orchestration " + root + ": status "
                            + std::to_string(status));
  if (status != 200)
    return;
  ++c.trees;
  std::map<std::string, json> tasks;
  std::map<std::string, size_t> incomplete; // by parent
  for (auto& task : tree["tasks"]) {
    std::string id = task["id"];
    t.expect(tasks.emplace(id, task).second,
             root + ": task " + id + " listed twice");
    l.seen[id == root ? "orchestration" : "task"].insert(id);
    if (task["parent"].is_string() && task["state"] != "completed")
      ++incomplete[task["parent"].get<std::string>()];
  }
  t.expect(tasks.count(root) == 1, root + ": the tree lacks its root");
  for (auto& [id, task] : tasks) {
    auto parsed = spindle::task_id::parse(id);
    t.expect(static_cast<bool>(parsed), root + ": task ID " + id
                                          + " off the grammar");
    if (!parsed)
      continue;
    auto parent = parsed->parent();
    std::string expected_parent = parent ? parent->to_string() : "";
    auto& given = task["parent"];
    t.expect(given.is_null() ? expected_parent.empty()
                             : given == expected_parent,
             root + ": task " + id + " names parent " + given.dump());
    t.expect(expected_parent.empty() || tasks.count(expected_parent),
             root + ": the parent of " + id + " is not in the tree");
    t.expect(orchestration_of(id) == root,
             root + ": task " + id + " of another orchestration");
    auto waiting = incomplete.count(id) ? incomplete[id] : 0;
    t.expect(task["incomplete_children"] == waiting,
             root + ": task " + id + " counts "
               + task["incomplete_children"].dump()
               + " incomplete children, the tree shows "
               + std::to_string(waiting));
    // A restart leaves no task running: their workers are gone.
    t.expect(task["state"] != "running",
             root + ": task " + id + " still running after a restart");
    auto attempts = task["attempts"].get<int64_t>();
    t.expect(attempts <= task["max_attempts"].get<int64_t>(),
             root + ": task " + id + " claimed " + std::to_string(attempts)
               + " times");
    t.expect((task["state"] == "pending") == (attempts == 0),
             root + ": task " + id + " is " + task["state"].dump() + " after "
               + std::to_string(attempts) + " claims");
    ++c.tasks;
  }
  // The acknowledged changes of its tasks.
  auto from = l.tasks.lower_bound(root);
  for (auto it = from; it != l.tasks.end() && orchestration_of(it->first) == root;
       ++it) {
    auto found = tasks.find(it->first);
    t.expect(found != tasks.end(),
             root + ": acknowledged task " + it->first + " missing");
    if (found == tasks.end())
      continue;
    auto& given = found->second["parent"];
    t.expect(it->second.parent.empty() ? given.is_null()
                                       : given == it->second.parent,
             root + ": task " + it->first + " moved to parent " + given.dump());
    t.expect(found->second["payload"] == it->second.payload,
             root + ": task " + it->first + " lost its payload");
  }
  for (auto it = l.claims.lower_bound(root);
       it != l.claims.end() && orchestration_of(it->first) == root; ++it) {
    auto found = tasks.find(it->first);
    bool kept = found != tasks.end()
                && (found->second["state"] == "stale"
                    || found->second["state"] == "completed")
                && found->second["worker"] == it->second;
    t.expect(kept, root + ": acknowledged claim of " + it->first + " by "
                     + it->second + " lost: "
                     + (found != tasks.end() ? found->second.dump()
                                             : std::string{"no such task"}));
    ++c.claims;
  }
  for (auto it = l.completions.lower_bound(root);
       it != l.completions.end() && orchestration_of(it->first) == root;
       ++it) {
    auto found = tasks.find(it->first);
    bool kept = found != tasks.end() && found->second["state"] == "completed"
                && found->second["result"] == it->second;
    t.expect(kept, root + ": acknowledged completion of " + it->first
                     + " lost: "
                     + (found != tasks.end() ? found->second.dump()
                                             : std::string{"no such task"}));
    ++c.completions;
  }
}

// Every orchestration is listed once, every acknowledged one among them,
// and each one's tree holds together, acknowledged or not.
void check_orchestrations(httplib::Client& cli, ledger& l, tally& t,
                          coverage& c) {
  auto [status, list] = get(cli, "/v1/orchestrations");
  t.expect(status == 200, "orchestrations: status " + std::to_string(status));
  if (status != 200)
    return;
  std::set<std::string> listed;
  for (auto& id : list["data"]) {
    t.expect(listed.insert(id.get<std::string>()).second,
             "orchestration " + id.dump() + " listed twice");
    l.seen["orchestration"].insert(id.get<std::string>());
  }
  for (auto& root : l.orchestrations)
    t.expect(listed.count(root), "orchestration " + root + " not listed");
  for (auto& root : listed)
    check_tree(cli, l, root, t, c);
}

// Everything acknowledged so far is on the restarted server.
void verify(int port, ledger& l, tally& t, coverage& c) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(std::chrono::seconds(60));
  check_messages(cli, l, t, c);
  check_items(cli, l, t, c);
  check_memories(cli, l, t, c);
  check_orchestrations(cli, l, t, c);
}

// Every SQLite file of the data directory passes `PRAGMA integrity_check`:
// at least spindle.db and memory.db on SQLite; on PostgreSQL, whatever the
// data directory still holds.
void check_files(const test_store& dir, tally& t, coverage& c) {
  size_t files = 0;
  for (auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() != ".db")
      continue;
    ++files;
    auto found = spindle::test::integrity_check(entry.path());
    t.expect(found == "ok", entry.path().filename().string()
                              + ": integrity_check: " + found);
  }
  t.expect(dir.on_postgres() || files >= 2,
           "the data directory holds " + std::to_string(files)
             + " databases");
  c.integrity += files;
}

// The journal's folds so far (`spindle_storage_folds` on /metrics), or -1.
long folds(int port) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(std::chrono::seconds(2));
  auto r = cli.Get("/metrics");
  if (!r || r->status != 200)
    return -1;
  std::istringstream in{r->body};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("spindle_storage_folds ", 0) == 0)
      return std::stol(line.substr(line.find(' ') + 1));
  return -1;
}

std::string first_violations(const tally& t, size_t n) {
  std::string out;
  for (size_t i = 0; i < t.violations.size() && i < n; ++i)
    out += "\n  " + t.violations[i];
  if (t.violations.size() > n)
    out += "\n  ... " + std::to_string(t.violations.size() - n) + " more";
  return out;
}

} // namespace

TEST_CASE("crash: kill -9 at random points under mixed load loses no "
          "acknowledged write and reissues no ID and leaves intact "
          "databases and orchestration trees") {
  auto kills = spindle::test::env_number("SPINDLE_CRASH_KILLS", 30);
  auto seed = spindle::test::env_number("SPINDLE_CRASH_SEED",
                                        std::random_device{}());
  INFO("SPINDLE_CRASH_SEED=" << seed << " SPINDLE_CRASH_KILLS=" << kills);
  std::cout << "crash matrix: seed " << seed << ", " << kills << " kills"
            << std::endl;
  std::mt19937_64 rng{seed};
  test_store dir;
  ledger l;
  tally t;
  coverage c;
  long total_folds = 0;
  size_t done = 0;
  auto started = std::chrono::steady_clock::now();
  for (size_t kill = 1; kill <= kills && t.violations.empty(); ++kill) {
    auto flags = dir.serve_flags();
    flags.insert(flags.end(),
                 {"--sync", "normal", "--max-resident", max_resident});
    server_process srv{flags};
    if (kill > 1)
      verify(srv.port(), l, t, c);
    if (!t.violations.empty())
      break;
    std::vector<run_log> logs(writers);
    std::vector<std::thread> pool;
    for (size_t w = 0; w < writers; ++w)
      pool.emplace_back([&, w, s = rng()] {
        write_until_killed(srv.port(), w, kill, s, logs[w]);
      });
    // Most kills land in full flow; one in eight right after the start,
    // while the first threads activate.
    auto delay = rng() % 8 == 0 ? rng() % 50 : 200 + rng() % 1300;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    auto run_folds = folds(srv.port());
    CHECK(srv.stop(SIGKILL) == -1);
    for (auto& th : pool)
      th.join();
    total_folds += std::max(0L, run_folds);
    done = kill;
    check_files(dir, t, c);
    for (size_t w = 0; w < writers; ++w)
      l.add(t, w, logs[w]);
  }
  if (t.violations.empty()) {
    // After the last kill.
    auto flags = dir.serve_flags();
    flags.insert(flags.end(), {"--max-resident", max_resident});
    server_process srv{flags};
    verify(srv.port(), l, t, c);
  }
  auto seconds = std::chrono::duration<double>(
                   std::chrono::steady_clock::now() - started)
                   .count();
  size_t messages = 0, items = 0, memories = 0, ids = 0;
  for (auto& [thread, acked] : l.messages)
    messages += acked.size();
  for (auto& [thread, acked] : l.items)
    items += acked.size();
  for (auto& [user, acked] : l.memories)
    memories += acked.size();
  for (auto& [kind, issued] : l.issued)
    ids += issued.size();
  std::ostringstream summary;
  summary << "crash matrix: seed " << seed << ", " << done << " kills, "
          << static_cast<long>(seconds) << " s, " << total_folds
          << " journal folds before the kills; acknowledged: " << messages
          << " messages, " << items << " items, " << memories
          << " memories, " << l.tasks.size() << " tasks created, "
          << l.claims.size() << " claims, " << l.completions.size()
          << " completions, " << ids << " IDs; checked after restarts: "
          << c.messages << " messages, " << c.items << " items, "
          << c.memories << " memories, " << c.trees << " trees ("
          << c.tasks << " tasks, " << c.claims << " claims, "
          << c.completions << " completions), " << c.integrity
          << " integrity checks; " << t.checked << " invariants, "
          << t.violations.size() << " violations";
  std::cout << summary.str() << first_violations(t, 20) << std::endl;
  INFO(summary.str() << first_violations(t, 20));
  CHECK(t.violations.empty());
  CHECK(done == kills);
  CHECK(messages > 0);
  CHECK(l.completions.size() > 0);
  CHECK(total_folds > 0);
}
