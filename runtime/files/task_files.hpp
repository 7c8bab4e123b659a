#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/task_id.hpp"
#include "spindle/runtime/process.hpp"

namespace spindle {

/// The four task directories of seed 003, under
/// ROOT/ai_comms/{agent}/tasks/.
enum class task_dir : uint8_t { to_execute, in_progress, completed, stale };

/// "to_execute", "in_progress", "completed" or "stale".
std::string_view to_string(task_dir x);

/// The runtime's name for a directory's state: pending, running, completed,
/// stale.
std::string_view state_name(task_dir x);

/// One task found on the file system.
struct task_file_entry {
  task_id id;
  task_dir where = task_dir::to_execute;
  /// The worker that claimed it (in_progress and stale only): from the
  /// owner sidecar (PID + start time), else from the seed's PID marker in
  /// the file name (start time 0 = unknown).
  std::optional<process_identity> owner;
  /// The task's directory.
  std::filesystem::path dir;
  /// True if it is in to_execute and every child (in any agent's
  /// directories) is completed.
  bool executable = false;
  /// Number of children found, and how many of them are not completed.
  size_t children = 0;
  size_t incomplete_children = 0;
};

/// A task `claim_next` handed out.
struct claimed_task {
  task_id id;
  /// The task file, renamed to the seed's marker form {id}.{pid}.md.
  std::filesystem::path file;
  process_identity owner;
};

/// A task `detect_stale` moved to stale/.
struct stale_task {
  task_id id;
  /// Who held it; nullopt when the claim never recorded an owner.
  std::optional<process_identity> owner;
  /// "pid 1234 is gone", "pid 1234 now belongs to another process", ...
  std::string reason;
};

/// Tuning of the file protocol.
struct task_files_options {
  /// An in-progress task with no owner record at all (its claimer died
  /// between moving the directory and writing the record) is stale once
  /// its directory is this old.
  std::chrono::milliseconds unowned_grace{30000};
};

/// The seed's directory protocol for one agent (ROOT/ai_comms/{agent}/tasks/
/// {to_execute,in_progress,completed,stale}/{id}/{id}.md), made safe for
/// concurrent processes:
///
/// - queue: the task is written into a private staging directory and
///   renamed into to_execute/ whole, so no claimer sees it half-written.
/// - claim: rename(2) of to_execute/{id} to in_progress/{id} (never
///   replacing an existing target) is the atomic claim: exactly one claimer
///   succeeds, a loser moves on to its next candidate. The claimer then
///   writes {id}.owner ("PID:START" and the claim time, D11) and renames
///   {id}.md to the seed's marker {id}.{pid}.md.
/// - complete, stale, requeue: one rename of the task directory each.
///
/// Executable (D1 on files): in to_execute, and every child - an ID whose
/// parent is this task, found in any state directory of ANY agent under
/// the root - is in completed/. Candidates are tried in D1 order.
///
/// Agent names are validated on construction (D10) and IDs arrive parsed,
/// so nothing outside the tasks directory is ever touched. Every member
/// function is safe to call from many threads and processes at once.
class task_files {
public:
  /// Validates `agent` (`invalid_id`); touches nothing.
  static caf::expected<task_files> open(std::filesystem::path root,
                                        std::string agent,
                                        task_files_options options = {});

  const std::filesystem::path& root() const noexcept {
    return root_;
  }
  const std::string& agent() const noexcept {
    return agent_;
  }

  /// ROOT/ai_comms/{agent}/tasks.
  std::filesystem::path tasks_dir() const;

  /// ROOT/ai_comms/{agent}/tasks/{where}.
  std::filesystem::path dir_of(task_dir where) const;

  /// Claims an ID from the file counters ("global", or under `parent`) and
  /// writes `body` as to_execute/{id}/{id}.md. Returns the ID. Errors:
  /// io_failure, exhausted, timeout (from the counter).
  caf::expected<task_id> queue(std::string_view body,
                               const std::optional<task_id>& parent = {});

  /// Claims the first executable task in D1 order for `worker`. Returns
  /// nullopt when none is executable. Errors: io_failure.
  caf::expected<std::optional<claimed_task>>
  claim_next(const process_identity& worker);

  /// in_progress/{id} -> completed/{id}. Errors: not_found (no such task),
  /// conflict (the task is elsewhere; the message names where), io_failure.
  caf::error complete(const task_id& id);

  /// stale/{id} -> to_execute/{id}, the task file renamed back to {id}.md
  /// and the dead owner's record kept as {id}.owner.{pid}.{start}.
  /// Errors as for `complete`.
  caf::error requeue(const task_id& id);

  /// Moves every in-progress task whose owner is gone - the PID does not
  /// exist, or now belongs to a process with another start time - to
  /// stale/ and returns them in ID order.
  caf::expected<std::vector<stale_task>> detect_stale();

  /// Every task of this agent, by value (a parent before its children).
  caf::expected<std::vector<task_file_entry>> list() const;

  /// Where `id` is now, if anywhere.
  std::optional<task_dir> locate(const task_id& id) const;

private:
  task_files(std::filesystem::path root, std::string agent,
             task_files_options options);

  std::filesystem::path root_;
  std::string agent_;
  task_files_options options_;
};

/// Renders tasks as JSON: an array of {id, parent, depth, state, dir,
/// executable, children, incomplete_children, owner: {pid, start_time}}.
std::string to_json(const std::vector<task_file_entry>& tasks);

} // namespace spindle
