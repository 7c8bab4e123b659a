// Workers that claim and complete tasks through the facade: one
// orchestration with a tree of subtasks, several worker threads claiming
// under leases until the tree is done. A task is executable only when its
// children are complete (deepest leaf first, docs/orchestration.md), so
// every task here is completed after all of its children.
//
// Build and run: see docs/examples/README.md.

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spindle/runtime/runtime.hpp>

using namespace std::chrono_literals;

int main() {
  spindle::runtime_options opts; // in memory; set opts.storage to persist
  auto started = spindle::runtime::start(opts);
  if (!started) {
    std::cerr << "cannot start: " << spindle::describe(started.error()) << "\n";
    return 1;
  }
  spindle::runtime& rt = **started;

  // The orchestration: a root, 4 children, each with 3 children of its own.
  auto root = rt.create_orchestration("write the report");
  if (!root) {
    std::cerr << spindle::describe(root.error()) << "\n";
    return 1;
  }
  size_t total = 1;
  auto sections = rt.spawn_subtasks(
    *root, {"introduction", "method", "results", "discussion"});
  if (!sections)
    return 1;
  total += sections->size();
  for (const auto& section : *sections) {
    auto steps = rt.spawn_subtasks(section, {"draft", "check", "edit"});
    if (!steps)
      return 1;
    total += steps->size();
  }

  std::mutex mx;
  std::map<std::string, int> completed_at; // task -> completion order
  int order = 0;
  bool failed = false;

  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&, w] {
      std::string name = "worker-" + std::to_string(w);
      for (;;) {
        // Claim under a 30 s lease, waiting up to 200 ms for a task to
        // become executable; a worker that dies loses its lease and the
        // task returns to pending.
        auto claim = rt.claim_task(name, 30s, 200ms);
        if (!claim) {
          std::lock_guard<std::mutex> guard{mx};
          failed = true;
          return;
        }
        if (!claim->claimed) {
          std::lock_guard<std::mutex> guard{mx};
          if (completed_at.size() == total)
            return;
          continue;
        }
        const auto& task = claim->task;
        auto done = rt.complete_task(task.id, "done: " + task.payload,
                                     claim->lease);
        std::lock_guard<std::mutex> guard{mx};
        if (!done)
          failed = true;
        else
          completed_at[task.id] = order++;
      }
    });
  }
  for (auto& worker : workers)
    worker.join();

  if (failed || completed_at.size() != total) {
    std::cerr << "worker: " << completed_at.size() << " of " << total
              << " tasks completed\n";
    return 1;
  }
  // Every task completed after each of its children.
  for (const auto& [id, at] : completed_at) {
    auto info = rt.task(id);
    if (!info || info->state != spindle::task_state::completed)
      return 1;
    for (const auto& child : info->children)
      if (completed_at.at(child) > at) {
        std::cerr << id << " completed before its child " << child << "\n";
        return 1;
      }
  }
  std::cout << "worker: " << total
            << " tasks completed by 3 workers, every parent after its "
               "children\n";
  rt.stop();
  return EXIT_SUCCESS;
}
