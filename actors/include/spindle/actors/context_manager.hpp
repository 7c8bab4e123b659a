#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/typed_event_based_actor.hpp>

#include "spindle/messages/context_manager.hpp"
#include "spindle/messages/context_window.hpp"
#include "spindle/actors/records.hpp"
#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/storage.hpp"

namespace spindle {

/// How a context manager is set up.
struct context_manager_options {
  /// Bounds of the window (must pass `validate`).
  window_options window;
  /// Timeout of each request to the ID allocator and the directory.
  std::chrono::milliseconds request_timeout{30000};
};

/// State of a context manager (see messages/context_manager.hpp for its
/// protocol): the window of one thread and what happened to it.
struct context_manager_state {
  static inline const char* name = "spindle.context_manager";

  std::string thread_id;
  context_window window;
  id_allocator_actor ids;
  context_directory_actor directory;
  std::chrono::milliseconds timeout{30000};
  uint64_t added = 0;
  uint64_t evicted = 0;
  uint64_t removed = 0;
  uint64_t cleared = 0;
  /// The state store (invalid: in memory only) and the window position the
  /// next stored item takes.
  storage_actor store;
  uint64_t next_position = 0;
  /// Adds and writes not answered yet: a busy manager is not passivated.
  uint64_t in_flight = 0;
};

using context_manager_pointer
  = context_manager_actor::stateful_pointer<context_manager_state>;

/// Behaviour of the context manager of `thread_id`, starting from `initial`
/// (its items and counters as stored; bounds come from `options`) and
/// writing every change through `store` when valid: a change is answered
/// after it committed. Only the context
/// directory spawns managers (it is the single place that creates them and
/// keeps the runtime-wide index of live IDs they claim from).
context_manager_actor::behavior_type
context_manager(context_manager_pointer self, std::string thread_id,
                context_manager_options options, id_allocator_actor ids,
                context_directory_actor directory,
                records::stored_window initial = {},
                storage_actor store = {});

} // namespace spindle
