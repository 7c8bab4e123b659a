#pragma once

// Work counted on the paths whose cost must not grow with the data
// (docs/threads.md, "Flat cost"): how many turns were copied, loaded and
// summarized, and how many rows and postings long-term memory read and
// wrote. Process-wide, relaxed counters; tests compare them before and
// after a number of exchanges as threads and scopes grow, and /metrics
// shows them (`spindle_work_total{kind}`, named by `work_kind_names`).

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace spindle {

/// What is counted.
enum class work_kind : uint8_t {
  /// Turns copied out of a thread's turn log (windows, snapshots).
  turns_copied,
  /// Turns read from the state store (a thread's activation).
  turns_loaded,
  /// Turns handed to a summarizer by compaction.
  turns_summarized,
  /// Long-term memory: rows its statements read (scopes, term lists,
  /// entries), in the writer and the readers.
  memory_rows_read,
  /// Long-term memory: rows written (entries, term lists, scopes).
  memory_rows_written,
  /// Long-term memory: postings decoded from term lists.
  memory_postings_read,
  /// Long-term memory: postings encoded into term lists.
  memory_postings_written,
};

inline constexpr size_t work_kinds = 7;

/// Each kind's name, in the order of `work_kind`.
inline constexpr std::array<const char*, work_kinds> work_kind_names{
  "turns_copied",         "turns_loaded",         "turns_summarized",
  "memory_rows_read",     "memory_rows_written",  "memory_postings_read",
  "memory_postings_written"};

/// The counters at one moment.
struct work_snapshot {
  std::array<uint64_t, work_kinds> counts{};

  uint64_t operator[](work_kind k) const noexcept {
    return counts[static_cast<size_t>(k)];
  }

  /// What was counted between `before` and this snapshot.
  work_snapshot operator-(const work_snapshot& before) const noexcept {
    work_snapshot d;
    for (size_t i = 0; i < work_kinds; ++i)
      d.counts[i] = counts[i] - before.counts[i];
    return d;
  }
};

/// The process's counters. Thread-safe.
inline std::array<std::atomic<uint64_t>, work_kinds>& work_counters() noexcept {
  static std::array<std::atomic<uint64_t>, work_kinds> counters{};
  return counters;
}

/// Adds `n` to the counter of `kind`. Thread-safe.
inline void count_work(work_kind kind, uint64_t n) noexcept {
  work_counters()[static_cast<size_t>(kind)].fetch_add(
    n, std::memory_order_relaxed);
}

/// Reads the counters. Thread-safe.
inline work_snapshot read_work() noexcept {
  work_snapshot s;
  auto& counters = work_counters();
  for (size_t i = 0; i < work_kinds; ++i)
    s.counts[i] = counters[i].load(std::memory_order_relaxed);
  return s;
}

} // namespace spindle
