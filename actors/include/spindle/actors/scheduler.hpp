#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/expected.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "spindle/actors/event_log.hpp"
#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/storage.hpp"

namespace spindle {

/// Tuning of the scheduler.
struct scheduler_options {
  /// How long the scheduler and its orchestrators wait for the ID
  /// allocator, the state store and each other.
  std::chrono::milliseconds timeout{30000};
  /// Where task events go (docs/api.md, "Events"); null: nowhere.
  std::shared_ptr<event_log> events;
  /// The tenant whose orchestrations this scheduler holds ("": the default
  /// tenant; docs/tenants.md): it loads, lists and creates only those, and
  /// its events carry the tenant.
  std::string tenant;
};

/// State of the scheduler (see messages/orchestration.hpp for its
/// protocol). Division of work: orchestrators own their tasks and every
/// state change; the scheduler owns what spans orchestrations: the directory
/// of orchestrators, the executable index in D1 order across all of them,
/// and who runs what. A claim takes the index's first entry (O(log n)) and
/// asks that task's orchestrator to confirm pending -> running; a refusal
/// (the task gained a child meanwhile) moves on to the next entry.
///
/// With a state store, the scheduler starts by loading every stored
/// orchestration (holding its other messages until then): the tasks that
/// were running under the previous process become stale, in the store
/// too, and the orchestrators of the unfinished ones and the index are
/// rebuilt from what committed. An orchestrator that stops after a failed
/// write is loaded again the same way (its running tasks stay running).
/// A finished orchestration leaves memory once stored and is loaded again
/// for its next request (docs/orchestration.md, "Retirement").
struct scheduler_state {
  static inline const char* name = "spindle.scheduler";

  struct worker_record {
    /// The in-process worker actor, when one was attached (monitored).
    caf::actor_addr actor;
    /// True once the attached actor went down (until another is attached):
    /// a claim confirmed after that is stale at once.
    bool gone = false;
    /// The worker process's identity (D11), when one was attached.
    int32_t pid = 0;
    uint64_t start_time = 0;
    /// Tasks this worker runs now.
    std::set<task_id> running;
  };

  scheduler_options options;
  id_allocator_actor ids;
  /// Invalid when the runtime keeps its state in memory only.
  storage_actor store;
  /// Orchestrations whose orchestrator stopped after a failed write (or
  /// retired unfinished) and is not loaded again yet. Not counted in
  /// `retired_counts`.
  std::set<uint64_t> unloaded;
  /// Orchestration ordinal -> its orchestrator.
  std::unordered_map<uint64_t, orchestrator_actor> orchestrators;

  // -- retirement (with a store; docs/orchestration.md, "Retirement") --------------
  /// An orchestrator asked to retire that has not reported back, and the
  /// counts it reported when it said it was finished (already part of
  /// `retired_counts`, so counting never misses it while it leaves).
  struct retiree {
    orchestrator_actor actor;
    task_counts counted;
  };
  std::unordered_map<uint64_t, retiree> retiring;
  /// The tasks of the orchestrations that left memory finished, and of
  /// those leaving now.
  task_counts retired_counts;
  /// Orchestrations being loaded from the store.
  std::set<uint64_t> loading;
  /// Requests waiting for an orchestration to be in memory.
  std::unordered_map<
    uint64_t, std::vector<std::function<void(caf::expected<orchestrator_actor>)>>>
    awaiting;
  /// Orchestrations whose creation is being stored: not found until then.
  std::set<uint64_t> creating;
  /// Orchestrator address -> orchestration ordinal (for down messages).
  std::map<caf::actor_addr, uint64_t> orchestrator_of;
  /// Every executable task of every orchestration, first = claimed next.
  std::set<d1_key> executable;
  std::unordered_map<std::string, worker_record> workers;
  /// Running task -> the worker that claimed it.
  std::map<task_id, std::string> running;
  /// Monitored worker actor -> the worker names attached to it.
  std::map<caf::actor_addr, std::set<std::string>> watched;

  /// A running task's lease (docs/orchestration.md, "Leases"). Kept in
  /// memory: a restart makes every running task lose its worker anyway.
  struct lease_record {
    task_id task;
    std::string worker;
    std::chrono::steady_clock::time_point expires;
    int64_t expires_ms = 0;
  };
  /// Token -> lease; task -> its lease's token.
  std::unordered_map<std::string, lease_record> leases;
  std::map<task_id, std::string> lease_of;
  /// Every lease by expiry. One timer, for the earliest, serves them all:
  /// a claim or heartbeat arms it only when its lease expires first.
  std::set<std::pair<std::chrono::steady_clock::time_point, std::string>>
    lease_deadlines;
  /// The timer that counts (earlier ones are ignored) and when it fires
  /// (time_point::max(): none is armed).
  uint64_t lease_timer = 0;
  std::chrono::steady_clock::time_point lease_timer_at
    = std::chrono::steady_clock::time_point::max();

  /// Claims waiting for an executable task, in arrival order.
  struct claim_waiter {
    uint64_t id = 0;
    std::string worker;
    uint64_t lease_ms = 0;
    caf::typed_response_promise<task_claim> promise;
    std::chrono::steady_clock::time_point deadline;
  };
  std::deque<claim_waiter> waiting_claims;
  uint64_t next_waiter = 0;
};

using scheduler_pointer = scheduler_actor::stateful_pointer<scheduler_state>;

/// Behaviour of the scheduler. Spawn it once per runtime:
/// `sys.spawn(scheduler, ids, store, options)`; `store` may be invalid (in
/// memory only). If the stored orchestrations cannot be loaded, it stops
/// with a `storage_failure` naming the cause. On exit it takes its
/// orchestrators with it.
scheduler_actor::behavior_type scheduler(scheduler_pointer self,
                                         id_allocator_actor ids,
                                         storage_actor store,
                                         scheduler_options options);

} // namespace spindle
