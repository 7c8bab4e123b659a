#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "spindle/actors/cluster_standing.hpp"
#include "spindle/actors/event_log.hpp"
#include "spindle/actors/activation_table.hpp"
#include "spindle/actors/thread_catalog.hpp"
#include "spindle/actors/turn_log.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/messages/threads.hpp"
#include "spindle/messages/tokens.hpp"
#include "spindle/messages/options.hpp"

namespace spindle {

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
  activation_table<thread_actor> threads;
  storage_actor store;
  thread_registry_options options;
  /// Without a store: the threads as resources (turn counts, metadata,
  /// versions), which thread actors keep up to date.
  std::shared_ptr<thread_catalog> catalog;
  /// In a cluster: the thread leases this node holds and who held those
  /// it could not take (defined in thread_registry.cpp; never null).
  struct lease_book;
  std::shared_ptr<lease_book> leases;
};

using thread_registry_pointer
  = thread_registry_actor::stateful_pointer<thread_registry_state>;

/// Behaviour of the thread registry. Spawn it once per runtime; `store`
/// may be invalid (everything in memory).
thread_registry_actor::behavior_type
thread_registry(thread_registry_pointer self, thread_registry_options options,
                storage_actor store);

} // namespace spindle
