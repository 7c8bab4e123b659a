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

namespace spindle {

/// Tuning of the ID allocator.
struct id_allocator_options {
  /// Values of the `ctx` counter reserved durably ahead of use.
  uint64_t context_block = 4096;
  /// Values reserved ahead for orchestration and task counters. Smaller,
  /// because at most 736335 of them exist and a restart skips what was
  /// reserved but not handed out.
  uint64_t sequence_block = 64;
  /// How long a load or store at the counter store may take.
  std::chrono::milliseconds store_timeout{30000};
  /// Counters kept in memory; beyond it the least recently used idle ones
  /// are forgotten. A forgotten counter's next use loads it again and
  /// continues above its durable mark, as after a restart (a gap, never a
  /// reuse). Every task with children has a counter, so without a cap
  /// memory grows with the tasks ever created. 0: no cap.
  uint64_t max_counters = 10000;
  /// Cluster mode, for a counter store that several nodes share
  /// (PostgreSQL): no block is held, every `next`, `advance` and `peek`
  /// reaches the counter store, and an ID is answered only after the
  /// increment that made it is committed, so an ID handed out after
  /// another's request was answered, on any node, is larger. Requests for
  /// one counter that arrive while its round trip is in flight go
  /// together in the next one. The blocks above are then unused. Off: the
  /// block reservation of one process per store (SQLite, in memory). The
  /// runtime turns it on for PostgreSQL (`for_store`).
  bool cluster = false;

  /// These options, in cluster mode when the counter store is shared by
  /// nodes (`shared_store`), else as they are.
  id_allocator_options for_store(bool shared_store) const {
    auto out = *this;
    out.cluster = out.cluster || shared_store;
    return out;
  }
};

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
