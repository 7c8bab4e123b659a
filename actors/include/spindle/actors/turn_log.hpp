#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "spindle/messages/threads.hpp"

// Reading a thread without messaging it (docs/threads.md, "Published
// views"). A thread actor keeps its turns in a `turn_log`: one writer
// appends (the actor, or with a data directory the state store after each
// commit: docs/storage.md, "Order"), any number of readers on other
// threads read the prefix published so far. Published turns never change
// and never move, so a reader holding a log reads a consistent, immutable
// prefix while the writer goes on appending. The actor publishes its log
// in `thread_views`, where the context builder finds it by thread ID.

namespace spindle {

/// An append-only sequence of turns with one writer and concurrent readers.
///
/// Turns live in segments of 2, 4, 8, ... slots that are allocated once
/// and never moved; `push_back` constructs the turn in its slot and then
/// publishes the new size with a release store, so a reader that loads
/// `size()` (acquire) may read every turn below it without a lock.
class turn_log {
public:
  turn_log() = default;
  turn_log(const turn_log&) = delete;
  turn_log& operator=(const turn_log&) = delete;
  ~turn_log();

  /// Turns published so far. Thread-safe.
  size_t size() const noexcept {
    return size_.load(std::memory_order_acquire);
  }

  /// The turn at `i`; precondition: `i < size()` as read by this thread.
  /// Thread-safe.
  const turn& operator[](size_t i) const noexcept {
    auto [k, offset] = locate(i);
    return segments_[k].load(std::memory_order_acquire)[offset];
  }

  /// Appends `x` and publishes it. Only the log's writer calls this: the
  /// thread actor in memory-only mode, else the state store's append hooks
  /// (one after the other, handed over by message passing).
  /// Returns the new size.
  size_t push_back(turn x);

  /// The most turns a log holds (about 2^30).
  static constexpr size_t capacity() noexcept {
    return first_segment * ((size_t{1} << max_segments) - 1);
  }

  /// Copies turns [first, last) into `out`. Thread-safe for
  /// `last <= size()`.
  void copy(size_t first, size_t last, std::vector<turn>& out) const;

private:
  static constexpr size_t first_segment = 2;
  static constexpr size_t max_segments = 29;

  // Segment k holds first_segment << k turns, starting at index
  // first_segment * (2^k - 1).
  static std::pair<size_t, size_t> locate(size_t i) noexcept {
    auto p = i / first_segment + 1;
    auto k = static_cast<size_t>(63 - __builtin_clzll(p));
    auto start = first_segment * ((size_t{1} << k) - 1);
    return {k, i - start};
  }

  std::atomic<size_t> size_{0};
  std::array<std::atomic<turn*>, max_segments> segments_{};
};

/// What a thread actor publishes: its current log (a clear replaces it),
/// its clear count, its actor ID and its summary (null: none; a new one
/// is published with a new view).
struct thread_view {
  std::shared_ptr<const turn_log> turns;
  uint64_t epoch = 0;
  uint64_t actor_id = 0;
  std::shared_ptr<const thread_summary> summary;
};

/// The D6 window of `view` (at most `max_turns`, `max_turns >= 2`) as
/// indexes [first, last) into its log, `last` being the size read.
/// Thread-safe.
std::pair<size_t, size_t> window_bounds(const thread_view& view,
                                        uint64_t max_turns);

/// The D6 window of `view` (at most `max_turns`, `max_turns >= 2`), read
/// without messaging the thread. Thread-safe.
history_window read_window(const thread_view& view, uint64_t max_turns);

/// The published views of resident thread actors, by thread ID. Thread-safe.
///
/// A thread actor publishes its view when it starts and again when a clear
/// replaces its log, and withdraws it before it passivates or stops; a
/// newer actor of the same thread replaces an older one's view, and an
/// actor withdraws only its own. A thread absent here may still exist (not
/// resident, or not started yet): readers then ask the registry.
class thread_views {
public:
  /// Publishes (or replaces) the view of `thread_id`.
  void publish(const std::string& thread_id,
               std::shared_ptr<const thread_view> view);

  /// Withdraws the view of `thread_id` if actor `actor_id` published it.
  void withdraw(const std::string& thread_id, uint64_t actor_id);

  /// The view of `thread_id`, or null.
  std::shared_ptr<const thread_view> find(const std::string& thread_id) const;

  /// How many views are published.
  size_t size() const;

private:
  struct alignas(64) shard {
    mutable std::mutex mtx;
    std::unordered_map<std::string, std::shared_ptr<const thread_view>> map;
  };

  static constexpr size_t shard_count = 32;

  shard& shard_of(const std::string& thread_id) const {
    return shards_[std::hash<std::string>{}(thread_id) % shard_count];
  }

  mutable std::array<shard, shard_count> shards_;
};

} // namespace spindle
