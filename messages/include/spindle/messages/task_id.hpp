#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

namespace spindle {

/// A hierarchical task ID (seed 003, decision D2), held by value:
///
///   orchestration  := hybrid36, not "0000"          0001, A000, ZZZZ
///   task           := orchestration "_t" seq         0001_t1
///   subtask        := task ("." seq)+                0001_t1.1, 0001_t1.1.1
///   seq            := [1-9][0-9]*, at most hybrid36::max_ordinal
///
/// `path` is the sequence path below the orchestration: empty for the
/// orchestration itself, {1} for 0001_t1, {1, 2} for 0001_t1.2. Depth is the
/// path's length (orchestration 0). Comparison is by value, never by string:
/// "t10" after "t9", "AA00" after "Z999", a parent before its children.
/// Values of this type are plain data; all functions are thread-safe.
struct task_id {
  /// The deepest path this grammar accepts; deeper IDs are refused.
  static constexpr size_t max_depth = 32;

  /// The orchestration's hybrid36 ordinal (>= 1).
  uint64_t orchestration = 0;

  /// Sequence numbers below the orchestration, outermost first.
  std::vector<uint64_t> path;

  /// Parses and validates `text`. Errors: `invalid_id` naming the problem.
  static caf::expected<task_id> parse(std::string_view text);

  /// Renders the canonical text form.
  std::string to_string() const;

  /// 0 for an orchestration, 1 for `_tN`, 2 for `_tN.M`, ...
  size_t depth() const noexcept {
    return path.size();
  }

  /// The last sequence number: the task's own position among its siblings
  /// (for an orchestration, its ordinal).
  uint64_t sequence() const noexcept {
    return path.empty() ? orchestration : path.back();
  }

  /// True for a top-level orchestration ID.
  bool is_orchestration() const noexcept {
    return path.empty();
  }

  /// The parent ID, or nullopt for an orchestration.
  std::optional<task_id> parent() const;

  /// The n-th child: `{this}_t{n}` below an orchestration, else `{this}.{n}`.
  task_id child(uint64_t n) const;

  /// True if `other` lies strictly below this ID.
  bool is_ancestor_of(const task_id& other) const noexcept;
};

/// Three-way comparison by value: orchestration ordinal first, then the path
/// element by element; a prefix sorts before its extensions.
int compare(const task_id& lhs, const task_id& rhs) noexcept;

inline bool operator==(const task_id& x, const task_id& y) noexcept {
  return compare(x, y) == 0;
}
inline bool operator!=(const task_id& x, const task_id& y) noexcept {
  return compare(x, y) != 0;
}
inline bool operator<(const task_id& x, const task_id& y) noexcept {
  return compare(x, y) < 0;
}

/// Convenience: true if `text` is a valid task ID.
bool is_valid_task_id(std::string_view text);

} // namespace spindle
