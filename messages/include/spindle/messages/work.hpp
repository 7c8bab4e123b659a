#pragma once

// Work counted on the paths whose cost must not grow with the data
// (docs/threads.md, "Flat cost"): how many turns were copied, loaded and
// summarized, and how many rows and postings long-term memory read and
// wrote. Process-wide, relaxed counters; tests compare them before and
// after a number of exchanges as threads and scopes grow, and /metrics
// shows them (`spindle_work_total`).

#include <atomic>
#include <cstdint>

namespace spindle {

/// The counters. Every member is thread-safe (relaxed increments).
struct work_counters {
  /// Turns copied out of a thread's turn log (windows, snapshots).
  std::atomic<uint64_t> turns_copied{0};
  /// Turns read from the state store (a thread's activation).
  std::atomic<uint64_t> turns_loaded{0};
  /// Turns handed to a summarizer by compaction.
  std::atomic<uint64_t> turns_summarized{0};
  /// Long-term memory: rows read by statements (scopes, term lists,
  /// entries), by the writer and the readers.
  std::atomic<uint64_t> memory_rows_read{0};
  /// Long-term memory: rows written (entries, term lists, scopes).
  std::atomic<uint64_t> memory_rows_written{0};
  /// Long-term memory: postings decoded from term lists and encoded into
  /// them.
  std::atomic<uint64_t> memory_postings_read{0};
  std::atomic<uint64_t> memory_postings_written{0};
};

/// A copy of the counters at one moment.
struct work_snapshot {
  uint64_t turns_copied = 0;
  uint64_t turns_loaded = 0;
  uint64_t turns_summarized = 0;
  uint64_t memory_rows_read = 0;
  uint64_t memory_rows_written = 0;
  uint64_t memory_postings_read = 0;
  uint64_t memory_postings_written = 0;

  /// What was counted between `before` and this snapshot.
  work_snapshot operator-(const work_snapshot& before) const noexcept {
    work_snapshot d;
    d.turns_copied = turns_copied - before.turns_copied;
    d.turns_loaded = turns_loaded - before.turns_loaded;
    d.turns_summarized = turns_summarized - before.turns_summarized;
    d.memory_rows_read = memory_rows_read - before.memory_rows_read;
    d.memory_rows_written = memory_rows_written - before.memory_rows_written;
    d.memory_postings_read = memory_postings_read - before.memory_postings_read;
    d.memory_postings_written
      = memory_postings_written - before.memory_postings_written;
    return d;
  }
};

/// The process's counters. Thread-safe.
inline work_counters& work() noexcept {
  static work_counters counters;
  return counters;
}

/// Reads them. Thread-safe.
inline work_snapshot read_work() noexcept {
  auto& w = work();
  auto get = [](const std::atomic<uint64_t>& x) {
    return x.load(std::memory_order_relaxed);
  };
  work_snapshot s;
  s.turns_copied = get(w.turns_copied);
  s.turns_loaded = get(w.turns_loaded);
  s.turns_summarized = get(w.turns_summarized);
  s.memory_rows_read = get(w.memory_rows_read);
  s.memory_rows_written = get(w.memory_rows_written);
  s.memory_postings_read = get(w.memory_postings_read);
  s.memory_postings_written = get(w.memory_postings_written);
  return s;
}

/// Adds `n` to `counter`. Thread-safe.
inline void count_work(std::atomic<uint64_t>& counter, uint64_t n) noexcept {
  counter.fetch_add(n, std::memory_order_relaxed);
}

} // namespace spindle
