// `spindle demo`: a short tour of the runtime for a fresh checkout.

#include <iostream>
#include <set>
#include <thread>

#include "cli.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::cli {

void add_demo(CLI::App& app, registry& commands) {
  auto* sub = app.add_subcommand(
    "demo", "Start an in-memory runtime, allocate IDs from several threads "
            "at once and show that none repeats.");
  auto threads = std::make_shared<size_t>(4);
  auto per_thread = std::make_shared<size_t>(1000);
  sub->add_option("--threads", *threads, "client threads")
    ->check(CLI::Range(1, 64));
  sub->add_option("--per-thread", *per_thread, "IDs each thread asks for")
    ->check(CLI::Range(1, 1000000));
  commands.on(sub, [threads, per_thread] {
    spindle::runtime rt;
    std::cout << "spindle runtime started (in memory)\n";
    std::vector<std::vector<std::string>> got(*threads);
    std::vector<std::thread> workers;
    for (size_t t = 0; t < *threads; ++t)
      workers.emplace_back([&, t] {
        for (size_t i = 0; i < *per_thread; ++i)
          if (auto id = rt.next_context_id())
            got[t].push_back(*id);
      });
    for (auto& w : workers)
      w.join();
    std::set<std::string> unique;
    size_t total = 0;
    for (auto& ids : got) {
      total += ids.size();
      unique.insert(ids.begin(), ids.end());
    }
    std::cout << *threads << " threads asked for " << total
              << " context IDs: " << unique.size() << " distinct\n";
    auto orch = rt.next_orchestration_id();
    auto task = orch ? rt.next_task_id(*orch) : orch;
    auto sub_task = task ? rt.next_task_id(*task) : task;
    if (!sub_task) {
      std::cerr << "error: " << describe(sub_task.error()) << "\n";
      return int{exit_code::failure};
    }
    std::cout << "orchestration " << *orch << ", task " << *task
              << ", subtask " << *sub_task << "\n";
    return unique.size() == total ? int{exit_code::ok}
                                  : int{exit_code::failure};
  });
}

} // namespace spindle::cli
