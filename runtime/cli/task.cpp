// `spindle task ...`: the seed's task directories (ROOT/ai_comms/{agent}/
// tasks/{to_execute,in_progress,completed,stale}) for scripts that run no
// server. The protocol lives in the library (runtime/task_files.hpp).

#include <iostream>
#include <iterator>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "cli.hpp"
#include "spindle/messages/error.hpp"
#include "files/file_counter.hpp"
#include "files/task_files.hpp"

namespace spindle::cli {

namespace {

struct task_args {
  std::string agent;
  std::string root;
  std::string parent;
  std::string id;
  long worker_pid = 0;
  bool json = false;
};

// Prints `err` for subcommand `what` and picks the exit code: input errors
// are usage errors (nothing was touched), everything else a failure.
int report(const std::string& what, const caf::error& err) {
  std::cerr << "spindle task " << what << ": " << describe(err) << "\n";
  auto code = classify(err);
  return code == errc::invalid_id || code == errc::invalid_argument
           ? exit_code::usage
           : exit_code::failure;
}

// Validates the root and agent (D10) before anything touches the disk.
caf::expected<task_files> open_files(const task_args& args) {
  std::filesystem::path root = args.root.empty() ? default_root()
                                                 : std::filesystem::path{
                                                     args.root};
  struct stat st{};
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return make_error(errc::invalid_argument,
                      "--root: '" + root.string() + "' is not a directory");
  return task_files::open(root, args.agent);
}

caf::expected<task_id> parse_id(const std::string& text) {
  return task_id::parse(text); // its error names the value and the grammar
}

int task_queue(const task_args& args) {
  auto files = open_files(args);
  if (!files)
    return report("queue", files.error());
  std::optional<task_id> parent;
  if (!args.parent.empty()) {
    auto id = parse_id(args.parent);
    if (!id)
      return report("queue", id.error());
    parent = std::move(*id);
  }
  std::string body{std::istreambuf_iterator<char>{std::cin},
                   std::istreambuf_iterator<char>{}};
  auto id = files->queue(body, parent);
  if (!id)
    return report("queue", id.error());
  std::cout << id->to_string() << "\n" << std::flush;
  return exit_code::ok;
}

int task_next(const task_args& args) {
  auto files = open_files(args);
  if (!files)
    return report("next", files.error());
  // The worker is whoever runs this command (spindle itself exits at
  // once), unless the caller names another process.
  auto pid = args.worker_pid > 0 ? static_cast<pid_t>(args.worker_pid)
                                 : ::getppid();
  auto worker = identify(pid);
  if (!worker)
    return report("next", make_error(errc::invalid_argument,
                                     "--worker-pid: no process "
                                       + std::to_string(pid) + " is running"));
  auto claimed = files->claim_next(*worker);
  if (!claimed)
    return report("next", claimed.error());
  if (!*claimed)
    return exit_code::nothing;
  std::cout << (*claimed)->id.to_string() << "\n"
            << (*claimed)->file.string() << "\n"
            << std::flush;
  return exit_code::ok;
}

int task_complete(const task_args& args) {
  auto files = open_files(args);
  if (!files)
    return report("complete", files.error());
  auto id = parse_id(args.id);
  if (!id)
    return report("complete", id.error());
  if (auto err = files->complete(*id))
    return report("complete", err);
  return exit_code::ok;
}

int task_requeue(const task_args& args) {
  auto files = open_files(args);
  if (!files)
    return report("requeue", files.error());
  auto id = parse_id(args.id);
  if (!id)
    return report("requeue", id.error());
  if (auto err = files->requeue(*id))
    return report("requeue", err);
  return exit_code::ok;
}

int task_stale(const task_args& args) {
  auto files = open_files(args);
  if (!files)
    return report("stale", files.error());
  auto moved = files->detect_stale();
  if (!moved)
    return report("stale", moved.error());
  for (auto& t : *moved) {
    std::cout << t.id.to_string() << "\n";
    std::cerr << "STALE: " << t.id.to_string() << " (" << t.reason << ")\n";
  }
  std::cout << std::flush;
  return exit_code::ok;
}

int task_list(const task_args& args) {
  auto files = open_files(args);
  if (!files)
    return report("list", files.error());
  auto tasks = files->list();
  if (!tasks)
    return report("list", tasks.error());
  if (args.json) {
    std::cout << to_json(*tasks) << "\n";
    return exit_code::ok;
  }
  for (auto& t : *tasks) {
    std::string line(2 * t.id.depth(), ' ');
    line += t.id.to_string();
    line.resize(std::max<size_t>(line.size() + 2, 28), ' ');
    line += state_name(t.where);
    if (t.executable)
      line += " (executable)";
    else if (t.incomplete_children > 0)
      line += " (waits for " + std::to_string(t.incomplete_children)
              + " of " + std::to_string(t.children) + " children)";
    if (t.owner)
      line += " pid " + std::to_string(t.owner->pid);
    std::cout << line << "\n";
  }
  std::cout << std::flush;
  return exit_code::ok;
}

void common_options(CLI::App* sub, task_args& args) {
  sub->add_option("--agent", args.agent, "agent whose task directories to "
                                         "use (ROOT/ai_comms/AGENT/tasks)")
    ->required();
  sub->add_option("--root", args.root,
                  "root directory holding ai_comms/ (default $AI_ROOT, else "
                  "the current directory)");
}

} // namespace

void add_task(CLI::App& app, registry& commands) {
  auto* task = app.add_subcommand(
    "task", "Queue, claim and finish tasks in the seed's directories "
            "(ROOT/ai_comms/AGENT/tasks/{to_execute,in_progress,completed,"
            "stale}), deepest leaves first (D1).");
  task->require_subcommand(1);
  auto args = std::make_shared<task_args>();

  auto* queue = task->add_subcommand(
    "queue", "Read a task body from stdin, claim its ID from the file "
             "counters (global, or under --parent) and write it to "
             "to_execute/ID/ID.md. Prints the ID.");
  common_options(queue, *args);
  queue->add_option("--parent", args->parent,
                    "queue a subtask of this task ID");
  commands.on(queue, [args] { return task_queue(*args); });

  auto* next = task->add_subcommand(
    "next", "Claim the next executable task (deepest first, D1) by moving "
            "it to in_progress/ID/ID.PID.md, with ID.owner holding PID:START. "
            "Prints the ID and the task file's path, one per line; exits 3 "
            "when nothing is executable.");
  common_options(next, *args);
  next->add_option("--worker-pid", args->worker_pid,
                   "the worker process (default: the caller, spindle's "
                   "parent process)")
    ->check(CLI::Range(1L, 4194304L));
  commands.on(next, [args] { return task_next(*args); });

  auto* complete = task->add_subcommand(
    "complete", "Move an in-progress task to completed/.");
  complete->add_option("ID", args->id, "task ID")->required();
  common_options(complete, *args);
  commands.on(complete, [args] { return task_complete(*args); });

  auto* stale = task->add_subcommand(
    "stale", "Move in-progress tasks whose worker is gone (PID dead, or "
             "reused by another process per its start time) to stale/. "
             "Prints their IDs.");
  common_options(stale, *args);
  commands.on(stale, [args] { return task_stale(*args); });

  auto* requeue = task->add_subcommand(
    "requeue", "Move a stale task back to to_execute/.");
  requeue->add_option("ID", args->id, "task ID")->required();
  common_options(requeue, *args);
  commands.on(requeue, [args] { return task_requeue(*args); });

  auto* list = task->add_subcommand(
    "list", "Show the agent's tasks as a tree with their states.");
  common_options(list, *args);
  list->add_flag("--json", args->json, "print JSON instead");
  commands.on(list, [args] { return task_list(*args); });
}

} // namespace spindle::cli
