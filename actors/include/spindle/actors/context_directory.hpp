#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include <caf/typed_event_based_actor.hpp>

#include "spindle/actors/activation_table.hpp"
#include "spindle/messages/context_manager.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/messages/context_window.hpp"
#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/options.hpp"

namespace spindle {

/// State of the context directory (see messages/context_manager.hpp for
/// its protocol).
struct context_directory_state {
  static inline const char* name = "spindle.context_directory";

  /// thread ID -> its manager (virtual with a state store, see
  /// activation_table).
  activation_table<context_manager_actor> managers;
  /// Bounds asked for by an open that may create the window.
  std::unordered_map<std::string, window_options> bounds;
  storage_actor store;
  /// ID number of every live item (in some window) -> its thread ID.
  std::unordered_map<uint64_t, std::string> live;
  id_allocator_actor ids;
  context_directory_options options;
};

using context_directory_pointer
  = context_directory_actor::stateful_pointer<context_directory_state>;

/// Behaviour of the context directory. Spawn it once per runtime:
/// `sys.spawn(context_directory, ids, options, store)`; `options.window`
/// must pass `validate`; `store` may be invalid (windows in memory only).
/// With a store, managers are activated from it on first use and
/// passivated when idle or over the resident cap. When it exits, it stops
/// every manager it created.
context_directory_actor::behavior_type
context_directory(context_directory_pointer self, id_allocator_actor ids,
                  context_directory_options options,
                  storage_actor store = {});

} // namespace spindle
