#include "stress/stress.hpp"

#include <algorithm>
#include <atomic>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <unistd.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/task_id.hpp"
#include "net/http_client.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle {

using json = nlohmann::json;
using namespace std::chrono;

namespace {

const std::vector<std::string> op_names{"message", "history", "context",
                                        "item",    "id",      "task"};

// -- drivers: the same operations over HTTP or against the facade ----------

struct op_result {
  bool ok = false;
  int status = 0;     // HTTP status (in-process: 200, 204, 404 or 500)
  json body;          // the JSON reply, same shape for both drivers
  std::string error;  // for failures
};

class driver {
public:
  virtual ~driver() = default;
  virtual op_result message(const std::string& thread,
                            const std::string& content,
                            const std::string& user) = 0;
  virtual op_result history(const std::string& thread) = 0;
  virtual op_result context(const std::string& thread,
                            const std::string& content,
                            const std::string& user) = 0;
  virtual op_result add_item(const std::string& thread,
                             const std::string& content) = 0;
  virtual op_result next_id(const std::string& kind,
                            const std::string& parent) = 0;
  virtual op_result create_orchestration(const std::string& payload) = 0;
  virtual op_result spawn(const std::string& parent,
                          const std::string& payload) = 0;
  virtual op_result claim(const std::string& worker) = 0;
  virtual op_result complete(const std::string& task) = 0;
};

class http_driver : public driver {
public:
  http_driver(const std::string& url, const std::string& token)
    : cli_(url, milliseconds{60000}) {
    if (!token.empty())
      headers_ = {{"Authorization", "Bearer " + token}};
  }

  op_result message(const std::string& thread, const std::string& content,
                    const std::string& user) override {
    json body{{"content", content}};
    if (!user.empty())
      body["user_id"] = user;
    return post("/v1/threads/" + thread + "/messages", body);
  }
  op_result history(const std::string& thread) override {
    return get("/v1/threads/" + thread + "/history?max_turns=50");
  }
  op_result context(const std::string& thread, const std::string& content,
                    const std::string& user) override {
    json body{{"content", content}};
    if (!user.empty())
      body["user_id"] = user;
    return post("/v1/threads/" + thread + "/context", body);
  }
  op_result add_item(const std::string& thread,
                     const std::string& content) override {
    return post("/v1/threads/" + thread + "/items",
                {{"type", "text"}, {"content", content}});
  }
  op_result next_id(const std::string& kind,
                    const std::string& parent) override {
    json body{{"kind", kind}};
    if (!parent.empty())
      body["parent"] = parent;
    return post("/v1/ids", body);
  }
  op_result create_orchestration(const std::string& payload) override {
    return post("/v1/orchestrations", {{"payload", payload}});
  }
  op_result spawn(const std::string& parent,
                  const std::string& payload) override {
    return post("/v1/tasks/" + parent + "/subtasks", {{"payload", payload}});
  }
  op_result claim(const std::string& worker) override {
    auto r = post("/v1/tasks/claim", {{"worker", worker}});
    // A claim over HTTP holds its task under a lease; its completion names it.
    if (r.ok && r.body.is_object() && r.body.contains("lease")) {
      std::lock_guard<std::mutex> guard{mtx_};
      leases_[r.body.value("id", "")]
        = r.body["lease"].value("token", "");
    }
    return r;
  }
  op_result complete(const std::string& task) override {
    json body{{"result", "done"}};
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (auto i = leases_.find(task); i != leases_.end()) {
        body["lease"] = i->second;
        leases_.erase(i);
      }
    }
    return post("/v1/tasks/" + task + "/complete", body);
  }

private:
  std::mutex mtx_;
  std::unordered_map<std::string, std::string> leases_;

  op_result finish(net::blocking_http_client::response r) {
    op_result out;
    if (r.status == 0) {
      out.error = "transport: " + r.error;
      return out;
    }
    out.status = r.status;
    out.ok = r.status >= 200 && r.status < 300;
    if (!r.body.empty())
      out.body = json::parse(r.body, nullptr, false);
    if (!out.ok)
      out.error = std::to_string(r.status) + " " + r.body.substr(0, 200);
    return out;
  }
  op_result post(const std::string& path, const json& body) {
    return finish(cli_.request("POST", path, body.dump(), headers_));
  }
  op_result get(const std::string& path) {
    return finish(cli_.request("GET", path, {}, headers_));
  }

  net::blocking_http_client cli_;
  std::vector<std::pair<std::string, std::string>> headers_;
};

class runtime_driver : public driver {
public:
  explicit runtime_driver(runtime& rt) : rt_(rt) {
  }

  op_result message(const std::string& thread, const std::string& content,
                    const std::string& user) override {
    auto r = rt_.send_message(thread, content, user);
    if (!r)
      return fail(r.error());
    return ok({{"thread_id", r->thread_id}, {"turns", r->turns}});
  }
  op_result history(const std::string& thread) override {
    auto w = rt_.read_history(thread, 50);
    if (!w)
      return fail(w.error());
    json turns = json::array();
    for (auto& t : w->turns)
      turns.push_back({{"role", to_string(t.role)}});
    return ok({{"turns", turns}, {"total_turns", w->total_turns}});
  }
  op_result context(const std::string& thread, const std::string& content,
                    const std::string& user) override {
    auto b = rt_.build_context(thread, user, content);
    if (!b)
      return fail(b.error());
    return ok({{"thread_found", b->thread_found}});
  }
  op_result add_item(const std::string& thread,
                     const std::string& content) override {
    auto a = rt_.add_context(thread, context_type::text, content);
    if (!a)
      return fail(a.error());
    return ok({{"item", {{"id", a->item.id()}}}, {"evicted", a->evicted}});
  }
  op_result next_id(const std::string& kind,
                    const std::string& parent) override {
    auto id = kind == "context"         ? rt_.next_context_id()
              : kind == "orchestration" ? rt_.next_orchestration_id()
                                        : rt_.next_task_id(parent);
    if (!id)
      return fail(id.error());
    return ok({{"id", *id}});
  }
  op_result create_orchestration(const std::string& payload) override {
    auto id = rt_.create_orchestration(payload);
    if (!id)
      return fail(id.error());
    return ok({{"id", *id}});
  }
  op_result spawn(const std::string& parent,
                  const std::string& payload) override {
    auto id = rt_.spawn_subtask(parent, payload);
    if (!id)
      return fail(id.error());
    return ok({{"id", *id}});
  }
  op_result claim(const std::string& worker) override {
    auto c = rt_.claim_task(worker);
    if (!c)
      return fail(c.error());
    if (!*c) {
      op_result out;
      out.ok = true;
      out.status = 204;
      return out;
    }
    return ok({{"id", (*c)->id}});
  }
  op_result complete(const std::string& task) override {
    auto t = rt_.complete_task(task, "done");
    if (!t)
      return fail(t.error());
    return ok({{"id", t->id}});
  }

private:
  static op_result ok(json body) {
    op_result out;
    out.ok = true;
    out.status = 200;
    out.body = std::move(body);
    return out;
  }
  static op_result fail(const caf::error& err) {
    op_result out;
    out.status = classify(err) == errc::conflict ? 409 : 500;
    out.error = describe(err);
    return out;
  }
  runtime& rt_;
};

// -- the invariants, checked on every response ---------------------------------

class checker {
public:
  void violation(std::string invariant, std::string evidence) {
    std::lock_guard<std::mutex> guard{mx_};
    if (violations_.size() < 1000)
      violations_.push_back({std::move(invariant), std::move(evidence)});
    ++count_;
  }

  // IDs never repeat, across every client and kind.
  void saw_id(size_t client, const std::string& id, const std::string& op) {
    std::lock_guard<std::mutex> guard{mx_};
    if (!ids_.insert(id).second)
      violations_locked("ids never repeat",
                        "client " + std::to_string(client) + " got " + id
                          + " from " + op + ", which was handed out before");
  }

  uint64_t violations() const {
    return count_;
  }
  std::vector<stress_violation> list() const {
    std::lock_guard<std::mutex> guard{mx_};
    return violations_;
  }

  // Task bookkeeping: what the stress created (and when its creation was
  // confirmed), and claims. A parent is judged only against children whose
  // creation was confirmed before its claim was sent: a child spawned while
  // the claim was in flight may legitimately arrive after it.
  void created(const std::string& id, const std::string& parent,
               steady_clock::time_point confirmed) {
    std::lock_guard<std::mutex> guard{mx_};
    children_[id];
    if (!parent.empty())
      children_[parent].push_back({id, confirmed});
  }
  void claimed(size_t client, const std::string& id,
               steady_clock::time_point sent) {
    std::lock_guard<std::mutex> guard{mx_};
    if (!claimed_.insert(id).second)
      violations_locked("every task is claimed exactly once",
                        "client " + std::to_string(client) + " claimed " + id
                          + ", which another claim already returned");
    auto it = children_.find(id);
    if (it == children_.end())
      return; // not ours: created by someone else
    for (auto& [child, confirmed] : it->second)
      if (confirmed < sent && completing_.count(child) == 0)
        violations_locked("no task runs before its children complete",
                          "client " + std::to_string(client) + " claimed "
                            + id + " while its child " + child
                            + " was not completed");
  }
  void completing(const std::string& id) {
    std::lock_guard<std::mutex> guard{mx_};
    completing_.insert(id);
  }

private:
  void violations_locked(std::string invariant, std::string evidence) {
    if (violations_.size() < 1000)
      violations_.push_back({std::move(invariant), std::move(evidence)});
    ++count_;
  }

  mutable std::mutex mx_;
  std::unordered_set<std::string> ids_;
  std::unordered_map<std::string,
                     std::vector<std::pair<std::string, steady_clock::time_point>>>
    children_;
  std::unordered_set<std::string> claimed_;
  std::unordered_set<std::string> completing_;
  std::vector<stress_violation> violations_;
  std::atomic<uint64_t> count_{0};
};

// Orders IDs of one counter: ctx-N by N, hybrid36 by ordinal, tasks by
// their last sequence number.
std::optional<uint64_t> order_of(const std::string& id) {
  if (auto n = parse_context_id(id))
    return n;
  if (auto t = task_id::parse(id))
    return t->sequence();
  return std::nullopt;
}

struct client_state {
  size_t index = 0;
  std::mt19937_64 rng;
  std::string private_thread;
  std::string user;
  // Per counter ("ctx", "global", parent): the last value this client saw.
  std::unordered_map<std::string, uint64_t> last_id;
  // Per thread: the largest turn count this client has seen.
  std::unordered_map<std::string, uint64_t> last_turns;
  std::map<std::string, std::vector<double>> latencies;
  std::map<std::string, uint64_t> errors;
};

void check_increasing(checker& chk, client_state& c, const std::string& key,
                      const std::string& id) {
  auto value = order_of(id);
  if (!value)
    return;
  auto& last = c.last_id[key];
  if (*value <= last)
    chk.violation("each client sees its IDs increase",
                  "client " + std::to_string(c.index) + " got " + id
                    + " after value " + std::to_string(last) + " of counter "
                    + key);
  last = std::max(last, *value);
}

void check_turns(checker& chk, client_state& c, const std::string& thread,
                 uint64_t turns, const char* where) {
  auto& last = c.last_turns[thread];
  if (turns < last)
    chk.violation("a thread's turn count never decreases",
                  "client " + std::to_string(c.index) + " saw thread "
                    + thread + " at " + std::to_string(turns) + " turns ("
                    + where + ") after seeing " + std::to_string(last));
  last = std::max(last, turns);
}

void check_order(checker& chk, client_state& c, const std::string& thread,
                 const json& turns) {
  std::string prev;
  for (size_t i = 0; i < turns.size(); ++i) {
    auto role = turns[i].value("role", "");
    if (i == 0 && role != "user")
      chk.violation("turns alternate user, assistant",
                    "client " + std::to_string(c.index) + ": the window of "
                      + thread + " starts with " + role);
    if (!prev.empty() && role == prev)
      chk.violation("turns alternate user, assistant",
                    "client " + std::to_string(c.index) + ": thread "
                      + thread + " has two " + role
                      + " turns in a row at window index "
                      + std::to_string(i));
    prev = role;
  }
}

} // namespace

std::optional<std::map<std::string, unsigned>>
parse_mix(const std::string& text, std::string& error) {
  std::map<std::string, unsigned> out;
  std::istringstream in{text};
  std::string part;
  while (std::getline(in, part, ',')) {
    auto eq = part.find('=');
    auto name = part.substr(0, eq);
    if (std::find(op_names.begin(), op_names.end(), name) == op_names.end()) {
      error = "unknown operation '" + name
              + "' (message, history, context, item, id, task)";
      return std::nullopt;
    }
    unsigned weight = 1;
    if (eq != std::string::npos) {
      try {
        size_t used = 0;
        auto w = std::stoul(part.substr(eq + 1), &used);
        if (used != part.size() - eq - 1 || w > 1000000)
          throw std::invalid_argument("weight");
        weight = static_cast<unsigned>(w);
      } catch (...) {
        error = "weight of '" + name + "' must be a whole number";
        return std::nullopt;
      }
    }
    out[name] = weight;
  }
  unsigned total = 0;
  for (auto& [k, v] : out)
    total += v;
  if (total == 0) {
    error = "the mix has no operation with a weight above 0";
    return std::nullopt;
  }
  return out;
}

stress_report run_stress(const stress_options& options, runtime* rt) {
  checker chk;
  std::atomic<uint64_t> done{0}, errors{0};
  std::atomic<bool> stop{false};
  std::mutex samples_mx;
  std::vector<std::string> error_samples;
  auto run_id = std::to_string(::getpid()) + "-"
                + std::to_string(system_clock::now().time_since_epoch().count()
                                 % 1000000);
  std::vector<std::string> shared;
  for (size_t i = 0; i < options.shared_threads; ++i)
    shared.push_back("stress-" + run_id + "-shared-" + std::to_string(i));
  // With thread_turns, the n-th message of a slot goes to the slot's
  // thread number n / (thread_turns / 2): a message adds two turns. A
  // writer that picked a name just before the slot moved on adds its
  // message to the old thread, which ends a few turns longer.
  uint64_t per_thread = std::max<uint64_t>(1, options.thread_turns / 2);
  std::vector<std::atomic<uint64_t>> shared_messages(shared.size());
  auto generation = [&](const std::string& base, uint64_t messages) {
    if (options.thread_turns == 0)
      return base;
    return base + "-" + std::to_string(messages / per_thread);
  };

  std::vector<std::string> ops;
  std::vector<unsigned> weights;
  for (auto& [name, weight] : options.mix) {
    ops.push_back(name);
    weights.push_back(weight);
  }

  std::vector<client_state> clients(options.clients);
  auto start = steady_clock::now();
  auto deadline = options.duration.count() > 0 ? start + options.duration
                                               : steady_clock::time_point::max();
  auto take = [&] {
    if (stop)
      return false;
    if (steady_clock::now() >= deadline)
      return false;
    if (options.requests > 0 && done.fetch_add(1) >= options.requests)
      return false;
    if (options.requests == 0)
      ++done;
    return true;
  };

  std::vector<std::thread> threads;
  for (size_t i = 0; i < options.clients; ++i)
    threads.emplace_back([&, i] {
      auto& c = clients[i];
      c.index = i;
      c.rng.seed(options.seed * 7919 + i);
      c.private_thread = "stress-" + run_id + "-private-" + std::to_string(i);
      c.user = "stress-user-" + std::to_string(i % 4);
      std::unique_ptr<driver> d;
      if (options.in_process)
        d = std::make_unique<runtime_driver>(*rt);
      else
        d = std::make_unique<http_driver>(options.url, options.token);
      std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
      std::vector<std::string> my_tasks; // tasks this client created
      uint64_t private_messages = 0;
      while (take()) {
        auto op = ops[pick(c.rng)];
        std::atomic<uint64_t>* slot = nullptr;
        std::string thread;
        if (c.rng() % 2 == 0 || shared.empty()) {
          thread = generation(c.private_thread, private_messages);
        } else {
          auto k = c.rng() % shared.size();
          slot = &shared_messages[k];
          thread = generation(shared[k], slot->load());
        }
        auto t0 = steady_clock::now();
        op_result r;
        if (op == "message") {
          if (slot != nullptr)
            slot->fetch_add(1);
          else
            ++private_messages;
          r = d->message(thread, "stress message from client "
                                   + std::to_string(i),
                         c.user);
          if (r.ok)
            check_turns(chk, c, thread, r.body.value("turns", 0ull),
                        "message reply");
        } else if (op == "history") {
          r = d->history(thread);
          if (r.status == 404) {
            r.ok = true; // not written yet: allowed, and nothing to check
          } else if (r.ok) {
            check_turns(chk, c, thread, r.body.value("total_turns", 0ull),
                        "history");
            check_order(chk, c, thread, r.body["turns"]);
          }
        } else if (op == "context") {
          r = d->context(thread, "what did we talk about?", c.user);
        } else if (op == "item") {
          r = d->add_item(thread, "stress item from client "
                                    + std::to_string(i));
          if (r.ok) {
            auto id = r.body["item"].value("id", "");
            chk.saw_id(i, id, "item");
            check_increasing(chk, c, "ctx", id);
          }
        } else if (op == "id") {
          auto which = c.rng() % 3;
          std::string kind = which == 0   ? "context"
                             : which == 1 ? "orchestration"
                                          : "task";
          std::string parent = kind == "task" ? "0001_t1" : "";
          r = d->next_id(kind, parent);
          if (r.ok) {
            auto id = r.body.value("id", "");
            chk.saw_id(i, id, "id");
            check_increasing(chk, c,
                             kind == "context"         ? "ctx"
                             : kind == "orchestration" ? "global"
                                                       : parent,
                             id);
          }
        } else { // task: grow a tree, or claim and complete
          // A tree has 5 tasks: 1 in 8 task operations grows one, the
          // rest claim, so the claimers keep up and trees finish (a run
          // does not pile up pending work).
          if (c.rng() % 8 == 0) {
            // A new orchestration is executable at once, so another
            // client may claim and complete it (or a child) before this
            // one adds children: a 409 conflict is then the right answer,
            // not an error.
            r = d->create_orchestration("stress tree");
            if (r.ok) {
              auto root = r.body.value("id", "");
              chk.created(root, "", steady_clock::now());
              for (int k = 0; k < 2; ++k) {
                auto child = d->spawn(root, "stress child");
                if (!child.ok) {
                  if (child.status != 409)
                    r = child;
                  break;
                }
                auto child_id = child.body.value("id", "");
                chk.created(child_id, root, steady_clock::now());
                auto leaf = d->spawn(child_id, "stress leaf");
                if (leaf.ok)
                  chk.created(leaf.body.value("id", ""), child_id,
                              steady_clock::now());
                else if (leaf.status != 409)
                  r = leaf;
              }
            }
          } else {
            auto sent = steady_clock::now();
            r = d->claim("stress-worker-" + std::to_string(i));
            if (r.ok && r.status == 200) {
              auto id = r.body.value("id", "");
              chk.claimed(i, id, sent);
              chk.completing(id);
              auto fin = d->complete(id);
              if (!fin.ok)
                r = fin;
            }
          }
        }
        auto ms = duration<double, std::milli>(steady_clock::now() - t0)
                    .count();
        c.latencies[op].push_back(ms);
        if (!r.ok) {
          ++c.errors[op];
          ++errors;
          std::lock_guard<std::mutex> guard{samples_mx};
          if (error_samples.size() < 10)
            error_samples.push_back(op + ": " + r.error);
        }
      }
    });

  std::thread progress;
  bool tty = options.progress && isatty(STDERR_FILENO);
  std::atomic<bool> finished{false};
  if (tty)
    progress = std::thread{[&] {
      while (!finished) {
        std::this_thread::sleep_for(milliseconds(250));
        auto secs = duration<double>(steady_clock::now() - start).count();
        auto n = std::min<uint64_t>(done, options.requests > 0
                                            ? options.requests
                                            : UINT64_MAX);
        std::fprintf(stderr,
                     "\r%llu requests  %.0f/s  %llu errors  %llu violations ",
                     static_cast<unsigned long long>(n),
                     secs > 0 ? static_cast<double>(n) / secs : 0.0,
                     static_cast<unsigned long long>(errors.load()),
                     static_cast<unsigned long long>(chk.violations()));
      }
      std::fprintf(stderr, "\n");
    }};
  for (auto& t : threads)
    t.join();
  finished = true;
  if (progress.joinable())
    progress.join();

  stress_report rep;
  rep.seconds = duration<double>(steady_clock::now() - start).count();
  std::map<std::string, std::vector<double>> all;
  for (auto& c : clients) {
    for (auto& [op, samples] : c.latencies)
      all[op].insert(all[op].end(), samples.begin(), samples.end());
    for (auto& [op, n] : c.errors)
      rep.ops[op].errors += n;
  }
  for (auto& [op, samples] : all) {
    std::sort(samples.begin(), samples.end());
    // A structured binding cannot be captured in C++17; a reference can.
    auto at = [&sorted = samples](double p) {
      return sorted[static_cast<size_t>(p / 100.0
                                        * static_cast<double>(sorted.size()
                                                              - 1))];
    };
    auto& s = rep.ops[op];
    s.count = samples.size();
    s.p50 = at(50);
    s.p90 = at(90);
    s.p99 = at(99);
    s.max = samples.back();
    rep.operations += s.count;
  }
  rep.errors = errors;
  rep.violations = chk.list();
  rep.error_samples = error_samples;
  return rep;
}

nlohmann::json stress_report::to_json() const {
  json ops_json = json::object();
  for (auto& [op, s] : ops)
    ops_json[op] = {{"count", s.count}, {"errors", s.errors},
                    {"p50_ms", s.p50},  {"p90_ms", s.p90},
                    {"p99_ms", s.p99},  {"max_ms", s.max}};
  json v = json::array();
  for (auto& x : violations)
    v.push_back({{"invariant", x.invariant}, {"evidence", x.evidence}});
  return {{"seconds", seconds},
          {"operations", operations},
          {"throughput", seconds > 0 ? static_cast<double>(operations) / seconds
                                     : 0.0},
          {"errors", errors},
          {"operations_by_kind", ops_json},
          {"violations", v},
          {"error_samples", error_samples}};
}

std::string stress_report::to_text() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "%llu operations in %.1f s: %.0f/s, %llu errors, %zu "
                "violations\n\n",
                static_cast<unsigned long long>(operations), seconds,
                seconds > 0 ? static_cast<double>(operations) / seconds : 0.0,
                static_cast<unsigned long long>(errors), violations.size());
  out << line;
  std::snprintf(line, sizeof(line), "%-10s %9s %7s %9s %9s %9s %9s\n",
                "operation", "count", "errors", "p50 ms", "p90 ms", "p99 ms",
                "max ms");
  out << line;
  for (auto& [op, s] : ops) {
    std::snprintf(line, sizeof(line),
                  "%-10s %9llu %7llu %9.2f %9.2f %9.2f %9.2f\n", op.c_str(),
                  static_cast<unsigned long long>(s.count),
                  static_cast<unsigned long long>(s.errors), s.p50, s.p90,
                  s.p99, s.max);
    out << line;
  }
  if (!error_samples.empty()) {
    out << "\nsome errors:\n";
    for (auto& e : error_samples)
      out << "  " << e << "\n";
  }
  if (!violations.empty()) {
    out << "\nVIOLATIONS:\n";
    for (auto& v : violations)
      out << "  [" << v.invariant << "] " << v.evidence << "\n";
  }
  return out.str();
}

} // namespace spindle
