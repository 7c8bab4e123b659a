#pragma once

#include <cstdint>
#include <string>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

/// The ID allocator: the one owner of every counter. Each increment is a
/// message, so IDs are unique and monotonic whatever the number of callers.
///
/// - `(next, key, k)` hands out k >= 1 consecutive values of counter `key`
///   (see ids.hpp for keys) and replies with the range. Errors:
///   `invalid_id` (bad key), `invalid_argument` (k = 0),
///   `exhausted` (the counter would pass its maximum; nothing is handed out),
///   `storage_failure` (the reservation could not be made durable).
/// - `(advance, key, value)` makes sure `value` is never handed out, for
///   items restored with an explicit ID (D4); replies with the counter's next
///   value.
/// - `(peek, key)` replies with the value `next` would hand out now.
/// - `(stats)` replies with how many IDs of each kind it handed out since it
///   started.
using id_allocator_actor = caf::typed_actor<
  caf::replies_to<next_atom, std::string, uint64_t>::with<id_range>,
  caf::replies_to<advance_atom, std::string, uint64_t>::with<uint64_t>,
  caf::replies_to<peek_atom, std::string>::with<uint64_t>,
  caf::replies_to<stats_atom>::with<id_stats>>;

/// Where counters keep their durable high-water marks. A high-water mark is
/// the largest value a counter may have handed out; after a restart the
/// allocator continues above it. The allocator reserves blocks ahead, so it
/// writes here once per block, never once per ID.
///
/// - `(load, counter, key)` replies with the stored mark, 0 if none.
/// - `(store, counter, key, mark)` replies with `mark` once it is durable;
///   a mark never goes down (storing a lower one keeps the higher).
using counter_store_actor = caf::typed_actor<
  caf::replies_to<load_atom, counter_atom, std::string>::with<uint64_t>,
  caf::replies_to<store_atom, counter_atom, std::string, uint64_t>::with<
    uint64_t>>;

} // namespace spindle
