#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "spindle/messages/storage.hpp"
#include "spindle/messages/threads.hpp"

namespace spindle {

/// Tuning of the thread registry.
struct thread_registry_options {
  /// How long a fork waits for the source thread's snapshot.
  std::chrono::milliseconds snapshot_timeout{5000};
  /// How long a load from or a write to the state store may take.
  std::chrono::milliseconds store_timeout{30000};
  /// With a state store: most thread actors kept in memory; beyond it the
  /// least recently used idle threads are passivated. 0: no cap.
  uint64_t max_resident = 10000;
  /// With a state store: a thread unused this long is passivated.
  /// 0: never for being idle.
  std::chrono::milliseconds idle_timeout{std::chrono::minutes{5}};
};

/// State of the thread registry (protocol in messages/threads.hpp): the one
/// map from thread ID to thread actor.
///
/// Thread actors are virtual when there is a state store: the registry
/// activates a thread from the store on first use (one load, however many
/// requests arrive meanwhile) and passivates it when idle for
/// `idle_timeout` or when more than `max_resident` are in memory (least
/// recently used first). A passivated thread answers exactly as before,
/// since a thread applies a write only once it is stored. Without a store
/// every thread stays in memory. A thread that fails is dropped (and
/// logged); the registry keeps serving.
struct thread_registry_state {
  static inline const char* name = "spindle.thread_registry";

  /// What a request waiting for a thread is given: the thread's actor
  /// (invalid if it does not exist) and whether this request created it.
  struct resolved {
    thread_actor handle;
    bool created = false;
  };
  using continuation = std::function<void(caf::expected<resolved>)>;
  struct waiter {
    bool create;
    continuation next;
  };

  struct resident {
    thread_actor handle;
    /// Position in `lru` (front: most recently used).
    std::list<std::string>::iterator lru;
    std::chrono::steady_clock::time_point used;
  };

  std::unordered_map<std::string, resident> threads;
  std::list<std::string> lru;
  /// Threads being loaded, created or passivated, with the requests that
  /// wait for them, in arrival order.
  std::unordered_map<std::string, std::vector<waiter>> transit;
  /// Threads asked to passivate, until they answered.
  std::unordered_map<std::string, thread_actor> passivating;
  /// Thread actor -> its ID, for down messages.
  std::map<caf::actor_addr, std::string> ids;

  storage_actor store;
  thread_registry_options options;
  uint64_t activations = 0;
  uint64_t passivations = 0;
};

using thread_registry_pointer
  = thread_registry_actor::stateful_pointer<thread_registry_state>;

/// Behaviour of the thread registry. Spawn it once per runtime; `store`
/// may be invalid (everything in memory).
thread_registry_actor::behavior_type
thread_registry(thread_registry_pointer self, thread_registry_options options,
                storage_actor store);

} // namespace spindle
