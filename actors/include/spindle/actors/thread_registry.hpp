#pragma once

#include <chrono>
#include <string>
#include <unordered_map>

#include <caf/typed_event_based_actor.hpp>

#include "spindle/messages/threads.hpp"

namespace spindle {

/// Tuning of the thread registry.
struct thread_registry_options {
  /// How long a fork waits for the source thread's snapshot.
  std::chrono::milliseconds snapshot_timeout{5000};
};

/// State of the thread registry (protocol in messages/threads.hpp): the one
/// map from thread ID to thread actor. Threads are spawned linked and
/// lazily: they stop with the registry, and an idle thread costs no
/// scheduling. A thread that fails is dropped from the map (and logged),
/// the registry keeps serving.
struct thread_registry_state {
  static inline const char* name = "spindle.thread_registry";
  std::unordered_map<std::string, thread_actor> threads;
  thread_registry_options options;
};

using thread_registry_pointer
  = thread_registry_actor::stateful_pointer<thread_registry_state>;

/// Behaviour of the thread registry. Spawn it once per runtime.
thread_registry_actor::behavior_type
thread_registry(thread_registry_pointer self, thread_registry_options options);

} // namespace spindle
