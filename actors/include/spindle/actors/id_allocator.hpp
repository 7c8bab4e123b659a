#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <vector>
#include <string>
#include <unordered_map>

#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/options.hpp"

namespace spindle {

/// State of the ID allocator (see messages/id_allocator.hpp for its
/// protocol). For each counter it keeps the next value to hand out and the
/// durable mark: every value it hands out is at or below a mark the counter
/// store has confirmed, so a restart resumes above everything handed out.
/// Reservations are made ahead (a block at a time, renewed when half of it
/// is used), so the common `next` is answered at once and the store sees
/// one write per block. In cluster mode it keeps no reservation: only the
/// requests waiting for the counter store (docs/ids.md, "Clusters").
struct id_allocator_state {
  static inline const char* name = "spindle.id_allocator";

  /// A request that waits for its counter to load or for a reservation.
  struct waiter {
    enum class op : uint8_t { next, advance, peek } what;
    uint64_t amount;
    caf::typed_response_promise<id_range> range;
    caf::typed_response_promise<uint64_t> value;
  };

  struct counter {
    counter_kind kind = counter_kind::context;
    bool loaded = false;
    bool loading = false;
    /// The next value to hand out.
    uint64_t next = 1;
    /// The largest value covered by a durable reservation.
    uint64_t durable = 0;
    /// The mark being stored right now, 0 when no store is in flight.
    uint64_t storing = 0;
    /// Cluster mode: how many requests at the front of `waiting` the
    /// counter store is answering now (0: none).
    size_t asking = 0;
    /// Requests in arrival order (a vector: most counters never wait, and
    /// an empty vector allocates nothing).
    std::vector<waiter> waiting;
    /// Its place in `recent`.
    std::list<std::string>::iterator place;
  };

  std::unordered_map<std::string, counter> counters;
  /// Every counter's key, most recently used first.
  std::list<std::string> recent;
  id_stats issued;
  counter_store_actor store;
  id_allocator_options options;
};

using id_allocator_pointer
  = id_allocator_actor::stateful_pointer<id_allocator_state>;

/// Behaviour of the ID allocator. Spawn it once per runtime:
/// `sys.spawn(id_allocator, store, options)`.
id_allocator_actor::behavior_type id_allocator(id_allocator_pointer self,
                                               counter_store_actor store,
                                               id_allocator_options options);

} // namespace spindle
