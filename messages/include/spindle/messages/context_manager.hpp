#pragma once

// The protocol of the per-thread context managers and of the directory
// that creates and finds them (seeds 000-002, D4, D5).

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/context_item.hpp"
#include "spindle/messages/context_window.hpp"

namespace spindle {

/// The reply to an add: the item as stored and the IDs it evicted, oldest
/// first (D5: every eviction is reported).
struct context_add_result {
  context_item item;
  std::vector<std::string> evicted;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, context_add_result& x) {
  return f(caf::meta::type_name("context_add_result"), x.item, x.evicted);
}

/// IDs that left a window, oldest first (the reply to a re-configuration).
struct context_evicted {
  std::vector<std::string> ids;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, context_evicted& x) {
  return f(caf::meta::type_name("context_evicted"), x.ids);
}

/// ID numbers (N of ctx-N) the manager of `thread_id` no longer holds.
struct context_released {
  std::string thread_id;
  std::vector<uint64_t> ids;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, context_released& x) {
  return f(caf::meta::type_name("context_released"), x.thread_id, x.ids);
}

/// What one window holds now and what happened to it since it was made.
struct context_stats {
  std::string thread_id;
  uint64_t size = 0;
  int64_t capacity = 0;
  int64_t token_budget = 0;
  uint64_t tokens = 0;
  /// Items stored by add.
  uint64_t added = 0;
  /// Items evicted by capacity, token budget or a smaller configuration.
  uint64_t evicted = 0;
  /// Items removed by ID.
  uint64_t removed = 0;
  /// Items removed by clear.
  uint64_t cleared = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, context_stats& x) {
  return f(caf::meta::type_name("context_stats"), x.thread_id, x.size,
           x.capacity, x.token_budget, x.tokens, x.added, x.evicted,
           x.removed, x.cleared);
}

/// The context manager of one conversation thread: its sliding window.
///
/// - `(add, draft)` creates an item: ID from the ID allocator, timestamp
///   now. Replies with the stored item and the evicted IDs.
/// - `(add, item)` stores an item with its explicit ID and timestamp (a
///   restore, D4): the ID counter is advanced past it first; an ID live in
///   any window of the runtime is refused (`already_exists`).
///   Errors of both adds: `invalid_id`, `invalid_argument`, `malformed`
///   (checked as the codec does), `capacity_exceeded` (larger than the
///   whole token budget), `timeout`/`unavailable`/`storage_failure` from
///   the ID allocator. On error the window is unchanged.
/// - `(ctx_items, limit)`: the newest `limit` items, oldest first.
/// - `(get, id)` / `(delete, id)`: the item / removes it; `not_found`.
/// - `(reset)`: removes every item; replies with how many.
/// - `(ctx_render, limit)`: the newest `limit` items as markdown.
/// - `(ctx_stats)`: size, bounds and counters.
/// - `(put, options)`: new bounds (`invalid_argument` if invalid); replies
///   with the IDs evicted to fit them.
/// - `(passivate)`: stops and replies true when nothing is in flight (the
///   window is stored), else replies false. Sent by the directory.
using context_manager_actor = caf::typed_actor<
  caf::replies_to<caf::add_atom, context_draft>::with<context_add_result>,
  caf::replies_to<caf::add_atom, context_item>::with<context_add_result>,
  caf::replies_to<ctx_items_atom, uint64_t>::with<std::vector<context_item>>,
  caf::replies_to<caf::get_atom, std::string>::with<context_item>,
  caf::replies_to<caf::delete_atom, std::string>::with<context_item>,
  caf::replies_to<caf::reset_atom>::with<uint64_t>,
  caf::replies_to<ctx_render_atom, uint64_t>::with<std::string>,
  caf::replies_to<ctx_stats_atom>::with<context_stats>,
  caf::replies_to<caf::put_atom, window_options>::with<context_evicted>,
  caf::replies_to<passivate_atom>::with<bool>>;

/// How many managers and live item IDs the directory knows.
struct context_directory_stats {
  uint64_t managers = 0;
  uint64_t live_ids = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f,
                                        context_directory_stats& x) {
  return f(caf::meta::type_name("context_directory_stats"), x.managers,
           x.live_ids);
}

/// The context directory: the one place that creates context managers, one
/// per thread ID, and the runtime-wide index of live item IDs (D4).
///
/// - `(get, thread)`: the thread's manager; `not_found` if it has none
///   (never creates). `invalid_id` for a thread ID off its grammar (D10).
/// - `(ctx_open, thread)` / `(ctx_open, thread, options)`: the thread's
///   manager, created if missing (with the directory's default bounds, or
///   `options`; an existing manager keeps its bounds). `invalid_id`,
///   `invalid_argument` (bad options).
/// - `(ctx_claim, n, thread)`: marks ID number n live for `thread`; replies
///   with n, or `already_exists` naming the thread that holds it. Managers
///   claim every ID before storing an item.
/// - `(ctx_release, released)`: those ID numbers are no longer live in
///   that thread (one-way; IDs held by another thread stay).
/// - `(ctx_stats)`: how many managers (in memory) and live IDs.
/// - `(tick)`: housekeeping (idle passivation); sent by the directory.
using context_directory_actor = caf::typed_actor<
  caf::replies_to<caf::get_atom, std::string>::with<context_manager_actor>,
  caf::replies_to<ctx_open_atom, std::string>::with<context_manager_actor>,
  caf::replies_to<ctx_open_atom, std::string, window_options>::with<
    context_manager_actor>,
  caf::replies_to<ctx_claim_atom, uint64_t, std::string>::with<uint64_t>,
  caf::reacts_to<ctx_release_atom, context_released>,
  caf::replies_to<ctx_stats_atom>::with<context_directory_stats>,
  caf::reacts_to<tick_atom>>;

} // namespace spindle
