// Orchestration in the runtime: the scheduler and its orchestrators through
// the facade. D1's orders on the seed's tree, a property test on random
// trees, concurrent claimers, tier boundaries of orchestration IDs, stale
// workers (actors and processes, PID reuse) and the errors a caller causes.

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;

namespace {

// The seed's tree: 0001 with t1{t1.1, t1.2} and t2, plus 0002.
void build_seed_tree(runtime& rt) {
  REQUIRE(rt.create_orchestration("orchestration 1").value() == "0001");
  REQUIRE(rt.spawn_subtask("0001", "t1").value() == "0001_t1");
  REQUIRE(rt.spawn_subtask("0001", "t2").value() == "0001_t2");
  REQUIRE(rt.spawn_subtask("0001_t1", "t1.1").value() == "0001_t1.1");
  REQUIRE(rt.spawn_subtask("0001_t1", "t1.2").value() == "0001_t1.2");
  REQUIRE(rt.create_orchestration("orchestration 2").value() == "0002");
}

std::string claim_id(runtime& rt, const std::string& worker = "w") {
  auto got = rt.claim_task(worker);
  REQUIRE(got);
  REQUIRE(got->has_value());
  return (*got)->id;
}

task_state state_of(runtime& rt, const std::string& id) {
  auto info = rt.task(id);
  REQUIRE(info);
  return info->state;
}

// Polls until `pred` holds or five seconds pass: the effect under test
// (a down message) is asynchronous by nature.
template <class Pred>
bool eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

} // namespace

TEST_CASE("scheduler: D1 order with a completion between claims is "
          "t1.2, t1.1, t2, t1, 0002, 0001") {
  runtime rt;
  build_seed_tree(rt);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    auto id = claim_id(rt);
    order.push_back(id);
    REQUIRE(rt.complete_task(id, "done " + id));
  }
  CHECK(order
        == std::vector<std::string>{"0001_t1.2", "0001_t1.1", "0001_t2",
                                    "0001_t1", "0002", "0001"});
  auto none = rt.claim_task("w");
  REQUIRE(none);
  CHECK_FALSE(none->has_value());
}

TEST_CASE("scheduler: D1 order with four claims before any completion is "
          "t1.2, t1.1, t2, 0002") {
  runtime rt;
  build_seed_tree(rt);
  CHECK(rt.executable_tasks().value()
        == std::vector<std::string>{"0001_t1.2", "0001_t1.1", "0001_t2",
                                    "0002"});
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i)
    order.push_back(claim_id(rt));
  CHECK(order
        == std::vector<std::string>{"0001_t1.2", "0001_t1.1", "0001_t2",
                                    "0002"});
  // 0001_t1 and 0001 wait for their running children.
  auto none = rt.claim_task("w");
  REQUIRE(none);
  CHECK_FALSE(none->has_value());
  CHECK(rt.executable_tasks().value().empty());
}

TEST_CASE("scheduler: the tree query shows every task with its state, "
          "payload, outcome, worker and children in preorder by value") {
  runtime rt;
  build_seed_tree(rt);
  REQUIRE(claim_id(rt, "alice") == "0001_t1.2");
  REQUIRE(rt.complete_task("0001_t1.2", "result 1.2"));
  REQUIRE(claim_id(rt, "bob") == "0001_t1.1");
  auto tree = rt.orchestration_tree("0001");
  REQUIRE(tree);
  CHECK(tree->orchestration == "0001");
  std::vector<std::string> ids;
  for (auto& t : tree->tasks)
    ids.push_back(t.id);
  CHECK(ids
        == std::vector<std::string>{"0001", "0001_t1", "0001_t1.1",
                                    "0001_t1.2", "0001_t2"});
  auto& root = tree->tasks[0];
  CHECK(root.parent.empty());
  CHECK(root.payload == "orchestration 1");
  CHECK(root.state == task_state::pending);
  CHECK(root.incomplete_children == 2);
  CHECK(root.children == std::vector<std::string>{"0001_t1", "0001_t2"});
  auto& t1 = tree->tasks[1];
  CHECK(t1.parent == "0001");
  CHECK(t1.incomplete_children == 1);
  auto& t11 = tree->tasks[2];
  CHECK(t11.state == task_state::running);
  CHECK(t11.worker == "bob");
  auto& t12 = tree->tasks[3];
  CHECK(t12.state == task_state::completed);
  CHECK(t12.outcome == "result 1.2");
  CHECK(t12.worker == "alice");
  CHECK(to_string(task_state::stale) == "stale");
  CHECK(rt.executable_tasks("0001").value()
        == std::vector<std::string>{"0001_t2"});
  CHECK(rt.executable_tasks("0002").value()
        == std::vector<std::string>{"0002"});
  CHECK(rt.executable_tasks("", 1).value()
        == std::vector<std::string>{"0001_t2"});
}

TEST_CASE("scheduler: sequence and ID compare by value: t10 before t9, "
          "A000 after 9999") {
  runtime rt;
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  std::vector<std::string> payloads(10, "x");
  auto kids = rt.spawn_subtasks("0001", payloads);
  REQUIRE(kids);
  REQUIRE(kids->back() == "0001_t10");
  auto exec = rt.executable_tasks("0001").value();
  REQUIRE(exec.size() == 10);
  CHECK(exec.front() == "0001_t10");
  CHECK(exec[1] == "0001_t9");
  CHECK(exec.back() == "0001_t1");
  // Depth first, then own sequence: 0001_t1.2 (seq 2) before 0001_t10.1.
  REQUIRE(rt.spawn_subtask("0001_t10", "a").value() == "0001_t10.1");
  REQUIRE(rt.spawn_subtasks("0001_t1", {"a", "b"}).value().back()
          == "0001_t1.2");
  CHECK(rt.executable_tasks("", 3).value()
        == std::vector<std::string>{"0001_t1.2", "0001_t10.1", "0001_t1.1"});
  CHECK(claimed_before(*task_id::parse("0001_t1.2"),
                       *task_id::parse("0001_t10.1")));
  // Same depth and sequence: the larger ID path first.
  CHECK(claimed_before(*task_id::parse("A000"), *task_id::parse("9999")));
  CHECK(claimed_before(*task_id::parse("9999_t1"), *task_id::parse("0001_t1")));
  CHECK(claimed_before(*task_id::parse("A000_t1"), *task_id::parse("9999_t1")));
}

TEST_CASE("scheduler: orchestration IDs cross tier boundaries: 9998, 9999, "
          "A000, A001") {
  runtime rt;
  auto next = rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                                advance_atom::value, std::string{"global"},
                                uint64_t{9997});
  REQUIRE(next);
  REQUIRE(*next == 9998);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i)
    ids.push_back(rt.create_orchestration("o").value());
  CHECK(ids == std::vector<std::string>{"9998", "9999", "A000", "A001"});
  CHECK(rt.spawn_subtask("A000", "t").value() == "A000_t1");
  // A001 is a larger sequence than 9999 at depth 0: it is claimed first.
  CHECK(rt.executable_tasks().value()
        == std::vector<std::string>{"A000_t1", "A001", "9999", "9998"});
  CHECK(rt.orchestration_tree("A000").value().tasks.size() == 2);
}

TEST_CASE("scheduler: property: on random trees every claim is the first "
          "executable task by the D1 key and never a task with an "
          "incomplete child") {
  struct model_task {
    task_state state = task_state::pending;
    std::vector<task_id> children;
  };
  for (unsigned seed = 1; seed <= 12; ++seed) {
    DYNAMIC_SECTION("seed " << seed) {
      std::mt19937 rng{seed};
      runtime rt;
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
      auto executable = [&](const model_task& t) {
        if (t.state != task_state::pending)
          return false;
        for (auto& c : t.children)
          if (model[c].state != task_state::completed)
            return false;
        return true;
      };
      auto expected_order = [&] {
        std::vector<task_id> xs;
        for (auto& [id, t] : model)
          if (executable(t))
            xs.push_back(id);
        std::sort(xs.begin(), xs.end(), claimed_before);
        std::vector<std::string> out;
        for (auto& x : xs)
          out.push_back(x.to_string());
        return out;
      };
      auto spawn = [&](const task_id& parent) {
        auto id = rt.spawn_subtask(parent.to_string(), "p");
        REQUIRE(id);
        auto parsed = *task_id::parse(*id);
        REQUIRE(parsed.parent() == parent);
        model[parsed];
        model[parent].children.push_back(parsed);
      };
      auto orchestrate = [&] {
        auto id = rt.create_orchestration("o");
        REQUIRE(id);
        model[*task_id::parse(*id)];
      };
      for (int i = 0; i < 3; ++i)
        orchestrate();
      for (int i = 0; i < 40; ++i)
        spawn(*pick([](const task_id& id, const model_task&) {
          return id.depth() < 4;
        }));
      size_t claims = 0;
      for (int step = 0; step < 400; ++step) {
        auto dice = std::uniform_int_distribution<int>(0, 99)(rng);
        if (dice < 40) {
          auto want = expected_order();
          auto got = rt.claim_task("w" + std::to_string(step % 3));
          REQUIRE(got);
          if (want.empty()) {
            REQUIRE_FALSE(got->has_value());
            continue;
          }
          REQUIRE(got->has_value());
          REQUIRE((*got)->id == want.front());
          REQUIRE((*got)->incomplete_children == 0);
          auto id = *task_id::parse((*got)->id);
          for (auto& c : model[id].children)
            REQUIRE(model[c].state == task_state::completed);
          model[id].state = task_state::running;
          ++claims;
        } else if (dice < 75) {
          auto id = pick([](const task_id&, const model_task& t) {
            return t.state == task_state::running;
          });
          if (!id)
            continue;
          if (dice < 70) {
            REQUIRE(rt.complete_task(id->to_string(), "r"));
            model[*id].state = task_state::completed;
          } else {
            REQUIRE(rt.fail_task(id->to_string(), "boom"));
            model[*id].state = task_state::failed;
          }
        } else if (dice < 82) {
          auto id = pick([](const task_id&, const model_task& t) {
            return t.state == task_state::failed;
          });
          if (!id)
            continue;
          REQUIRE(rt.requeue_task(id->to_string()));
          model[*id].state = task_state::pending;
        } else if (dice < 97) {
          auto parent = pick([](const task_id& id, const model_task& t) {
            return id.depth() < 5 && t.state != task_state::completed;
          });
          if (parent)
            spawn(*parent);
        } else {
          orchestrate();
        }
        REQUIRE(rt.executable_tasks().value() == expected_order());
      }
      CHECK(claims > 50);
      // Every state in the runtime matches the model.
      for (auto& [id, t] : model)
        REQUIRE(state_of(rt, id.to_string()) == t.state);
    }
  }
}

TEST_CASE("scheduler: concurrent claimers through the facade claim every "
          "task exactly once and a parent only after its children") {
  for (size_t threads : {1, 2, 4, 8, 16}) {
    DYNAMIC_SECTION(threads << " claimer threads") {
      runtime rt;
      // 3 orchestrations x 6 tasks x 5 subtasks x 3 sub-subtasks.
      std::vector<std::string> all;
      auto spawn = [&](const std::string& parent, size_t n) {
        auto ids = rt.spawn_subtasks(parent, std::vector<std::string>(n, "p"));
        REQUIRE(ids);
        all.insert(all.end(), ids->begin(), ids->end());
        return std::move(*ids);
      };
      for (int o = 0; o < 3; ++o) {
        auto orch = rt.create_orchestration("o").value();
        all.push_back(orch);
        for (auto& t : spawn(orch, 6))
          for (auto& s : spawn(t, 5))
            spawn(s, 3);
      }
      std::atomic<uint64_t> clock{0};
      std::atomic<size_t> completed{0};
      std::atomic<size_t> errors{0};
      std::mutex mtx;
      std::map<std::string, int> claimed_count;
      std::map<std::string, uint64_t> claim_stamp, complete_stamp;
      std::vector<std::thread> workers;
      for (size_t t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
          auto name = "worker-" + std::to_string(t);
          while (completed.load() < all.size()) {
            auto got = rt.claim_task(name);
            if (!got) {
              ++errors;
              return;
            }
            if (!got->has_value()) {
              std::this_thread::yield();
              continue;
            }
            auto id = (*got)->id;
            auto claimed_at = ++clock;
            {
              std::lock_guard<std::mutex> guard{mtx};
              ++claimed_count[id];
              claim_stamp[id] = claimed_at;
              complete_stamp[id] = ++clock; // before the completion starts
            }
            if (!rt.complete_task(id, "ok"))
              ++errors;
            ++completed;
          }
        });
      for (auto& w : workers)
        w.join();
      REQUIRE(errors == 0);
      REQUIRE(claimed_count.size() == all.size());
      for (auto& id : all) {
        REQUIRE(claimed_count[id] == 1);
        if (auto parent = task_id::parse(id)->parent())
          REQUIRE(complete_stamp[id] < claim_stamp[parent->to_string()]);
      }
    }
  }
}

TEST_CASE("scheduler: concurrent async claims hand out each task once") {
  runtime rt;
  auto orch = rt.create_orchestration("o").value();
  auto kids = rt.spawn_subtasks(orch, std::vector<std::string>(200, "t"));
  REQUIRE(kids);
  std::vector<std::promise<caf::expected<std::optional<task_info>>>> promises(
    210);
  for (auto& p : promises)
    rt.claim_task_async("async", [&p](caf::expected<std::optional<task_info>> x) {
      p.set_value(std::move(x));
    });
  std::set<std::string> ids;
  size_t none = 0;
  for (auto& p : promises) {
    auto x = p.get_future().get();
    REQUIRE(x);
    if (x->has_value())
      REQUIRE(ids.insert((*x)->id).second);
    else
      ++none;
  }
  CHECK(ids.size() == 200);
  CHECK(none == 10);
}

TEST_CASE("scheduler: a subtask spawned under a running task runs before "
          "the parent can complete its own work - a completed parent takes "
          "no subtasks") {
  runtime rt;
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  REQUIRE(claim_id(rt) == "0001");
  auto kid = rt.spawn_subtask("0001", "planned while running");
  REQUIRE(kid);
  CHECK(state_of(rt, "0001") == task_state::running);
  REQUIRE(claim_id(rt) == "0001_t1");
  REQUIRE(rt.complete_task("0001_t1", "r"));
  REQUIRE(rt.complete_task("0001", "r"));
  auto refused = rt.spawn_subtask("0001", "late");
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == errc::conflict);
  CHECK(rt.orchestration_tree("0001").value().tasks.size() == 2);
}

TEST_CASE("scheduler: a failed child blocks its parent until it is "
          "re-queued and completed") {
  runtime rt;
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  REQUIRE(rt.spawn_subtask("0001", "t").value() == "0001_t1");
  REQUIRE(claim_id(rt) == "0001_t1");
  auto failed = rt.fail_task("0001_t1", "disk full");
  REQUIRE(failed);
  CHECK(failed->state == task_state::failed);
  CHECK(failed->outcome == "disk full");
  CHECK_FALSE(rt.claim_task("w").value().has_value());
  auto again = rt.requeue_task("0001_t1");
  REQUIRE(again);
  CHECK(again->state == task_state::pending);
  REQUIRE(claim_id(rt) == "0001_t1");
  REQUIRE(rt.complete_task("0001_t1", "ok"));
  CHECK(claim_id(rt) == "0001");
}

TEST_CASE("scheduler: a worker actor that dies mid-task leaves its task "
          "stale, and a re-queued stale task runs again") {
  runtime rt;
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  REQUIRE(rt.spawn_subtasks("0001", {"a", "b"}));
  auto worker = rt.system().spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int32_t x) { return x; }};
  });
  REQUIRE(rt.attach_worker("actor-worker", worker.address()));
  REQUIRE(claim_id(rt, "actor-worker") == "0001_t2");
  REQUIRE(claim_id(rt, "someone-else") == "0001_t1");
  caf::anon_send_exit(worker, caf::exit_reason::kill);
  REQUIRE(eventually(
    [&] { return state_of(rt, "0001_t2") == task_state::stale; }));
  CHECK(state_of(rt, "0001_t1") == task_state::running);
  // Stale blocks the parent like any incomplete child.
  CHECK_FALSE(rt.claim_task("w").value().has_value());
  REQUIRE(rt.requeue_task("0001_t2").value().state == task_state::pending);
  // A claim made in the dead worker's name does not leave the task running
  // for nobody.
  REQUIRE(claim_id(rt, "actor-worker") == "0001_t2");
  REQUIRE(eventually(
    [&] { return state_of(rt, "0001_t2") == task_state::stale; }));
  REQUIRE(rt.requeue_task("0001_t2"));
  REQUIRE(claim_id(rt, "w") == "0001_t2");
  REQUIRE(rt.complete_task("0001_t2", "ok"));
  REQUIRE(rt.complete_task("0001_t1", "ok"));
  CHECK(claim_id(rt, "w") == "0001");
}

TEST_CASE("scheduler: a kill -9'd process worker's tasks become stale on "
          "detection, a live one's do not") {
  runtime rt;
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  REQUIRE(rt.spawn_subtasks("0001", {"a", "b"}));
  test::child doomed{{"sleep", "30"}};
  test::child alive{{"sleep", "30"}};
  auto doomed_id = identify(doomed.pid());
  auto alive_id = identify(alive.pid());
  REQUIRE(doomed_id);
  REQUIRE(alive_id);
  REQUIRE(rt.attach_worker("doomed", *doomed_id));
  REQUIRE(rt.attach_worker("alive", *alive_id));
  REQUIRE(claim_id(rt, "doomed") == "0001_t2");
  REQUIRE(claim_id(rt, "alive") == "0001_t1");
  CHECK(rt.detect_stale_tasks().value().empty());
  doomed.kill(SIGKILL);
  doomed.wait();
  CHECK(rt.detect_stale_tasks().value()
        == std::vector<std::string>{"0001_t2"});
  CHECK(state_of(rt, "0001_t2") == task_state::stale);
  CHECK(state_of(rt, "0001_t1") == task_state::running);
  // Nothing is found twice.
  CHECK(rt.detect_stale_tasks().value().empty());
}

TEST_CASE("scheduler: a worker whose PID now belongs to another process "
          "(same PID, other start time) is stale") {
  runtime rt;
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  auto me = self_identity();
  REQUIRE(me.start_time > 0);
  process_identity impostor{me.pid, me.start_time + 1};
  REQUIRE(rt.attach_worker("reused", impostor));
  REQUIRE(claim_id(rt, "reused") == "0001");
  CHECK(rt.detect_stale_tasks().value() == std::vector<std::string>{"0001"});
  CHECK(state_of(rt, "0001") == task_state::stale);
}

TEST_CASE("scheduler: a late completion beats the news of the worker's "
          "death - marking stale touches only running tasks") {
  runtime rt;
  REQUIRE(rt.create_orchestration("o").value() == "0001");
  REQUIRE(claim_id(rt, "w1") == "0001");
  REQUIRE(rt.complete_task("0001", "done"));
  CHECK(rt.mark_worker_stale("w1").value().empty());
  CHECK(state_of(rt, "0001") == task_state::completed);
}

TEST_CASE("scheduler: bad input is refused with a clear error and changes "
          "nothing") {
  runtime rt;
  build_seed_tree(rt);
  auto before = rt.orchestration_tree("0001").value();
  auto code = [](const auto& x) { return classify(x.error()); };
  for (std::string bad : {"../x", "", "0000", "0001_t0", "0001/t1", "01",
                          "0001_t1..1", "0001_t01"}) {
    INFO("id '" << bad << "'");
    auto s = rt.spawn_subtask(bad, "x");
    REQUIRE_FALSE(s);
    CHECK(code(s) == errc::invalid_id);
    CHECK(code(rt.complete_task(bad, "x")) == errc::invalid_id);
    CHECK(code(rt.fail_task(bad, "x")) == errc::invalid_id);
    CHECK(code(rt.requeue_task(bad)) == errc::invalid_id);
    CHECK(code(rt.task(bad)) == errc::invalid_id);
    CHECK(code(rt.orchestration_tree(bad)) == errc::invalid_id);
  }
  CHECK(describe(rt.task("../x").error()).find("../x") != std::string::npos);
  CHECK(code(rt.orchestration_tree("0001_t1")) == errc::invalid_id);
  CHECK(code(rt.executable_tasks("0001_t1")) == errc::invalid_id);
  CHECK(code(rt.spawn_subtask("0009", "x")) == errc::not_found);
  CHECK(code(rt.spawn_subtask("0001_t7", "x")) == errc::not_found);
  CHECK(code(rt.spawn_subtasks("0001", {})) == errc::invalid_argument);
  CHECK(code(rt.complete_task("0001_t2", "x")) == errc::conflict);
  CHECK(code(rt.fail_task("0001_t2", "x")) == errc::conflict);
  CHECK(code(rt.requeue_task("0001_t2")) == errc::conflict);
  for (std::string worker : {std::string{}, std::string{"has space"},
                             std::string(129, 'w'), std::string{"nl\n"}}) {
    CHECK(code(rt.claim_task(worker)) == errc::invalid_argument);
    CHECK(code(rt.attach_worker(worker, self_identity()))
          == errc::invalid_argument);
  }
  CHECK(code(rt.attach_worker("w", process_identity{0, 0}))
        == errc::invalid_argument);
  auto after = rt.orchestration_tree("0001").value();
  REQUIRE(after.tasks.size() == before.tasks.size());
  for (size_t i = 0; i < after.tasks.size(); ++i) {
    CHECK(after.tasks[i].id == before.tasks[i].id);
    CHECK(after.tasks[i].state == before.tasks[i].state);
  }
  CHECK(rt.executable_tasks().value().size() == 4);
}

TEST_CASE("scheduler: calls after stop fail with unavailable") {
  runtime rt;
  rt.stop();
  CHECK(classify(rt.create_orchestration("o").error()) == errc::unavailable);
  CHECK(classify(rt.claim_task("w").error()) == errc::unavailable);
}
