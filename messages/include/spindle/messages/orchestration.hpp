#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/task_id.hpp"

namespace spindle {

// -- task states -----------------------------------------------------------------

/// Where a task is in its life:
///
///   pending --claim--> running --complete--> completed
///                              --fail------> failed --requeue--> pending
///                              --worker gone--> stale --requeue--> pending
///
/// `completed` is final. A pending task is *executable* when every child it
/// has is completed (decision D1) and no retry backoff holds it. A task
/// with attempts left (`task_retry`) that fails or goes stale is retried
/// instead: it goes back to pending, executable once its backoff is over.
enum class task_state : uint8_t {
  pending = 0,
  running,
  completed,
  failed,
  stale,
};

/// "pending", "running", "completed", "failed" or "stale".
/// This function is thread-safe.
std::string to_string(task_state x);

/// Parses a name produced by `to_string(task_state)`; false if unknown.
/// This function is thread-safe.
bool from_string(std::string_view name, task_state& out);

// -- the D1 order ------------------------------------------------------------------

/// True if task `x` is claimed before task `y` when both are executable
/// (D1): depth descending, then the task's own sequence number descending,
/// then the whole ID path by value descending. (`has_children ASC` of the
/// seed's key is a filter, not a sort criterion: only executable tasks are
/// ordered.) This function is thread-safe.
inline bool claimed_before(const task_id& x, const task_id& y) noexcept {
  auto dx = x.depth(), dy = y.depth();
  if (dx != dy)
    return dx > dy;
  auto sx = x.sequence(), sy = y.sequence();
  if (sx != sy)
    return sx > sy;
  return compare(x, y) > 0;
}

/// An executable task as the scheduler's index keeps it: ordered by
/// `claimed_before`, smallest first = claimed first.
struct d1_key {
  task_id id;

  friend bool operator<(const d1_key& x, const d1_key& y) noexcept {
    return claimed_before(x.id, y.id);
  }
};

// -- message types -----------------------------------------------------------------

/// A snapshot of one task.
struct task_info {
  /// The task's ID, e.g. "0001_t1.2".
  std::string id;
  /// The parent's ID; empty for an orchestration.
  std::string parent;
  task_state state = task_state::pending;
  /// What the task is about, as given when it was created.
  std::string payload;
  /// The result (completed) or the failure reason (failed); else empty.
  std::string outcome;
  /// The worker that claimed it last; empty while never claimed.
  std::string worker;
  /// Children that are not completed yet; the task is executable only when
  /// this is 0 and it is pending.
  uint64_t incomplete_children = 0;
  /// The children's IDs, by value.
  std::vector<std::string> children;
  /// Claims of the task so far, and how many it may have (`task_retry`).
  uint32_t attempts = 0;
  uint32_t max_attempts = 1;
  /// The first retry's backoff; each later one doubles it.
  uint64_t backoff_ms = 0;
  /// While a retried task waits out its backoff: when it becomes
  /// executable, in milliseconds since the Unix epoch; else 0.
  int64_t retry_at_ms = 0;
  /// While a running task is held under a lease: when the lease expires,
  /// in milliseconds since the Unix epoch; else 0. Filled in by the
  /// scheduler, which keeps the leases (orchestrators leave it 0).
  int64_t lease_expires_ms = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_info& x) {
  return f(caf::meta::type_name("task_info"), x.id, x.parent, x.state,
           x.payload, x.outcome, x.worker, x.incomplete_children, x.children,
           x.attempts, x.max_attempts, x.backoff_ms, x.retry_at_ms,
           x.lease_expires_ms);
}

/// How often a task may be claimed, and how long it waits between
/// attempts: a task that fails or goes stale with attempts left goes back
/// to pending after `backoff_ms << (attempts - 1)` (at most an hour). The
/// default is one attempt: no retries.
struct task_retry {
  uint32_t max_attempts = 1;
  uint64_t backoff_ms = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_retry& x) {
  return f(caf::meta::type_name("task_retry"), x.max_attempts, x.backoff_ms);
}

inline constexpr uint32_t max_task_attempts = 100;
inline constexpr uint64_t max_backoff_ms = 3'600'000;

/// Errors: `invalid_argument` for attempts outside 1 to 100 or a backoff
/// above an hour. This function is thread-safe.
caf::error validate_retry(const task_retry& x);

/// How long a task waits before its retry after `attempts` claims: the
/// backoff doubled per attempt after the first, at most an hour.
/// This function is thread-safe.
inline uint64_t retry_delay_ms(uint64_t backoff_ms, uint32_t attempts) {
  if (backoff_ms == 0)
    return 0;
  auto shift = attempts > 1 ? std::min<uint32_t>(attempts - 1, 22) : 0;
  return std::min<uint64_t>(backoff_ms << shift, max_backoff_ms);
}

/// Every task of one orchestration, the orchestration first, in preorder by
/// value (a parent before its children, siblings by sequence number).
struct task_tree {
  std::string orchestration;
  std::vector<task_info> tasks;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_tree& x) {
  return f(caf::meta::type_name("task_tree"), x.orchestration, x.tasks);
}

/// The answer to a claim: `claimed` is false when nothing was executable.
/// A leased claim (and a heartbeat) carries the lease: its token and when
/// it expires, in milliseconds since the Unix epoch.
struct task_claim {
  bool claimed = false;
  task_info task;
  std::string lease;
  int64_t lease_expires_ms = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_claim& x) {
  return f(caf::meta::type_name("task_claim"), x.claimed, x.task, x.lease,
           x.lease_expires_ms);
}

/// Leases (docs/orchestration.md, "Leases"): how long a worker holds a
/// task it claimed over HTTP without a heartbeat.
inline constexpr uint64_t default_lease_ms = 30'000;
inline constexpr uint64_t min_lease_ms = 1'000;
inline constexpr uint64_t max_lease_ms = 3'600'000;

/// The longest a claim may wait for an executable task (60 s).
inline constexpr uint64_t max_claim_wait_ms = 60'000;

/// Errors: `invalid_argument` for a lease outside 1 s to 1 h.
/// This function is thread-safe.
caf::error validate_lease_ms(uint64_t ms);

/// A worker known by its process identity (D11) that holds running tasks.
struct process_worker {
  std::string worker;
  int32_t pid = 0;
  /// Start time in clock ticks since boot (/proc/PID/stat field 22).
  uint64_t start_time = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, process_worker& x) {
  return f(caf::meta::type_name("process_worker"), x.worker, x.pid,
           x.start_time);
}

/// How many tasks are in each state: of one orchestration, or summed over
/// all of them (the scheduler's `stats` query, /metrics).
struct task_counts {
  uint64_t pending = 0;
  uint64_t running = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;
  uint64_t stale = 0;
  /// Orchestrations counted (1 for one orchestrator's answer).
  uint64_t orchestrations = 0;
  /// Of those, the ones in memory (with a store, finished orchestrations
  /// leave it: docs/orchestration.md, "Retirement").
  uint64_t resident = 0;

  /// The counter of state `x`.
  uint64_t& of(task_state x) noexcept {
    switch (x) {
      case task_state::pending:
        return pending;
      case task_state::running:
        return running;
      case task_state::completed:
        return completed;
      case task_state::failed:
        return failed;
      case task_state::stale:
        break;
    }
    return stale;
  }

  uint64_t total() const noexcept {
    return pending + running + completed + failed + stale;
  }

  task_counts& operator+=(const task_counts& x) noexcept {
    pending += x.pending;
    running += x.running;
    completed += x.completed;
    failed += x.failed;
    stale += x.stale;
    orchestrations += x.orchestrations;
    resident += x.resident;
    return *this;
  }

  /// Takes away counts that were added before (never below 0).
  task_counts& operator-=(const task_counts& x) noexcept {
    auto sub = [](uint64_t& a, uint64_t b) { a = a > b ? a - b : 0; };
    sub(pending, x.pending);
    sub(running, x.running);
    sub(completed, x.completed);
    sub(failed, x.failed);
    sub(stale, x.stale);
    sub(orchestrations, x.orchestrations);
    sub(resident, x.resident);
    return *this;
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_counts& x) {
  return f(caf::meta::type_name("task_counts"), x.pending, x.running,
           x.completed, x.failed, x.stale, x.orchestrations, x.resident);
}

/// Task IDs travel between the scheduler and orchestrators already parsed.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_id& x) {
  return f(caf::meta::type_name("task_id"), x.orchestration, x.path);
}

/// Validates a worker name: 1 to 128 printable ASCII characters without
/// spaces. Errors: `invalid_argument` naming the value. Thread-safe.
caf::error validate_worker_name(std::string_view name);

// -- actor interfaces --------------------------------------------------------------

/// The scheduler: one per runtime, the front door of orchestration. It
/// owns the directory of orchestrators, the global executable index in D1
/// order (a std::set: claims cost O(log n) in pending tasks), and the
/// worker registry (who runs what; monitored actors; process identities).
///
/// - `(orchestr, payload)` creates an orchestration (ID from the allocator's
///   "global" counter) and replies with its ID; `(orchestr, payload,
///   retry)` gives its task `retry`.
/// - `(spawn, parent, payloads)` creates one subtask per payload under the
///   task `parent` (IDs from the allocator under `parent`), replies with
///   their IDs in order; `(spawn, parent, payloads, retry)` gives each
///   `retry`. Errors: invalid_id, not_found, conflict (the parent is
///   completed), invalid_argument (no payloads, a bad `retry`).
/// - `(claim, worker)` hands the first executable task in D1 order to
///   `worker` (it becomes running), or `claimed = false` when none is.
/// - `(claim, worker, lease_ms)`: the same under a lease of `lease_ms`: the
///   answer carries a fresh token; unless a heartbeat extends it in time,
///   the task becomes stale when it expires (its outcome says when and
///   whose lease it was). `(heartbeat, task, token, lease_ms)` extends it
///   to `lease_ms` from now. `(complete | fail, task, text, token)` finish
///   a leased task. A token that expired, was taken over by a later claim
///   or names another task is `lease_lost`, and nothing changes; so is
///   finishing a leased task without its token.
/// - `(claim, worker, lease_ms, wait_ms)`: the leased claim, waiting up to
///   `wait_ms` (at most 60 s) for a task to become executable when none
///   is: waiting claims are served in arrival order as tasks become
///   executable (a child completed, a subtask created, a task requeued),
///   and answered `claimed = false` when the time is up. A waiting claim
///   is a response promise: it holds no thread.
/// - `(complete, task, result)`, `(fail, task, reason)`: running -> completed
///   or failed (pending again when a retry is left). `(requeue, task)`:
///   stale or failed -> pending.
///   Errors: invalid_id, not_found, conflict (wrong state).
/// - `(get, orchestration)` replies with its tree; `(get, task, id)` with
///   one task; both with the lease expiry of running tasks held under one.
///   `(get, orchestrate)`: every orchestration's ID, by value.
/// - `(executable, orchestration, limit)`: the executable set in D1 order,
///   at most `limit` IDs, of all orchestrations when `orchestration` is "".
/// - `(attach, worker, actor)`: monitors an in-process worker; when it goes
///   down its running tasks become stale. `(attach, worker, pid, start)`:
///   records a process worker's identity for `workers` + `stale`.
/// - `(workers)` lists the process workers that hold running tasks;
///   `(stale, worker)` marks every running task of `worker` stale and
///   replies with their IDs.
/// - `(stats)`: how many tasks are in each state, over every orchestration
///   (asks each orchestrator; for /metrics).
/// - `(ready, ids)` / `(unready, id)`: orchestrators add tasks to and remove
///   a task from the executable index (internal).
///
/// With a state store every state change is committed before its reply
/// (docs/orchestration.md, "Durability").
using scheduler_actor = caf::typed_actor<
  caf::replies_to<orchestrate_atom, std::string>::with<std::string>,
  caf::replies_to<orchestrate_atom, std::string, task_retry>::with<
    std::string>,
  caf::replies_to<caf::spawn_atom, std::string,
                  std::vector<std::string>>::with<std::vector<std::string>>,
  caf::replies_to<caf::spawn_atom, std::string, std::vector<std::string>,
                  task_retry>::with<std::vector<std::string>>,
  caf::replies_to<claim_atom, std::string>::with<task_claim>,
  caf::replies_to<claim_atom, std::string, uint64_t>::with<task_claim>,
  caf::replies_to<claim_atom, std::string, uint64_t, uint64_t>::with<
    task_claim>,
  caf::replies_to<heartbeat_atom, std::string, std::string,
                  uint64_t>::with<task_claim>,
  caf::replies_to<complete_atom, std::string, std::string>::with<task_info>,
  caf::replies_to<fail_atom, std::string, std::string>::with<task_info>,
  caf::replies_to<complete_atom, std::string, std::string,
                  std::string>::with<task_info>,
  caf::replies_to<fail_atom, std::string, std::string,
                  std::string>::with<task_info>,
  caf::replies_to<requeue_atom, std::string>::with<task_info>,
  caf::replies_to<caf::get_atom, std::string>::with<task_tree>,
  caf::replies_to<caf::get_atom, task_atom, std::string>::with<task_info>,
  caf::replies_to<caf::get_atom, orchestrate_atom>::with<
    std::vector<std::string>>,
  caf::replies_to<executable_atom, std::string,
                  uint64_t>::with<std::vector<std::string>>,
  caf::replies_to<attach_atom, std::string, caf::actor_addr>::with<
    caf::ok_atom>,
  caf::replies_to<attach_atom, std::string, int32_t, uint64_t>::with<
    caf::ok_atom>,
  caf::replies_to<workers_atom>::with<std::vector<process_worker>>,
  caf::replies_to<stale_atom, std::string>::with<std::vector<std::string>>,
  caf::replies_to<stats_atom>::with<task_counts>,
  caf::reacts_to<ready_atom, std::vector<task_id>>,
  caf::reacts_to<unready_atom, task_id>,
  caf::reacts_to<lease_atom, uint64_t>,
  caf::reacts_to<claim_wait_atom, uint64_t>,
  caf::reacts_to<orch_idle_atom, uint64_t, task_counts>,
  caf::reacts_to<retired_atom, uint64_t, task_counts, bool>>;

/// An orchestrator: one per orchestration, spawned by the scheduler. It owns
/// its subtree: each task's state, payload, outcome, worker, children and
/// count of incomplete children, and it is the one place where a task of
/// the orchestration changes state. It tells the scheduler when a task
/// becomes executable (`ready`) or stops being so (`unready`) before it
/// replies, so the index is current by the time the caller hears back.
///
/// With a state store, an orchestrator whose tasks are all completed or
/// failed, and whose changes all committed, tells the scheduler
/// (`orch_idle`); the scheduler stops routing to it and asks it to
/// `retire`: it answers what came before, reports its final counts
/// (`retired`) once its last write committed, and stops. The store holds
/// it; the scheduler loads it again on its next request.
///
/// - `(spawn, parent, payloads, retry)` -> new child IDs.
/// - `(claim, id, worker)`: executable -> running, one more attempt;
///   `claimed = false` when the task is not executable (any more).
/// - `(retry, id)`: the backoff of retried task `id` is over (its own
///   timer).
/// - `(complete | fail, id, text)`, `(requeue, id)` as for the scheduler.
/// - `(stale, id, worker)`: running by `worker` -> stale; otherwise the task
///   is left alone. Replies with the task either way. `(stale, id, worker,
///   outcome)` also keeps `outcome` (why it became stale).
/// - `(get)` -> the tree; `(get, task, id)` -> one task; `(stats)` -> how
///   many of its tasks are in each state.
using orchestrator_actor = caf::typed_actor<
  caf::replies_to<caf::spawn_atom, task_id, std::vector<std::string>,
                  task_retry>::with<std::vector<std::string>>,
  caf::replies_to<claim_atom, task_id, std::string>::with<task_claim>,
  caf::replies_to<complete_atom, task_id, std::string>::with<task_info>,
  caf::replies_to<fail_atom, task_id, std::string>::with<task_info>,
  caf::replies_to<requeue_atom, task_id>::with<task_info>,
  caf::replies_to<stale_atom, task_id, std::string>::with<task_info>,
  caf::replies_to<stale_atom, task_id, std::string, std::string>::with<
    task_info>,
  caf::replies_to<caf::get_atom>::with<task_tree>,
  caf::replies_to<caf::get_atom, task_atom, task_id>::with<task_info>,
  caf::replies_to<stats_atom>::with<task_counts>,
  caf::reacts_to<retry_atom, task_id>,
  caf::reacts_to<retire_atom>>;

} // namespace spindle
