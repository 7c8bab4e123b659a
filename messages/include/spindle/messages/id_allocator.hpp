#pragma once

#include <cstdint>
#include <string>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

/// The ID allocator: the one owner of every counter of its runtime. Each
/// increment is a message, so IDs are unique and monotonic whatever the
/// number of callers; with `id_allocator_options::cluster` also across the
/// nodes sharing one database (docs/ids.md, "Clusters").
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
/// allocator continues above it. On one node the allocator reserves blocks
/// ahead, so it writes here once per block, never once per ID; in a
/// cluster every ID comes out of `next` here (docs/ids.md, "Clusters").
///
/// - `(load, counter, key)` replies with the stored mark, 0 if none.
/// - `(store, counter, key, mark)` replies with `mark` once it is durable;
///   a mark never goes down (storing a lower one keeps the higher).
/// - `(next, counter, key, k, floor, limit)` raises the mark to
///   max(mark, floor) + k in one atomic step and replies with the new
///   mark once that is committed: the values from the reply - k + 1 to the
///   reply are the caller's, and no other caller, on any node sharing the
///   database, gets them. Errors: `exhausted` when the new mark would pass
///   `limit` (nothing changes); a storage error otherwise, after which the
///   step may or may not have happened (its values are then never handed
///   out by anyone: a gap, never a reuse).
using counter_store_actor = caf::typed_actor<
  caf::replies_to<load_atom, counter_atom, std::string>::with<uint64_t>,
  caf::replies_to<store_atom, counter_atom, std::string, uint64_t>::with<
    uint64_t>,
  caf::replies_to<next_atom, counter_atom, std::string, uint64_t, uint64_t,
                  uint64_t>::with<uint64_t>>;

/// The `exhausted` error of counter `key`, whose last value is `limit`, asked
/// for `amount` more values than it has left. Thread-safe.
inline caf::error counter_exhausted(const std::string& key, uint64_t amount,
                                    uint64_t limit) {
  return make_error(errc::exhausted,
                    "counter '" + key + "' cannot hand out "
                      + std::to_string(amount) + " more value(s); its last is "
                      + std::to_string(limit));
}

} // namespace spindle
