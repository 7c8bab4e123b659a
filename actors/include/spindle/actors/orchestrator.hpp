#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/typed_event_based_actor.hpp>

#include "spindle/actors/event_log.hpp"
#include "spindle/actors/task_records.hpp"
#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/storage.hpp"

namespace spindle {

/// State of one orchestrator (see messages/orchestration.hpp for its
/// protocol): the whole subtree of one orchestration. Each task keeps the
/// number of its children that are not completed, so whether it is
/// executable is an O(1) question and a completion updates one parent.
///
/// With a state store, a change is applied in memory at once (so the next
/// request sees it) and its reply waits until the write holding it has
/// committed. One write is in flight at a time; the changes made meanwhile
/// are collected and committed together in the next one, in order, so what
/// the store holds is always a prefix of the changes made here. Replies
/// that show a task (queries included) also wait for every change made
/// before them. If a write fails, every reply still waiting gets the
/// error and the orchestrator stops: the scheduler loads it again from
/// what committed.
struct orchestrator_state {
  static inline const char* name = "spindle.orchestrator";

  struct record {
    task_state state = task_state::pending;
    /// Children not completed yet.
    uint64_t incomplete = 0;
    std::string payload;
    /// Result when completed, reason when failed.
    std::string outcome;
    std::string worker;
    /// Sequence numbers of the children, in creation (= value) order.
    std::vector<uint64_t> children;
    /// Claims so far, and how many the task may have.
    uint32_t attempts = 0;
    task_retry retry;
    /// While a retry waits out its backoff: when it ends (ms since the
    /// epoch; a timer announces the task then); else 0.
    int64_t retry_at_ms = 0;
  };

  /// Delivers one reply: its value when called with no error, else the
  /// error.
  using acknowledgement = std::function<void(const caf::error&)>;

  task_id root;
  /// Ordered by value: iteration is a preorder walk of the tree.
  std::map<task_id, record> tasks;
  /// How many tasks are in each state.
  task_counts counts;
  scheduler_actor scheduler;
  id_allocator_actor ids;
  /// Invalid when the runtime keeps its state in memory only.
  storage_actor store;
  std::chrono::milliseconds timeout{30000};

  // -- write-through (with a store only) -------------------------------------------
  /// True while a write is on its way to the store.
  bool writing = false;
  /// Replies waiting for the write in flight.
  std::vector<acknowledgement> in_flight;
  /// Statements of the changes made since, and the replies waiting for them.
  sql_write next_write;
  std::vector<acknowledgement> next_acks;
  /// The events of the changes in `next_write`, published once it
  /// committed (at once without a store).
  std::vector<event> next_events;

  // -- retirement (with a store only) ---------------------------------------------
  /// The scheduler was told that every task is completed or failed and
  /// everything committed (told again after a change undid that).
  bool reported_idle = false;
  /// The scheduler asked it to retire: it stops once nothing is in flight.
  bool retiring = false;
  /// Subtask creations waiting for their IDs.
  uint64_t spawning = 0;
  /// Where task events go; null: nowhere.
  std::shared_ptr<event_log> events;
  /// The tenant of the orchestration ("": the default one); its events
  /// carry it.
  std::string tenant;

  /// Answers every reply still waiting with `unavailable`.
  ~orchestrator_state();
};

using orchestrator_pointer
  = orchestrator_actor::stateful_pointer<orchestrator_state>;

/// Behaviour of an orchestrator. The scheduler spawns one per orchestration,
/// from a new orchestration or from what the store holds, and puts its
/// executable tasks into its index itself; the orchestrator announces every
/// later change of executability to `scheduler`. `store` may be invalid (in
/// memory only); `timeout` bounds requests to `ids` and `store`. Every
/// task change is published to `events` (may be null) after its commit.
orchestrator_actor::behavior_type
orchestrator(orchestrator_pointer self, records::stored_orchestration initial,
             scheduler_actor scheduler, id_allocator_actor ids,
             storage_actor store, std::chrono::milliseconds timeout,
             std::shared_ptr<event_log> events, std::string tenant = {});

} // namespace spindle
