// Orchestration in a cluster (docs/cluster.md, "One scheduler"): one node
// at a time holds the scheduler seat and every orchestration, task and
// claim request that reaches another node is forwarded to it, so workers
// on any node claim from one queue: each task once, in D1 order; leases
// expire and heartbeats hold whichever node they pass through; a claim
// waiting on one node is woken by a task made executable through another;
// and when the holder is killed outright another node takes the seat,
// loads every stored orchestration (what was running is stale) and claims
// go on without a task handed out twice. Runs only on the PostgreSQL run
// (tests/CMakeLists.txt).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/messages/orchestration.hpp"
#include "support.hpp"

using namespace spindle;
using namespace spindle::test;
using namespace std::chrono_literals;
using json = nlohmann::json;
using steady = std::chrono::steady_clock;

namespace {

std::unique_ptr<httplib::Client> client_of(int port) {
  auto cli = std::make_unique<httplib::Client>("127.0.0.1", port);
  cli->set_connection_timeout(2s);
  cli->set_read_timeout(30s);
  return cli;
}

/// One exchange: its status (0: no answer), its body, the error code of an
/// error reply, and when it was sent and answered (this process's clock).
struct reply {
  int status = 0;
  /// Why no answer came: the connection was refused (nothing was sent),
  /// or it broke after the request was sent (the outcome is unknown).
  bool refused = false;
  json body;
  std::string code;
  std::string text;
  steady::time_point sent, received;

  /// `503 not_owner` or a refused connection: nothing happened, the same
  /// request may be sent again (docs/cluster.md, "Forwarding").
  bool nothing_happened() const {
    return (status == 503 && code == "not_owner") || (status == 0 && refused);
  }
  std::string describe() const {
    return status == 0 ? std::string{refused ? "connection refused"
                                             : "no answer (broken)"}
                       : std::to_string(status) + " " + text;
  }
};

reply exchange(httplib::Client& cli, const std::string& path,
               const json& body = nullptr, bool get = false) {
  reply out;
  out.sent = steady::now();
  auto r = get ? cli.Get(path.c_str())
               : cli.Post(path.c_str(), body.is_null() ? "" : body.dump(),
                          "application/json");
  out.received = steady::now();
  if (!r) {
    out.refused = r.error() == httplib::Error::Connection;
    return out;
  }
  out.status = r->status;
  out.text = r->body;
  out.body = json::parse(r->body, nullptr, false);
  if (out.body.is_discarded())
    out.body = nullptr;
  if (out.body.is_object() && out.body.contains("error")
      && out.body["error"].is_object())
    out.code = out.body["error"].value("code", "");
  return out;
}

/// `exchange`, sent again 50 ms after each answer saying nothing happened
/// (503 not_owner), for at most `patience`: the clients' retry idiom around
/// a seat that changes hands. Each retry is counted in `retried`.
reply served(httplib::Client& cli, const std::string& path,
             const json& body, std::atomic<size_t>& retried,
             bool get = false, std::chrono::milliseconds patience = 15s) {
  auto until = steady::now() + patience;
  for (;;) {
    auto r = exchange(cli, path, body, get);
    if (!(r.status == 503 && r.code == "not_owner")
        || steady::now() >= until)
      return r;
    ++retried;
    std::this_thread::sleep_for(50ms);
  }
}

/// The node GET /v1/cluster through node `via` names as the scheduler
/// seat's holder ("" when none, or no answer).
std::string seat_named_by(cluster& c, size_t via) {
  auto cli = client_of(c.node(via).port());
  cli->set_read_timeout(5s);
  auto r = cli->Get("/v1/cluster");
  if (!r || r->status != 200)
    return "";
  auto body = json::parse(r->body, nullptr, false);
  if (body.is_discarded() || !body.contains("scheduler")
      || !body["scheduler"].is_string())
    return "";
  return body["scheduler"].get<std::string>();
}

/// The node the seat's lease row names ("" for none).
std::string seat_row(cluster& c) {
  return c.store().query("SELECT coalesce(node, '') FROM thread_leases "
                         "WHERE thread_id = '#scheduler';");
}

/// Waits up to `limit` until the seat's row and GET /v1/cluster through
/// every node of `live` name one node of `live` as the holder: its index.
size_t await_seat(cluster& c, const std::vector<size_t>& live,
                  std::chrono::milliseconds limit) {
  auto until = steady::now() + limit;
  std::string seen;
  for (;;) {
    auto row = seat_row(c);
    bool agreed = !row.empty();
    seen = "row: '" + row + "'";
    for (auto i : live) {
      auto named = seat_named_by(c, i);
      seen += ", " + c.name(i) + " says '" + named + "'";
      agreed = agreed && named == row;
    }
    if (agreed)
      for (auto i : live)
        if (c.name(i) == row)
          return i;
    if (steady::now() >= until)
      break;
    std::this_thread::sleep_for(50ms);
  }
  FAIL("no node of the cluster holds the scheduler seat after "
       << limit.count() << " ms (" << seen << ")");
  return 0;
}

/// Every node of `c` but `i`.
std::vector<size_t> others(const cluster& c, size_t i) {
  std::vector<size_t> out;
  for (size_t k = 0; k < c.size(); ++k)
    if (k != i)
      out.push_back(k);
  return out;
}

/// A task's ID from a 201 reply creating it; fails the test otherwise.
std::string created(const reply& r) {
  INFO(r.describe());
  REQUIRE(r.status == 201);
  return r.body["id"].get<std::string>();
}

/// Creates an orchestration, and below it `children` children of which
/// those whose number (1, 2, ...) `has_children` accepts get `grandchildren`
/// each; every request through the nodes in turn (`ports`), the
/// grandchildren from four threads at once. The orchestration's ID.
template <class HasChildren>
std::string build_tree(const std::vector<int>& ports, size_t children,
                       HasChildren has_children, size_t grandchildren,
                       std::atomic<size_t>& retried) {
  auto via = [&](size_t k) { return client_of(ports[k % ports.size()]); };
  auto root = created(served(*via(0), "/v1/orchestrations",
                             {{"payload", "root"}}, retried));
  std::vector<std::string> parents;
  for (size_t i = 1; i <= children; ++i) {
    // One after another, so that child i is _t{i}.
    auto id = created(served(*via(i), "/v1/tasks/" + root + "/subtasks",
                             {{"payload", "child " + std::to_string(i)}},
                             retried));
    if (has_children(i))
      parents.push_back(id);
  }
  std::mutex mx;
  std::vector<std::string> failures;
  std::vector<std::thread> builders;
  for (size_t b = 0; b < 4; ++b)
    builders.emplace_back([&, b] {
      auto cli = via(b);
      for (size_t p = b; p < parents.size(); p += 4)
        for (size_t g = 1; g <= grandchildren; ++g) {
          auto r = served(*cli, "/v1/tasks/" + parents[p] + "/subtasks",
                          {{"payload", "grandchild " + std::to_string(g)}},
                          retried);
          if (r.status != 201) {
            std::lock_guard<std::mutex> guard{mx};
            failures.push_back(parents[p] + ": " + r.describe());
            return;
          }
        }
    });
  for (auto& b : builders)
    b.join();
  INFO((failures.empty() ? "" : failures.front()));
  REQUIRE(failures.empty());
  return root;
}

/// Every task of orchestration `id`, by ID, read through `cli`.
std::map<std::string, json> tree_of(httplib::Client& cli,
                                    const std::string& id,
                                    std::atomic<size_t>& retried) {
  auto r = served(cli, "/v1/orchestrations/" + id, nullptr, retried, true);
  INFO(r.describe());
  REQUIRE(r.status == 200);
  std::map<std::string, json> out;
  for (auto& t : r.body["tasks"])
    out[t["id"].get<std::string>()] = t;
  return out;
}

/// The children of each task of `tree` that has any.
std::map<std::string, std::vector<std::string>>
children_of(const std::map<std::string, json>& tree) {
  std::map<std::string, std::vector<std::string>> out;
  for (auto& [id, t] : tree)
    if (t["parent"].is_string())
      out[t["parent"].get<std::string>()].push_back(id);
  return out;
}

/// Milliseconds, as a number Catch can print.
int64_t ms(steady::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

bool d1_before(const std::string& x, const std::string& y) {
  return claimed_before(*task_id::parse(x), *task_id::parse(y));
}

/// What `check_d1` found.
struct d1_findings {
  std::vector<std::string> order; // the tasks claimed, in commit order
  size_t out_of_order = 0, parent_too_early = 0, unknown = 0;
  std::string first_out_of_order, first_too_early;
};

/// Checks the claims among `changes` (task.claimed and task.completed
/// events, in commit order) against D1: the claimed task must come first
/// in D1 among the tasks known to be executable when its claim was sent
/// (`sent`): the leaves (`leaves`, executable from the start) not claimed
/// yet, and the parents not claimed yet whose last child's completion was
/// answered (`ready_at`) before that. A parent must not be claimed before
/// the completions of all its `children`. A claim no worker got is
/// `unknown`.
d1_findings
check_d1(const std::vector<std::pair<std::string, std::string>>& changes,
         const std::map<std::string, steady::time_point>& sent,
         const std::map<std::string, steady::time_point>& ready_at,
         const std::set<std::string>& leaves,
         const std::map<std::string, std::vector<std::string>>& children) {
  d1_findings out;
  std::set<d1_key> unclaimed_leaves;
  for (auto& id : leaves)
    unclaimed_leaves.insert(d1_key{*task_id::parse(id)});
  std::set<std::string> claimed, done;
  for (auto& [type, task] : changes) {
    if (type == "task.completed") {
      done.insert(task);
      continue;
    }
    out.order.push_back(task);
    auto when = sent.find(task);
    if (when == sent.end()) {
      ++out.unknown;
      continue;
    }
    if (auto kids = children.find(task); kids != children.end())
      for (auto& kid : kids->second)
        if (done.count(kid) == 0 && out.parent_too_early++ == 0)
          out.first_too_early = task + " before " + kid + " completed";
    std::vector<std::string> known;
    if (!unclaimed_leaves.empty())
      known.push_back(unclaimed_leaves.begin()->id.to_string());
    for (auto& [parent, at] : ready_at)
      if (claimed.count(parent) == 0 && at < when->second)
        known.push_back(parent);
    for (auto& k : known)
      if (k != task && d1_before(k, task) && out.out_of_order++ == 0)
        out.first_out_of_order = "claim " + std::to_string(out.order.size())
                                 + " took " + task + " while " + k
                                 + " was executable";
    claimed.insert(task);
    unclaimed_leaves.erase(d1_key{*task_id::parse(task)});
  }
  return out;
}

/// A claim a worker got: the task, its lease, and when the request that
/// got it was sent and answered.
struct claim_record {
  std::string task;
  std::string worker;
  std::string lease;
  size_t node = 0;
  steady::time_point sent, received;
};

/// Three nodes, the seat's holder found, and clients of the two nodes
/// without it (A and B).
struct seated_cluster {
  cluster c{3};
  size_t holder = await_seat(c, {0, 1, 2}, 10s);
  std::vector<size_t> rest = others(c, holder);
  std::unique_ptr<httplib::Client> a = client_of(c.node(rest[0]).port());
  std::unique_ptr<httplib::Client> b = client_of(c.node(rest[1]).port());
  std::atomic<size_t> retried{0};

  /// Creates an orchestration through A and `children` children below it
  /// through B: the IDs, the orchestration's first.
  std::vector<std::string> tree(size_t children) {
    std::vector<std::string> ids{created(served(
      *a, "/v1/orchestrations", {{"payload", "root"}}, retried))};
    for (size_t i = 1; i <= children; ++i)
      ids.push_back(created(served(*b, "/v1/tasks/" + ids[0] + "/subtasks",
                                   {{"payload", std::to_string(i)}},
                                   retried)));
    return ids;
  }

  /// Whether both A and B forwarded requests to the holder.
  bool both_forwarded() const {
    auto seat = c.name(holder);
    return c.forwarded(rest[0], seat) > 0 && c.forwarded(rest[1], seat) > 0;
  }
};

} // namespace

TEST_CASE("workers on three nodes claim a tree of 2000 tasks from one "
          "queue: each task once, in D1 order, requests to the other nodes "
          "forwarded to the seat",
          "[postgres]") {
  raise_fd_limit();
  cluster c{3};
  std::vector<size_t> all{0, 1, 2};
  auto holder = await_seat(c, all, 10s);
  auto seat = c.name(holder);
  std::vector<int> ports;
  for (size_t i = 0; i < c.size(); ++i)
    ports.push_back(c.node(i).port());
  std::atomic<size_t> retried{0};
  // The tree, 2,000 tasks: the root, 49 children, and 50 grandchildren
  // below each child but every fifth and the last (those ten children are
  // leaves). Executable from the start: the 1,950 grandchildren (depth 2)
  // and the ten leaf children (depth 1), which D1 puts after every
  // grandchild.
  auto leaf_child = [](size_t i) { return i % 5 == 0 || i == 49; };
  auto root = build_tree(
    ports, 49, [&](size_t i) { return !leaf_child(i); }, 50, retried);
  auto tree = tree_of(*client_of(ports[0]), root, retried);
  REQUIRE(tree.size() == 2000);
  auto children = children_of(tree);
  REQUIRE(children.size() == 40); // the root and 39 children
  std::set<std::string> leaves;
  for (auto& [id, t] : tree)
    if (children.count(id) == 0)
      leaves.insert(id);
  REQUIRE(leaves.size() == 1960);

  // The holder publishes every task change in commit order (docs/api.md,
  // "Events"): the order in which the one scheduler's claims took effect.
  sse_client events{c.node(holder).port(),
                    "/v1/events?types=task.claimed,task.completed"
                    "&orchestration="
                      + root};
  REQUIRE(events.wait_status(5s) == 200);

  constexpr size_t per_node = 4;
  std::mutex mx;
  std::map<std::string, std::vector<claim_record>> claims;
  std::map<std::string, steady::time_point> completed_at; // answer received
  std::vector<std::string> failures;
  std::map<size_t, size_t> answered_by; // node: requests it answered
  std::atomic<bool> finished{false}, abort{false};
  auto deadline = steady::now() + 200s;
  std::vector<std::thread> workers;
  for (size_t n = 0; n < c.size(); ++n)
    for (size_t k = 0; k < per_node; ++k)
      workers.emplace_back([&, n, k] {
        auto cli = client_of(ports[n]);
        auto name = "n" + std::to_string(n) + "-w" + std::to_string(k);
        size_t answered = 0;
        auto failed = [&](const std::string& what, const reply& r) {
          std::lock_guard<std::mutex> guard{mx};
          failures.push_back(name + ": " + what + ": " + r.describe());
          abort = true;
        };
        while (!finished && !abort) {
          if (steady::now() > deadline) {
            failed("still claiming at the deadline", reply{});
            break;
          }
          auto r = served(*cli, "/v1/tasks/claim",
                          {{"worker", name}, {"lease_s", 60}, {"wait_s", 1}},
                          retried);
          if (r.status == 204) {
            ++answered;
            continue;
          }
          if (r.status != 200) {
            failed("claim", r);
            break;
          }
          ++answered;
          claim_record rec{r.body["id"].get<std::string>(), name,
                           r.body["lease"]["token"].get<std::string>(), n,
                           r.sent, r.received};
          {
            std::lock_guard<std::mutex> guard{mx};
            claims[rec.task].push_back(rec);
          }
          auto d = served(*cli, "/v1/tasks/" + rec.task + "/complete",
                          {{"lease", rec.lease}, {"result", name}}, retried);
          if (d.status != 200) {
            failed("complete " + rec.task, d);
            break;
          }
          ++answered;
          std::lock_guard<std::mutex> guard{mx};
          completed_at[rec.task] = d.received;
          if (rec.task == root)
            finished = true;
        }
        std::lock_guard<std::mutex> guard{mx};
        answered_by[n] += answered;
      });
  for (auto& w : workers)
    w.join();
  INFO("first failure: " << (failures.empty() ? "" : failures.front()));
  REQUIRE(failures.empty());
  REQUIRE(finished);

  // Every task claimed exactly once cluster-wide, none missing, and each
  // completed: the workers' view...
  CHECK(claims.size() == tree.size());
  size_t twice = 0;
  for (auto& [task, rs] : claims)
    if (rs.size() != 1)
      ++twice;
  CHECK(twice == 0);
  // ...and the store's: one attempt each.
  auto after = tree_of(*client_of(ports[(holder + 1) % 3]), root, retried);
  size_t not_done = 0, attempts_off = 0;
  for (auto& [id, t] : after) {
    if (t["state"] != "completed")
      ++not_done;
    if (t["attempts"] != 1)
      ++attempts_off;
  }
  CHECK(after.size() == 2000);
  CHECK(not_done == 0);
  CHECK(attempts_off == 0);

  // D1, claim by claim, in the order the scheduler took them (the
  // holder's events, in commit order). With one orchestration the
  // scheduler picks the first entry of its index for each claim and asks
  // the one orchestrator to confirm, in order, so the order of the
  // task.claimed events is the order of the picks. What the index held
  // at a pick is not known exactly: a task made executable by a completion
  // reaches the index a moment later. What is known for certain:
  //  - every task executable from the start (the 1,960 leaves) is in the
  //    index until it is picked;
  //  - a parent is in it once the answer to its last child's completion
  //    came back (the orchestrator announces the parent before it
  //    replies), so for a claim *sent* after that answer arrived.
  // So at each claim the known-executable set is: the leaves not claimed
  // yet, and the parents not claimed yet whose last child's completion was
  // answered before the claim was sent. The claimed task must come first
  // in D1 among them. This pins the exact D1 order of the leaves' claims
  // (each took the first leaf left, across all 12 workers and 3 nodes) and
  // that no task, leaf or parent, was taken while a task D1 puts before
  // it was certainly waiting. Besides: no parent is claimed before all its
  // children's completions (in commit order).
  REQUIRE(events.wait_for(2 * tree.size(), 30s));
  std::vector<std::pair<std::string, std::string>> changes; // type, task
  for (auto& e : events.events())
    changes.emplace_back(e.type, e.data["task"].get<std::string>());
  std::map<std::string, steady::time_point> sent, ready_at;
  for (auto& [task, rs] : claims)
    sent[task] = rs.front().sent;
  for (auto& [parent, kids] : children) {
    steady::time_point last{};
    for (auto& kid : kids)
      last = std::max(last, completed_at.at(kid));
    ready_at[parent] = last;
  }
  auto d1 = check_d1(changes, sent, ready_at, leaves, children);
  INFO("first out of order: " << d1.first_out_of_order);
  INFO("first parent too early: " << d1.first_too_early);
  CHECK(d1.order.size() == tree.size());
  CHECK(std::set<std::string>(d1.order.begin(), d1.order.end()).size()
        == tree.size());
  CHECK(d1.unknown == 0);
  CHECK(d1.out_of_order == 0);
  CHECK(d1.parent_too_early == 0);
  // The check has teeth: the same changes with the first two claims
  // swapped, or with the root's claim moved before the completion of its
  // last child, fail it.
  auto swapped = changes;
  auto first_claim = [&](auto from) {
    return std::find_if(from, swapped.end(), [](auto& change) {
      return change.first == "task.claimed";
    });
  };
  auto one = first_claim(swapped.begin());
  std::iter_swap(one, first_claim(std::next(one)));
  CHECK(check_d1(swapped, sent, ready_at, leaves, children).out_of_order
        > 0);
  auto early = changes;
  auto root_claim = std::find(early.begin(), early.end(),
                              std::make_pair(std::string{"task.claimed"},
                                             root));
  REQUIRE(root_claim != early.end());
  std::iter_swap(root_claim, std::prev(root_claim));
  CHECK(check_d1(early, sent, ready_at, leaves, children).parent_too_early
        > 0);
  auto& order = d1.order;
  // The claims of the leaves, in the scheduler's order, are exactly D1.
  std::vector<std::string> leaf_claims;
  for (auto& t : order)
    if (leaves.count(t))
      leaf_claims.push_back(t);
  auto sorted = leaf_claims;
  std::sort(sorted.begin(), sorted.end(), d1_before);
  CHECK(leaf_claims == sorted);

  // Workers on every node were served, the seat stayed where it was, and
  // every request that reached another node was forwarded to the seat:
  // each of those nodes logged at least one forwarded line per request it
  // answered, and the holder forwarded none.
  CHECK(await_seat(c, all, 5s) == holder);
  for (size_t n = 0; n < c.size(); ++n) {
    INFO("node " << c.name(n) << (n == holder ? " (the seat)" : ""));
    CHECK(answered_by[n] > 0);
    if (n == holder)
      CHECK(c.forwarded(n) == 0);
    else
      CHECK(c.forwarded(n, seat) >= answered_by[n]);
  }
  // Nothing answered 5xx but a 503 saying nothing happened, sent again: a
  // seat that stays put should need next to none.
  INFO("503 not_owner answers sent again: " << retried.load());
  CHECK(retried <= 20);
}

TEST_CASE("a silent worker on a node without the seat loses its task "
          "within its lease and a second, and heartbeats through another "
          "node keep a task running past several leases",
          "[postgres]") {
  seated_cluster s;
  auto ids = s.tree(2);
  auto t1 = ids[1], t2 = ids[2];
  // The silent worker claims through A with a one-second lease (D1: t2).
  auto silent = served(*s.a, "/v1/tasks/claim",
                       {{"worker", "silent"}, {"lease_s", 1}}, s.retried);
  INFO(silent.describe());
  REQUIRE(silent.status == 200);
  REQUIRE(silent.body["id"] == t2);
  auto expires = silent.body["lease"]["expires_at"].get<int64_t>();
  // The beating worker claims through B (t1) and heartbeats through A
  // 200 ms after each answer (its lease is one second), for three and a
  // half leases.
  auto beating = served(*s.b, "/v1/tasks/claim",
                        {{"worker", "beating"}, {"lease_s", 1}}, s.retried);
  INFO(beating.describe());
  REQUIRE(beating.status == 200);
  REQUIRE(beating.body["id"] == t1);
  auto token = beating.body["lease"]["token"].get<std::string>();
  std::vector<std::string> beat_failures;
  std::thread heart{[&] {
    auto via = client_of(s.c.node(s.rest[0]).port());
    auto until = beating.received + 3500ms;
    while (steady::now() < until) {
      std::this_thread::sleep_for(200ms);
      auto r = served(*via, "/v1/tasks/" + t1 + "/heartbeat",
                      {{"lease", token}, {"lease_s", 1}}, s.retried);
      if (r.status != 200)
        beat_failures.push_back(r.describe());
    }
  }};
  // Half-way through its lease the silent worker's task still runs (when
  // the answer came before the lease could have run out)...
  std::this_thread::sleep_until(silent.received + 400ms);
  auto mid = served(*s.b, "/v1/tasks/" + t2, nullptr, s.retried, true);
  REQUIRE(mid.status == 200);
  if (mid.received < silent.sent + 1s)
    CHECK(mid.body["state"] == "running");
  // ...and within its lease and a second (plus half a second for a loaded
  // machine) it is stale, read through B, with the worker and the time.
  reply seen;
  while (steady::now() < silent.received + 2500ms) {
    seen = served(*s.b, "/v1/tasks/" + t2, nullptr, s.retried, true);
    if (seen.status == 200 && seen.body["state"] != "running")
      break;
    std::this_thread::sleep_for(20ms);
  }
  auto stale_after = seen.received - silent.received;
  INFO(seen.describe());
  REQUIRE(seen.status == 200);
  CHECK(seen.body["state"] == "stale");
  CHECK(ms(stale_after) < 2500);
  CHECK(seen.body["stale"]["worker"] == "silent");
  CHECK(seen.body["stale"]["lease_expired_at"].get<int64_t>()
        >= expires - 50);
  // Its late completion through A is refused and changes nothing.
  auto late = served(*s.a, "/v1/tasks/" + t2 + "/complete",
                     {{"lease", silent.body["lease"]["token"]},
                      {"result", "late"}},
                     s.retried);
  CHECK(late.status == 409);
  CHECK(late.code == "lease_lost");
  heart.join();
  INFO("first failed heartbeat: "
       << (beat_failures.empty() ? "" : beat_failures.front()));
  CHECK(beat_failures.empty());
  // Past three leases the beating worker's task still runs, under its
  // worker, read through the seat itself; it completes through B.
  auto held = served(*client_of(s.c.node(s.holder).port()),
                     "/v1/tasks/" + t1, nullptr, s.retried, true);
  REQUIRE(held.status == 200);
  CHECK(held.body["state"] == "running");
  CHECK(held.body["worker"] == "beating");
  CHECK(steady::now() - beating.received > 3s);
  auto done = served(*s.b, "/v1/tasks/" + t1 + "/complete",
                     {{"lease", token}, {"result", "kept"}}, s.retried);
  INFO(done.describe());
  CHECK(done.status == 200);
  auto after = served(*s.a, "/v1/tasks/" + t2, nullptr, s.retried, true);
  CHECK(after.body["state"] == "stale");
  CHECK(s.both_forwarded());
  CHECK(s.retried <= 5);
}

TEST_CASE("a claim waiting through one node is woken by a task made "
          "executable through another",
          "[postgres]") {
  seated_cluster s;
  auto ids = s.tree(1);
  auto root = ids[0], child = ids[1];
  auto first = served(*s.b, "/v1/tasks/claim", {{"worker", "first"}},
                      s.retried);
  REQUIRE(first.status == 200);
  REQUIRE(first.body["id"] == child);
  // Nothing is executable now (the root waits for its child): a claim
  // through A waits...
  auto wait_through = [&](size_t node, const std::string& worker) {
    return std::async(std::launch::async, [&s, node, worker] {
      auto cli = client_of(s.c.node(node).port());
      return served(*cli, "/v1/tasks/claim",
                    {{"worker", worker}, {"wait_s", 10}}, s.retried);
    });
  };
  auto waiting = wait_through(s.rest[0], "waiter-a");
  CHECK(waiting.wait_for(500ms) == std::future_status::timeout);
  // ...until the child's completion through B makes the root executable.
  auto done = served(*s.b, "/v1/tasks/" + child + "/complete",
                     {{"lease", first.body["lease"]["token"]}}, s.retried);
  REQUIRE(done.status == 200);
  REQUIRE(waiting.wait_for(5s) == std::future_status::ready);
  auto woken = waiting.get();
  INFO(woken.describe());
  REQUIRE(woken.status == 200);
  CHECK(woken.body["id"] == root);
  CHECK(woken.body["worker"] == "waiter-a");
  CHECK(ms(woken.received - done.received) < 1000);
  // A claim waiting through B, and one through the seat itself, are woken
  // by orchestrations created through A, each taking one.
  auto via_b = wait_through(s.rest[1], "waiter-b");
  auto via_seat = wait_through(s.holder, "waiter-seat");
  CHECK(via_b.wait_for(300ms) == std::future_status::timeout);
  CHECK(via_seat.wait_for(0ms) == std::future_status::timeout);
  auto one = served(*s.a, "/v1/orchestrations", {{"payload", "one"}},
                    s.retried);
  auto two = served(*s.a, "/v1/orchestrations", {{"payload", "two"}},
                    s.retried);
  REQUIRE(created(one) != created(two));
  REQUIRE(via_b.wait_for(5s) == std::future_status::ready);
  REQUIRE(via_seat.wait_for(5s) == std::future_status::ready);
  auto got_b = via_b.get(), got_seat = via_seat.get();
  INFO(got_b.describe() << " / " << got_seat.describe());
  REQUIRE(got_b.status == 200);
  REQUIRE(got_seat.status == 200);
  std::set<std::string> taken{got_b.body["id"].get<std::string>(),
                              got_seat.body["id"].get<std::string>()};
  CHECK(taken == std::set<std::string>{created(one), created(two)});
  CHECK(ms(got_b.received - two.received) < 1000);
  CHECK(ms(got_seat.received - two.received) < 1000);
  CHECK(s.both_forwarded());
  CHECK(s.retried == 0);
}

TEST_CASE("kill -9 of the scheduler seat's holder while workers claim: "
          "another node holds the seat and serves claims within 10 s, no "
          "task is handed out twice, and every completion stays",
          "[postgres]") {
  raise_fd_limit();
  cluster c{3};
  auto victim = await_seat(c, {0, 1, 2}, 10s);
  auto survivors = others(c, victim);
  std::vector<int> ports;
  for (size_t i = 0; i < c.size(); ++i)
    ports.push_back(c.node(i).port());
  std::atomic<size_t> retried{0};
  // 613 tasks: the root, 12 children, 50 grandchildren below each.
  auto root = build_tree({ports[survivors[0]], ports[survivors[1]]}, 12,
                         [](size_t) { return true; }, 50, retried);

  // Twelve workers, four per node; the victim's workers move to the
  // survivors once it is gone, as behind a load balancer. Each claim takes
  // a one-minute lease (no lease expires during the test) and its task is
  // completed about 5 ms later.
  std::mutex mx;
  std::map<std::string, std::vector<claim_record>> claims;
  std::set<std::string> completed;       // answered 200
  std::set<std::string> unsure;          // completion's outcome unknown
  std::map<std::string, std::string> lost; // task: the 409's code
  std::vector<std::string> failures;
  size_t unknown_claims = 0;
  std::atomic<bool> stop{false}, killed{false};
  steady::time_point kill_sent{}, kill_done{};
  std::optional<steady::time_point> first_claim_after;
  auto deadline = steady::now() + 150s;
  std::vector<std::thread> workers;
  for (size_t n = 0; n < c.size(); ++n)
    for (size_t k = 0; k < 4; ++k)
      workers.emplace_back([&, n, k] {
        auto name = "n" + std::to_string(n) + "-w" + std::to_string(k);
        size_t at = n, turn = k;
        // The node to send the next request through: its own, or a
        // survivor once its own is dead.
        auto next_node = [&] {
          if (at == victim && killed)
            at = survivors[turn++ % survivors.size()];
          return at;
        };
        auto failed = [&](const std::string& what) {
          std::lock_guard<std::mutex> guard{mx};
          failures.push_back(name + ": " + what);
        };
        while (!stop && steady::now() < deadline) {
          auto node = next_node();
          auto cli = client_of(ports[node]);
          auto r = exchange(*cli, "/v1/tasks/claim",
                            {{"worker", name}, {"lease_s", 60}, {"wait_s", 1}});
          if (r.status == 204)
            continue;
          if (r.status != 200) {
            // Around the kill: nothing happened (503 not_owner, refused),
            // or the outcome is unknown (the seat died with the claim):
            // its task, if it was claimed, is stale after the failover.
            if (r.nothing_happened()) {
              ++retried;
            } else if (r.status == 0
                       || (r.status == 503 && r.code == "unavailable")) {
              std::lock_guard<std::mutex> guard{mx};
              ++unknown_claims;
            } else {
              failed("claim: " + r.describe());
              return;
            }
            if (r.status == 0 && n == victim)
              at = survivors[turn++ % survivors.size()];
            std::this_thread::sleep_for(50ms);
            continue;
          }
          claim_record rec{r.body["id"].get<std::string>(), name,
                           r.body["lease"]["token"].get<std::string>(), node,
                           r.sent, r.received};
          {
            std::lock_guard<std::mutex> guard{mx};
            claims[rec.task].push_back(rec);
            if (r.sent > kill_done && kill_done != steady::time_point{}
                && !first_claim_after)
              first_claim_after = r.received;
          }
          std::this_thread::sleep_for(5ms);
          // Completed until an answer says what happened: sent again
          // (through a live node) while nothing happened or the outcome
          // was unknown; a 409 after an unknown outcome may mean that
          // the first one went through.
          bool was_unsure = false;
          for (;;) {
            auto d = exchange(*client_of(ports[next_node()]),
                              "/v1/tasks/" + rec.task + "/complete",
                              {{"lease", rec.lease}, {"result", name}});
            bool unknown = d.status == 0 && !d.refused;
            unknown = unknown || (d.status == 503 && d.code == "unavailable");
            {
              std::lock_guard<std::mutex> guard{mx};
              if (d.status == 200) {
                completed.insert(rec.task);
                break;
              }
              if (d.status == 409) {
                if (was_unsure)
                  unsure.insert(rec.task);
                else
                  lost[rec.task] = d.code;
                break;
              }
              if (!d.nothing_happened() && !unknown) {
                failures.push_back(name + ": complete " + rec.task + ": "
                                   + d.describe());
                return;
              }
              if (steady::now() > deadline) {
                failures.push_back(name + ": complete " + rec.task
                                   + ": no answer by the deadline");
                return;
              }
            }
            was_unsure = was_unsure || unknown;
            if (d.status == 0 && at == victim)
              at = survivors[turn++ % survivors.size()];
            std::this_thread::sleep_for(50ms);
          }
        }
      });
  // The kill, once a quarter of the tree is done.
  auto count_completed = [&] {
    std::lock_guard<std::mutex> guard{mx};
    return completed.size();
  };
  while (count_completed() < 150 && steady::now() < deadline)
    std::this_thread::sleep_for(10ms);
  REQUIRE(count_completed() >= 150);
  REQUIRE(seat_row(c) == c.name(victim));
  {
    std::lock_guard<std::mutex> guard{mx};
    kill_sent = steady::now();
  }
  c.node(victim).stop(SIGKILL);
  {
    std::lock_guard<std::mutex> guard{mx};
    kill_done = steady::now();
    killed = true;
  }
  size_t completed_before = count_completed();
  // Another node holds the seat within 10 s.
  auto heir = await_seat(c, survivors, 15s);
  auto seat_moved = steady::now() - kill_sent;
  // Run until nothing is left to claim: no task running, none executable
  // (what was running at the kill is stale and blocks its parents).
  auto reader = client_of(ports[survivors[0]]);
  bool settled = false;
  while (!settled && steady::now() < deadline) {
    std::this_thread::sleep_for(250ms);
    auto r = served(*reader, "/v1/orchestrations/" + root, nullptr, retried,
                    true);
    if (r.status != 200)
      continue;
    settled = r.body["executable"].empty();
    for (auto& t : r.body["tasks"])
      settled = settled && t["state"] != "running";
  }
  stop = true;
  for (auto& w : workers)
    w.join();
  INFO("first failure: " << (failures.empty() ? "" : failures.front()));
  REQUIRE(failures.empty());
  REQUIRE(settled);
  CHECK(heir != victim);
  CHECK(ms(seat_moved) < 10000);
  REQUIRE(first_claim_after.has_value());
  CHECK(ms(*first_claim_after - kill_sent) < 10000);
  CHECK(count_completed() > completed_before);

  auto tree = tree_of(*reader, root, retried);
  REQUIRE(tree.size() == 613);
  auto children = children_of(tree);
  // No task handed out twice: not to the workers' knowledge, and not at
  // all (the store counts one attempt per claim that committed, known to
  // its worker or not).
  size_t twice = 0, attempts_off = 0, completed_lost = 0;
  std::string first_twice, first_attempts, first_lost;
  for (auto& [task, rs] : claims)
    if (rs.size() > 1 && twice++ == 0)
      first_twice = task;
  for (auto& [id, t] : tree) {
    auto attempts = t["attempts"].get<int>();
    bool ok = t["state"] == "pending" ? attempts == 0 : attempts == 1;
    if (!ok && attempts_off++ == 0)
      first_attempts = t.dump();
  }
  // Every completion answered 200 stays completed.
  for (auto& task : completed)
    if (tree.at(task)["state"] != "completed" && completed_lost++ == 0)
      first_lost = tree.at(task).dump();
  INFO("first claimed twice: " << first_twice);
  INFO("first task with attempts not matching its state: " << first_attempts);
  INFO("first completion lost: " << first_lost);
  CHECK(twice == 0);
  CHECK(attempts_off == 0);
  CHECK(completed_lost == 0);
  // What is stale was running at the kill: claimed before the victim was
  // gone and not completed (a task whose claim's answer the kill cut off
  // is known to no worker; there are no more of those than such claims).
  // A task claimed after the kill completes; one whose completion was
  // refused (409) was claimed before it and is stale now.
  size_t stale = 0, stale_unknown = 0, stale_after_kill = 0, running = 0;
  size_t lost_after_kill = 0, lost_not_stale = 0, parent_early = 0;
  for (auto& [id, t] : tree) {
    if (t["state"] == "running")
      ++running;
    if (t["state"] == "stale") {
      ++stale;
      auto rec = claims.find(id);
      if (rec == claims.end())
        ++stale_unknown;
      else if (rec->second.front().sent > kill_done)
        ++stale_after_kill;
      CHECK(completed.count(id) == 0);
    }
    if (t["attempts"].get<int>() > 0)
      for (auto& kid : children[id])
        if (tree.at(kid)["state"] != "completed")
          ++parent_early;
  }
  for (auto& [task, code] : lost) {
    if (claims.at(task).front().sent > kill_done)
      ++lost_after_kill;
    if (tree.at(task)["state"] != "stale")
      ++lost_not_stale;
  }
  for (auto& task : unsure) {
    auto state = tree.at(task)["state"];
    CHECK((state == "completed" || state == "stale"));
  }
  INFO("stale: " << stale << ", unknown claims: " << unknown_claims
                 << ", completions refused: " << lost.size()
                 << ", completions unsure: " << unsure.size());
  CHECK(running == 0);
  // At most one task per worker, and those of the claims cut off, were
  // running at the kill.
  CHECK(stale <= workers.size() + unknown_claims);
  CHECK(stale_unknown <= unknown_claims);
  CHECK(stale_after_kill == 0);
  CHECK(lost_after_kill == 0);
  CHECK(lost_not_stale == 0);
  CHECK(parent_early == 0);
  // Each task is completed, stale, or pending behind a task that is not
  // completed.
  for (auto& [id, t] : tree)
    if (t["state"] == "pending") {
      bool blocked = false;
      for (auto& kid : children[id])
        blocked = blocked || tree.at(kid)["state"] != "completed";
      CHECK(blocked);
    }
}
