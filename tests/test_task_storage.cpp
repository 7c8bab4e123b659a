// Durable orchestration: every task state change is committed before its
// reply, and a restarted runtime rebuilds every orchestration from what
// committed (issue 7). Restarts with a temporary data directory: trees
// survive exactly, running tasks come back stale, D1 holds after a
// restart, IDs never repeat; writes the store refuses (a trigger in the
// database) fail cleanly and leave what committed; rows this build cannot
// read stop the start. Plus the pure row mapping (task_records).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "spindle/actors/task_records.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;

namespace {

runtime_options durable(const test::test_store& dir) {
  runtime_options opts;
  dir.apply(opts.storage);
  return opts;
}

// The seed's tree: 0001 with t1{t1.1, t1.2} and t2, plus 0002.
void build_seed_tree(runtime& rt) {
  REQUIRE(rt.create_orchestration("orchestration 1").value() == "0001");
  REQUIRE(rt.spawn_subtask("0001", "t1").value() == "0001_t1");
  REQUIRE(rt.spawn_subtask("0001", "t2").value() == "0001_t2");
  REQUIRE(rt.spawn_subtasks("0001_t1", {"t1.1", "t1.2"}).value()
          == std::vector<std::string>{"0001_t1.1", "0001_t1.2"});
  REQUIRE(rt.create_orchestration("orchestration 2").value() == "0002");
}

std::string claim_id(runtime& rt, const std::string& worker = "w") {
  auto got = rt.claim_task(worker);
  REQUIRE(got);
  REQUIRE(got->has_value());
  return (*got)->id;
}

// Every field of a task, one line: trees compare exactly and print well.
std::string show(const task_info& t) {
  std::ostringstream out;
  out << t.id << " parent=" << t.parent << " state=" << to_string(t.state)
      << " payload=" << t.payload << " outcome=" << t.outcome
      << " worker=" << t.worker << " incomplete=" << t.incomplete_children
      << " children=";
  for (auto& c : t.children)
    out << c << ",";
  return out.str();
}

std::vector<std::string> show(const task_tree& tree) {
  std::vector<std::string> out;
  for (auto& t : tree.tasks)
    out.push_back(show(t));
  return out;
}

template <class Pred>
bool eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// A second connection to the runtime's store, as an operator (or a
// failing disk) would have it.
class side_connection {
public:
  explicit side_connection(const test::test_store& dir) : dir_(dir) {
  }
  void exec(const std::string& sql) {
    INFO(sql);
    REQUIRE_NOTHROW(dir_.exec(sql));
  }
  // "state|outcome|worker" of one stored task, or "" if it is not stored.
  // (IDs are of the task grammar: no quotes to escape.)
  std::string row(const std::string& id) {
    auto r = dir_.query_row("SELECT state, outcome, worker FROM tasks "
                            "WHERE id = '"
                            + id + "';");
    if (r.empty())
      return {};
    auto state = static_cast<task_state>(std::stoi(r.at(0)));
    return to_string(state) + "|" + r.at(1) + "|" + r.at(2);
  }
  void refuse(const std::string& name, const std::string& event,
              const std::string& when, const std::string& message) {
    dir_.refuse(name, event, "tasks", when, message);
  }
  void allow(const std::string& name) {
    dir_.allow(name, "tasks");
  }

private:
  const test::test_store& dir_;
};

// Captures spdlog's default logger while alive.
class log_capture {
public:
  log_capture()
    : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)),
      previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  }
  ~log_capture() {
    spdlog::set_default_logger(previous_);
  }
  bool contains(const std::string& text) {
    for (auto& line : sink_->last_formatted())
      if (line.find(text) != std::string::npos)
        return true;
    return false;
  }

private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

} // namespace

// -- restarts ---------------------------------------------------------------------

TEST_CASE("task storage: pending, completed and failed tasks and the whole "
          "tree survive a restart exactly") {
  test::test_store dir;
  std::vector<std::string> tree1, tree2;
  std::vector<std::string> executable;
  {
    runtime rt{durable(dir)};
    build_seed_tree(rt);
    REQUIRE(claim_id(rt, "alice") == "0001_t1.2");
    REQUIRE(rt.complete_task("0001_t1.2", "result 1.2"));
    REQUIRE(claim_id(rt, "bob") == "0001_t1.1");
    REQUIRE(rt.fail_task("0001_t1.1", "bob gave up"));
    REQUIRE(claim_id(rt, "carol") == "0001_t2");
    REQUIRE(rt.fail_task("0001_t2", "flaky"));
    REQUIRE(rt.requeue_task("0001_t2")); // failed -> pending again
    REQUIRE(rt.spawn_subtask("0002", "late child").value() == "0002_t1");
    tree1 = show(rt.orchestration_tree("0001").value());
    tree2 = show(rt.orchestration_tree("0002").value());
    executable = rt.executable_tasks().value();
    CHECK(executable == std::vector<std::string>{"0001_t2", "0002_t1"});
  }
  for (int restart = 0; restart < 2; ++restart) {
    runtime rt{durable(dir)};
    CHECK(show(rt.orchestration_tree("0001").value()) == tree1);
    CHECK(show(rt.orchestration_tree("0002").value()) == tree2);
    CHECK(rt.executable_tasks().value() == executable);
    auto t12 = rt.task("0001_t1.2").value();
    CHECK(t12.state == task_state::completed);
    CHECK(t12.outcome == "result 1.2");
    CHECK(t12.worker == "alice");
    auto t11 = rt.task("0001_t1.1").value();
    CHECK(t11.state == task_state::failed);
    CHECK(t11.outcome == "bob gave up");
    auto root = rt.task("0001").value();
    CHECK(root.payload == "orchestration 1");
    CHECK(root.incomplete_children == 2);
    CHECK(root.children == std::vector<std::string>{"0001_t1", "0001_t2"});
  }
}

TEST_CASE("task storage: a task running at shutdown comes back stale with "
          "its worker, is reported, and can be requeued and run") {
  test::test_store dir;
  {
    runtime rt{durable(dir)};
    build_seed_tree(rt);
    REQUIRE(claim_id(rt, "alice") == "0001_t1.2");
    REQUIRE(claim_id(rt, "bob") == "0001_t1.1");
    REQUIRE(rt.complete_task("0001_t1.1", "done"));
  }
  log_capture log;
  runtime rt{durable(dir)};
  CHECK(log.contains("1 tasks were running under the previous process and "
                     "are now stale"));
  CHECK(log.contains("0001_t1.2"));
  auto t12 = rt.task("0001_t1.2").value();
  CHECK(t12.state == task_state::stale);
  CHECK(t12.worker == "alice");
  CHECK(rt.task("0001_t1.1").value().state == task_state::completed);
  auto counts = rt.count_tasks().value();
  CHECK(counts.stale == 1);
  CHECK(counts.running == 0);
  CHECK(counts.completed == 1);
  CHECK(counts.pending == 4);
  // The stale task blocks its parent until it is requeued and completed.
  CHECK(rt.executable_tasks().value()
        == std::vector<std::string>{"0001_t2", "0002"});
  REQUIRE(rt.requeue_task("0001_t1.2").value().state == task_state::pending);
  REQUIRE(claim_id(rt, "carol") == "0001_t1.2");
  REQUIRE(rt.complete_task("0001_t1.2", "second try"));
  CHECK(rt.executable_tasks().value()
        == std::vector<std::string>{"0001_t2", "0001_t1", "0002"});
}

TEST_CASE("task storage: the stale change is stored too - a second restart "
          "reports nothing new") {
  test::test_store dir;
  {
    runtime rt{durable(dir)};
    build_seed_tree(rt);
    REQUIRE(claim_id(rt, "alice") == "0001_t1.2");
  }
  {
    runtime rt{durable(dir)};
    CHECK(rt.task("0001_t1.2").value().state == task_state::stale);
  }
  side_connection db{dir};
  CHECK(db.row("0001_t1.2") == "stale||alice");
  log_capture log;
  runtime rt{durable(dir)};
  CHECK_FALSE(log.contains("now stale"));
  CHECK(rt.task("0001_t1.2").value().state == task_state::stale);
}

TEST_CASE("task storage: claims after a restart follow D1 and never return "
          "a completed task") {
  test::test_store dir;
  {
    runtime rt{durable(dir)};
    build_seed_tree(rt);
    REQUIRE(claim_id(rt) == "0001_t1.2");
    REQUIRE(rt.complete_task("0001_t1.2", "r"));
  }
  std::vector<std::string> order;
  {
    runtime rt{durable(dir)};
    // Two claims, the second left running across the next restart.
    order.push_back(claim_id(rt));
    REQUIRE(rt.complete_task(order.back(), "r"));
    order.push_back(claim_id(rt, "doomed"));
  }
  {
    runtime rt{durable(dir)};
    REQUIRE(rt.task(order.back()).value().state == task_state::stale);
    REQUIRE(rt.requeue_task(order.back()));
    while (true) {
      auto got = rt.claim_task("w");
      REQUIRE(got);
      if (!got->has_value())
        break;
      auto id = (*got)->id;
      REQUIRE(id != "0001_t1.2"); // completed before the first restart
      if (id != order.back())
        order.push_back(id);
      REQUIRE(rt.complete_task(id, "r"));
    }
  }
  CHECK(order
        == std::vector<std::string>{"0001_t1.1", "0001_t2", "0001_t1", "0002",
                                    "0001"});
  runtime rt{durable(dir)};
  auto counts = rt.count_tasks().value();
  CHECK(counts.completed == 6);
  CHECK(counts.total() == 6);
  CHECK_FALSE(rt.claim_task("w").value().has_value());
}

TEST_CASE("task storage: IDs after a restart are above every ID handed out "
          "before, for orchestrations and for subtasks") {
  test::test_store dir;
  {
    runtime rt{durable(dir)};
    build_seed_tree(rt);
  }
  uint64_t last_orch = 2, last_child = 2; // 0002, 0001_t1.2
  for (int restart = 0; restart < 3; ++restart) {
    runtime rt{durable(dir)};
    auto orch = rt.create_orchestration("after restart");
    REQUIRE(orch);
    auto orch_value = *hybrid36::parse(*orch);
    CHECK(orch_value > last_orch);
    auto child = rt.spawn_subtask("0001_t1", "after restart");
    REQUIRE(child);
    auto child_value = task_id::parse(*child)->sequence();
    CHECK(child_value > last_child);
    last_orch = orch_value;
    last_child = child_value;
    auto tree = rt.orchestration_tree("0001").value();
    std::set<std::string> ids;
    for (auto& t : tree.tasks)
      CHECK(ids.insert(t.id).second);
    CHECK(tree.tasks.size() == static_cast<size_t>(6 + restart));
  }
}

TEST_CASE("task storage: every change is committed when its reply arrives") {
  test::test_store dir;
  runtime rt{durable(dir)};
  side_connection db{dir};
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  CHECK(db.row("0001") == "pending||");
  REQUIRE(rt.spawn_subtasks("0001", {"a", "b"}));
  CHECK(db.row("0001_t1") == "pending||");
  CHECK(db.row("0001_t2") == "pending||");
  REQUIRE(claim_id(rt, "alice") == "0001_t2");
  CHECK(db.row("0001_t2") == "running||alice");
  REQUIRE(rt.complete_task("0001_t2", "ok"));
  CHECK(db.row("0001_t2") == "completed|ok|alice");
  REQUIRE(claim_id(rt, "bob") == "0001_t1");
  REQUIRE(rt.fail_task("0001_t1", "no"));
  CHECK(db.row("0001_t1") == "failed|no|bob");
  REQUIRE(rt.requeue_task("0001_t1"));
  CHECK(db.row("0001_t1") == "pending||bob");
  REQUIRE(claim_id(rt, "carol") == "0001_t1");
  REQUIRE(rt.mark_worker_stale("carol").value()
          == std::vector<std::string>{"0001_t1"});
  CHECK(db.row("0001_t1") == "stale||carol");
}

TEST_CASE("task storage: concurrent claimers and completers - every "
          "acknowledged completion survives a restart") {
  test::test_store dir;
  constexpr int tasks = 200;
  std::vector<std::string> done;
  {
    runtime rt{durable(dir)};
    REQUIRE(rt.create_orchestration("root").value() == "0001");
    std::vector<std::string> payloads;
    for (int i = 0; i < tasks; ++i)
      payloads.push_back("p" + std::to_string(i));
    REQUIRE(rt.spawn_subtasks("0001", payloads));
    std::mutex mx;
    std::vector<std::thread> workers;
    for (int w = 0; w < 8; ++w)
      workers.emplace_back([&, w] {
        auto name = "w" + std::to_string(w);
        while (true) {
          auto got = rt.claim_task(name);
          if (!got || !got->has_value())
            return;
          if ((*got)->id == "0001")
            return; // the root stays pending for the check below
          if (rt.complete_task((*got)->id, name)) {
            std::lock_guard<std::mutex> guard{mx};
            done.push_back((*got)->id);
          }
        }
      });
    for (auto& w : workers)
      w.join();
  }
  REQUIRE(done.size() == tasks);
  runtime rt{durable(dir)};
  for (auto& id : done)
    CHECK(rt.task(id).value().state == task_state::completed);
  // The root was claimed by one of the workers (it ran last).
  CHECK(rt.task("0001").value().state == task_state::stale);
}

TEST_CASE("task storage: property: on random trees with random restarts "
          "every claim is the D1-first executable task and every state "
          "matches a model") {
  struct model_task {
    task_state state = task_state::pending;
    std::vector<task_id> children;
  };
  for (unsigned seed = 1; seed <= 4; ++seed) {
    DYNAMIC_SECTION("seed " << seed) {
      std::mt19937 rng{seed};
      test::test_store dir;
      auto opts = durable(dir);
      opts.storage.sync = sync_mode::normal;
      auto rt = std::make_unique<runtime>(opts);
      std::map<task_id, model_task> model;
      auto pick = [&](auto&& pred) -> std::optional<task_id> {
        std::vector<task_id> xs;
        for (auto& [id, t] : model)
          if (pred(id, t))
            xs.push_back(id);
        if (xs.empty())
          return std::nullopt;
        return xs[std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng)];
      };
      auto expected_order = [&] {
        std::vector<task_id> xs;
        for (auto& [id, t] : model) {
          if (t.state != task_state::pending)
            continue;
          if (std::all_of(t.children.begin(), t.children.end(),
                          [&](const task_id& c) {
                            return model[c].state == task_state::completed;
                          }))
            xs.push_back(id);
        }
        std::sort(xs.begin(), xs.end(), claimed_before);
        std::vector<std::string> out;
        for (auto& x : xs)
          out.push_back(x.to_string());
        return out;
      };
      auto spawn = [&](const task_id& parent) {
        auto id = rt->spawn_subtask(parent.to_string(), "p");
        REQUIRE(id);
        auto parsed = *task_id::parse(*id);
        model[parsed];
        model[parent].children.push_back(parsed);
      };
      auto orchestrate = [&] {
        auto id = rt->create_orchestration("o");
        REQUIRE(id);
        model[*task_id::parse(*id)];
      };
      for (int i = 0; i < 2; ++i)
        orchestrate();
      for (int i = 0; i < 20; ++i)
        spawn(*pick([](const task_id& id, const model_task&) {
          return id.depth() < 3;
        }));
      size_t restarts = 0;
      for (int step = 0; step < 250; ++step) {
        auto dice = std::uniform_int_distribution<int>(0, 99)(rng);
        if (dice < 40) {
          auto want = expected_order();
          auto got = rt->claim_task("w");
          REQUIRE(got);
          if (want.empty()) {
            REQUIRE_FALSE(got->has_value());
            continue;
          }
          REQUIRE(got->has_value());
          REQUIRE((*got)->id == want.front());
          model[*task_id::parse((*got)->id)].state = task_state::running;
        } else if (dice < 72) {
          auto id = pick([](const task_id&, const model_task& t) {
            return t.state == task_state::running;
          });
          if (!id)
            continue;
          if (dice < 67) {
            REQUIRE(rt->complete_task(id->to_string(), "r"));
            model[*id].state = task_state::completed;
          } else {
            REQUIRE(rt->fail_task(id->to_string(), "boom"));
            model[*id].state = task_state::failed;
          }
        } else if (dice < 80) {
          auto id = pick([](const task_id&, const model_task& t) {
            return t.state == task_state::failed
                   || t.state == task_state::stale;
          });
          if (!id)
            continue;
          REQUIRE(rt->requeue_task(id->to_string()));
          model[*id].state = task_state::pending;
        } else if (dice < 94) {
          auto parent = pick([](const task_id& id, const model_task& t) {
            return id.depth() < 4 && t.state != task_state::completed;
          });
          if (parent)
            spawn(*parent);
        } else if (dice < 96) {
          orchestrate();
        } else {
          // A restart: whatever ran under the old process is stale.
          rt.reset();
          rt = std::make_unique<runtime>(opts);
          for (auto& [id, t] : model)
            if (t.state == task_state::running)
              t.state = task_state::stale;
          ++restarts;
        }
        REQUIRE(rt->executable_tasks().value() == expected_order());
      }
      CHECK(restarts > 3);
      for (auto& [id, t] : model)
        REQUIRE(rt->task(id.to_string()).value().state == t.state);
    }
  }
}

// -- retirement: finished orchestrations leave memory ------------------------------

namespace {

// Waits until no more than `most` orchestrations are in memory (they
// retire asynchronously once their last write committed).
bool resident_at_most(runtime& rt, uint64_t most) {
  for (int i = 0; i < 500; ++i) {
    auto n = rt.count_tasks();
    if (n && n->resident <= most)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

} // namespace

TEST_CASE("task storage: finished orchestrations leave memory once stored, "
          "are counted and listed still, and come back for any request") {
  test::test_store dir;
  constexpr int orchestrations = 30;
  {
    runtime rt{durable(dir)};
    for (int i = 0; i < orchestrations; ++i) {
      auto root = rt.create_orchestration("o").value();
      REQUIRE(rt.spawn_subtasks(root, {"a", "b"}));
    }
    CHECK(rt.count_tasks().value().resident == orchestrations);
    // Claim and complete everything, in D1 order.
    for (;;) {
      auto got = rt.claim_task("w").value();
      if (!got)
        break;
      REQUIRE(rt.complete_task(got->id, "done"));
    }
    REQUIRE(resident_at_most(rt, 0));
    auto n = rt.count_tasks().value();
    CHECK(n.orchestrations == orchestrations);
    CHECK(n.completed == 3 * orchestrations);
    CHECK(n.pending + n.running + n.failed + n.stale == 0);
    CHECK(rt.list_orchestrations().value().size() == orchestrations);
    // Any request loads one again: a tree, a task, a refused spawn.
    for (int i = 1; i <= orchestrations; ++i) {
      auto root = task_id{static_cast<uint64_t>(i), {}}.to_string();
      auto tree = rt.orchestration_tree(root);
      REQUIRE(tree);
      REQUIRE(tree->tasks.size() == 3);
      for (auto& t : tree->tasks)
        CHECK(t.state == task_state::completed);
      CHECK(rt.task(root + "_t2").value().outcome == "done");
      auto refused = rt.spawn_subtask(root, "late");
      REQUIRE_FALSE(refused);
      CHECK(classify(refused.error()) == errc::conflict);
    }
    // ... and it leaves again; the counts never moved.
    REQUIRE(resident_at_most(rt, 0));
    CHECK(rt.count_tasks().value().completed == 3 * orchestrations);
    // A failed root finishes its orchestration too; a requeue brings it
    // back to work.
    auto root = rt.create_orchestration("to fail").value();
    REQUIRE(claim_id(rt) == root);
    REQUIRE(rt.fail_task(root, "boom"));
    REQUIRE(resident_at_most(rt, 0));
    CHECK(rt.count_tasks().value().failed == 1);
    auto requeued = rt.requeue_task(root);
    REQUIRE(requeued);
    CHECK(requeued->state == task_state::pending);
    REQUIRE(claim_id(rt) == root);
    REQUIRE(rt.complete_task(root, "second try"));
    REQUIRE(resident_at_most(rt, 0));
    n = rt.count_tasks().value();
    CHECK(n.failed == 0);
    CHECK(n.completed == 3 * orchestrations + 1);
  }
  // A restart loads only unfinished orchestrations.
  runtime rt{durable(dir)};
  auto n = rt.count_tasks().value();
  CHECK(n.resident == 0);
  CHECK(n.orchestrations == orchestrations + 1);
  CHECK(n.completed == 3 * orchestrations + 1);
  CHECK(rt.list_orchestrations().value().size() == orchestrations + 1);
  CHECK(rt.orchestration_tree("0001").value().tasks.size() == 3);
  CHECK(rt.task(task_id{orchestrations + 1, {}}.to_string()).value().outcome
        == "second try");
  auto missing = rt.orchestration_tree(task_id{999, {}}.to_string());
  REQUIRE_FALSE(missing);
  CHECK(classify(missing.error()) == errc::not_found);
}

TEST_CASE("task storage: while orchestrations retire and come back, 8 "
          "threads claim, complete, fail, requeue and read them: no request "
          "fails and every tree ends completed") {
  test::test_store dir;
  runtime rt{durable(dir)};
  constexpr int threads = 8, per_thread = 12;
  std::atomic<int> failures{0}, failed_roots{0}, reads{0};
  std::mutex mx;
  std::vector<std::string> errors;
  auto note = [&](const std::string& what, const caf::error& err) {
    ++failures;
    std::lock_guard<std::mutex> guard{mx};
    if (errors.size() < 10)
      errors.push_back(what + ": " + describe(err));
  };
  std::vector<std::string> roots;
  for (int i = 0; i < threads * per_thread; ++i) {
    auto root = rt.create_orchestration("o").value();
    REQUIRE(rt.spawn_subtasks(root, {"a", "b"}));
    roots.push_back(root);
  }
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      std::mt19937 rng(static_cast<unsigned>(w));
      auto worker = "w" + std::to_string(w);
      int idle = 0;
      while (idle < 50) {
        // Reads of any orchestration, retired or not.
        auto& root = roots[rng() % roots.size()];
        if (auto t = rt.orchestration_tree(root); !t)
          note("tree " + root, t.error());
        else
          ++reads;
        auto got = rt.claim_task(worker);
        if (!got) {
          note("claim", got.error());
          continue;
        }
        if (!*got) {
          ++idle;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          continue;
        }
        idle = 0;
        auto id = (*got)->id;
        bool is_root = task_id::parse(id)->is_orchestration();
        if (is_root && rng() % 3 == 0) {
          // Finishes the orchestration failed: it retires, and the requeue
          // races with that.
          if (auto f = rt.fail_task(id, "boom"); !f)
            note("fail " + id, f.error());
          ++failed_roots;
          if (rng() % 2 == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 5));
          if (auto r = rt.requeue_task(id); !r)
            note("requeue " + id, r.error());
          continue;
        }
        if (auto c = rt.complete_task(id, "ok"); !c)
          note("complete " + id, c.error());
      }
    });
  for (auto& t : pool)
    t.join();
  INFO([&] {
    std::string all;
    for (auto& e : errors)
      all += e + "\n";
    return all;
  }());
  CHECK(failures == 0);
  CHECK(failed_roots > 0);
  CHECK(reads > 0);
  for (auto& root : roots) {
    auto tree = rt.orchestration_tree(root);
    REQUIRE(tree);
    REQUIRE(tree->tasks.size() == 3);
    for (auto& t : tree->tasks)
      CHECK(t.state == task_state::completed);
  }
  REQUIRE(resident_at_most(rt, 0));
  auto n = rt.count_tasks().value();
  CHECK(n.completed == 3 * roots.size());
  CHECK(n.orchestrations == roots.size());
}

// -- a store that refuses writes ---------------------------------------------------

TEST_CASE("task storage: a write the store refuses is an error, nothing of "
          "it is kept, and the orchestration goes on from what committed") {
  test::test_store dir;
  { runtime rt{durable(dir)}; } // creates the schema
  side_connection db{dir};
  runtime rt{durable(dir)};
  build_seed_tree(rt);
  REQUIRE(claim_id(rt, "alice") == "0001_t1.2");
  auto before = show(rt.orchestration_tree("0001").value());

  SECTION("a completion") {
    db.refuse("refuse_completion", "BEFORE UPDATE", "NEW.state = 2",
              "disk says no");
    auto done = rt.complete_task("0001_t1.2", "lost");
    REQUIRE_FALSE(done);
    CHECK(classify(done.error()) == errc::storage_failure);
    CHECK(describe(done.error()).find("disk says no") != std::string::npos);
    // Loaded again from what committed: still running by alice.
    REQUIRE(eventually([&] {
      auto tree = rt.orchestration_tree("0001");
      return tree && show(*tree) == before;
    }));
    db.allow("refuse_completion");
    REQUIRE(rt.complete_task("0001_t1.2", "kept").value().state
            == task_state::completed);
    CHECK(db.row("0001_t1.2") == "completed|kept|alice");
    CHECK(claim_id(rt) == "0001_t1.1");
  }
  SECTION("a spawn") {
    db.refuse("refuse_spawn", "BEFORE INSERT", "NEW.parent = '0001_t2'",
              "full");
    auto kids = rt.spawn_subtasks("0001_t2", {"x", "y"});
    REQUIRE_FALSE(kids);
    CHECK(classify(kids.error()) == errc::storage_failure);
    REQUIRE(eventually([&] {
      auto tree = rt.orchestration_tree("0001");
      return tree && show(*tree) == before;
    }));
    // 0001_t2 is executable again (it has no children after all).
    CHECK(rt.executable_tasks("0001").value()
          == std::vector<std::string>{"0001_t1.1", "0001_t2"});
    db.allow("refuse_spawn");
    auto again = rt.spawn_subtasks("0001_t2", {"x"});
    REQUIRE(again);
    CHECK(task_id::parse(again->front())->sequence() > 2); // never reused
  }
  SECTION("a claim") {
    db.refuse("refuse_claim", "BEFORE UPDATE", "NEW.state = 1", "busy");
    auto got = rt.claim_task("bob");
    REQUIRE_FALSE(got);
    CHECK(classify(got.error()) == errc::storage_failure);
    REQUIRE(eventually([&] {
      auto tree = rt.orchestration_tree("0001");
      return tree && show(*tree) == before;
    }));
    db.allow("refuse_claim");
    // The refused task is claimable again, in D1 order.
    CHECK(claim_id(rt, "bob") == "0001_t1.1");
  }
  SECTION("a new orchestration") {
    db.refuse("refuse_orchestration", "BEFORE INSERT", "NEW.parent = ''",
              "nope");
    auto orch = rt.create_orchestration("x");
    REQUIRE_FALSE(orch);
    CHECK(classify(orch.error()) == errc::storage_failure);
    CHECK(classify(rt.orchestration_tree("0003").error()) == errc::not_found);
    db.allow("refuse_orchestration");
    CHECK(*hybrid36::parse(rt.create_orchestration("y").value()) > 3);
  }
}

TEST_CASE("task storage: stored rows this build cannot read stop the start "
          "with a clear error") {
  test::test_store dir;
  {
    runtime rt{durable(dir)};
    build_seed_tree(rt);
  }
  side_connection db{dir};
  std::string expected;
  SECTION("an unknown state") {
    db.exec("UPDATE tasks SET state = 9 WHERE id = '0001_t2';");
    expected = "task 0001_t2 in a state 9";
  }
  SECTION("a task whose parent is not stored") {
    db.exec("DELETE FROM tasks WHERE id = '0001_t1';");
    expected = "task 0001_t1.1 whose parent 0001_t1 is not stored";
  }
  SECTION("an ID that does not parse") {
    db.exec("INSERT INTO tasks(id, orchestration, parent, state, payload) "
            "VALUES('0001_t../x', '0001', '0001', 0, '');");
    expected = "0001_t../x";
  }
  auto rt = runtime::start(durable(dir));
  REQUIRE_FALSE(rt);
  CHECK(classify(rt.error()) == errc::storage_failure);
  INFO(describe(rt.error()));
  CHECK(describe(rt.error()).find("stored orchestrations cannot be loaded")
        != std::string::npos);
  CHECK(describe(rt.error()).find(expected) != std::string::npos);
  CHECK_THROWS_AS(runtime{durable(dir)}, startup_error);
}

TEST_CASE("task storage: in memory nothing is stored and counts still work") {
  runtime rt;
  CHECK_FALSE(rt.state_store());
  build_seed_tree(rt);
  REQUIRE(claim_id(rt) == "0001_t1.2");
  auto counts = rt.count_tasks().value();
  CHECK(counts.pending == 5);
  CHECK(counts.running == 1);
  CHECK(counts.orchestrations == 2);
}

// -- the row mapping -----------------------------------------------------------------

TEST_CASE("task records: rows decode into orchestrations by value with "
          "their tasks in preorder") {
  auto row = [](std::string id, task_state s, std::string payload) {
    return std::vector<sql_value>{
      sql_value::of(std::move(id)), sql_value::of(static_cast<int64_t>(s)),
      sql_value::of(std::move(payload)), sql_value::of(std::string{}),
      sql_value::of(std::string{}), sql_value::of(int64_t{0}),
      sql_value::of(int64_t{1}), sql_value::of(int64_t{0}),
      sql_value::of(int64_t{0})};
  };
  // Stored order is by string: 0001_t10 before 0001_t9, A000 before 9999.
  sql_rows rows{row("A000", task_state::pending, "a"),
                row("0001_t10", task_state::completed, "t10"),
                row("9999", task_state::pending, "z"),
                row("0001", task_state::pending, "o"),
                row("0001_t9", task_state::pending, "t9"),
                row("0001_t9.1", task_state::completed, "t9.1")};
  auto decoded = records::decode_tasks(rows);
  REQUIRE(decoded);
  REQUIRE(decoded->size() == 3);
  CHECK((*decoded)[0].root.to_string() == "0001");
  CHECK((*decoded)[1].root.to_string() == "9999");
  CHECK((*decoded)[2].root.to_string() == "A000");
  std::vector<std::string> ids;
  for (auto& t : (*decoded)[0].tasks)
    ids.push_back(t.id.to_string());
  CHECK(ids
        == std::vector<std::string>{"0001", "0001_t9", "0001_t9.1",
                                    "0001_t10"});
  auto ready = records::executable_tasks((*decoded)[0], 0);
  REQUIRE(ready.size() == 1);
  CHECK(ready.front().to_string() == "0001_t9");
  auto counts = records::count_states((*decoded)[0]);
  CHECK(counts.pending == 2);
  CHECK(counts.completed == 2);
}
