#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <caf/typed_event_based_actor.hpp>

#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/orchestration.hpp"

namespace spindle {

/// State of one orchestrator (see messages/orchestration.hpp for its
/// protocol): the whole subtree of one orchestration. Each task keeps the
/// number of its children that are not completed, so whether it is
/// executable is an O(1) question and a completion updates one parent.
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
  };

  task_id root;
  /// Ordered by value: iteration is a preorder walk of the tree.
  std::map<task_id, record> tasks;
  scheduler_actor scheduler;
  id_allocator_actor ids;
  std::chrono::milliseconds timeout{30000};
};

using orchestrator_pointer
  = orchestrator_actor::stateful_pointer<orchestrator_state>;

/// Behaviour of an orchestrator. The scheduler spawns one per orchestration
/// and puts `root` into its executable index itself; the orchestrator
/// announces every later change of executability to `scheduler`.
orchestrator_actor::behavior_type
orchestrator(orchestrator_pointer self, task_id root, std::string payload,
             scheduler_actor scheduler, id_allocator_actor ids,
             std::chrono::milliseconds timeout);

} // namespace spindle
