#pragma once

// The sliding window of context items (seed 001, D5) as a plain data
// structure: bounded by a capacity (items) and optionally by a token
// budget, evicting oldest first in O(1). The context manager actor owns one;
// the benchmark measures it directly.

#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>

#include "spindle/messages/context_item.hpp"

namespace spindle {

/// Bounds of one window.
struct window_options {
  /// Most items the window holds; must be >= 1. Default 50 (seed 001).
  int64_t capacity = 50;
  /// Most estimated tokens (see `estimate_tokens`) of all items together;
  /// 0 means no token bound. Must be >= 0.
  int64_t token_budget = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, window_options& x) {
  return f(caf::meta::type_name("window_options"), x.capacity,
           x.token_budget);
}

/// Checks the bounds. Errors: `invalid_argument` naming the field, e.g.
/// "capacity must be at least 1, got 0". This function is thread-safe.
caf::error validate(const window_options& options);

/// A FIFO window of context items, oldest first.
///
/// push is O(1) amortized plus O(1) per evicted item; find and erase by ID
/// are O(1) on average (a hash index from ID number to insertion position);
/// newest(k) is O(k) plus holes. Erasing from the middle leaves a hole that
/// is dropped when it reaches either end, and the deque is compacted when
/// holes outnumber items, so the memory stays O(size).
///
/// Not thread-safe: one owner (the context manager actor) uses it.
class context_window {
public:
  /// A window with the given bounds; `options` must pass `validate`
  /// (otherwise the defaults are used).
  explicit context_window(window_options options = {});

  /// Whether `item` could be pushed now. Errors: `invalid_id` (not a
  /// `ctx-N` item), `already_exists` (its ID is in the window),
  /// `capacity_exceeded` (its tokens exceed the whole budget).
  caf::error admissible(const context_item& item) const;

  /// Appends `item` as the newest, first evicting the oldest items while
  /// the window is full or the budget would be exceeded. Evicted items are
  /// appended to `evicted` (oldest first) when it is not null. On error
  /// (see `admissible`) nothing changes.
  caf::error push(context_item item, std::vector<context_item>* evicted);

  /// The item with `id`, or null.
  const context_item* find(std::string_view id) const;

  /// Removes and returns the item with `id`; nullopt if absent.
  std::optional<context_item> erase(std::string_view id);

  /// The newest `limit` items, oldest first.
  std::vector<context_item> newest(uint64_t limit) const;

  /// Removes every item and returns them, oldest first.
  std::vector<context_item> clear();

  /// Changes the bounds, evicting oldest first until the window fits them;
  /// evicted items are appended to `evicted`. Errors as `validate`; on
  /// error nothing changes.
  caf::error configure(window_options options,
                       std::vector<context_item>* evicted);

  /// Calls `f(item)` for every item, oldest first.
  template <class F>
  void for_each(F&& f) const {
    for (auto& slot : slots_)
      if (slot)
        f(*slot);
  }

  size_t size() const noexcept {
    return live_;
  }

  bool empty() const noexcept {
    return live_ == 0;
  }

  /// Estimated tokens of all items.
  uint64_t tokens() const noexcept {
    return tokens_;
  }

  const window_options& options() const noexcept {
    return options_;
  }

private:
  bool over_bounds(uint64_t extra_items, uint64_t extra_tokens) const noexcept;
  void evict_oldest(std::vector<context_item>* evicted);
  void drop_holes();

  std::deque<std::optional<context_item>> slots_;
  /// Insertion position of slots_.front().
  uint64_t base_ = 0;
  /// ID number -> insertion position.
  std::unordered_map<uint64_t, uint64_t> index_;
  size_t live_ = 0;
  uint64_t tokens_ = 0;
  window_options options_;
};

} // namespace spindle
