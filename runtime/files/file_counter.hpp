#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>

#include <caf/expected.hpp>

namespace spindle {

/// Tuning of file-counter claims.
struct claim_options {
  /// How long to wait for a counter held by a live claimer before giving up
  /// with `timeout`.
  std::chrono::milliseconds timeout{30000};
  /// A claim file whose owner is dead is recovered only once it is at least
  /// this old, so a claimer that just renamed the counter is never raced.
  std::chrono::milliseconds stale_grace{1000};
};

/// Claims the next ID of a file counter under `root`/ai_comms/counters/,
/// with the seed's rename-as-lock protocol as repaired by D3:
///
/// - claim: rename `{prefix}.NextId` to
///   `{prefix}.NextId.claimed.{pid}.{start}.{thread}`;
///   exactly one process succeeds. Others back off with jitter and retry.
/// - release: the successor is written into the claimed file in place, then
///   the file is renamed back to `{prefix}.NextId` (never replacing one), so
///   the counter is never missing while no claim file exists.
/// - a missing counter is created only once, with an exclusive create, and
///   never while any claim file for it exists.
/// - a claim file whose owner is dead (PID gone or reused, per its start
///   time) is recovered after `stale_grace`: the counter is restored as the
///   successor of the claimed value, so a value the dead claimer may have
///   handed out is skipped, never reissued.
///
/// `prefix` is "global" (orchestrations: 0001, 0002, ...) or a task ID
/// (0001 -> 0001_t1, ...; 0001_t1 -> 0001_t1.1, ...). The file holds the
/// next value in 4-character hybrid base36 ("0000" reads as "next is 0001").
/// ZZZZ, the last value, is handed out like any other; the file then holds
/// the end marker `exhausted` (not a hybrid value), also when a dead
/// claimer's ZZZZ is recovered, so ZZZZ is never handed out twice.
///
/// Errors: `invalid_id` (bad prefix), `io_failure` (root missing or not a
/// directory, unreadable counter), `exhausted` (ZZZZ was handed out: the
/// file holds the end marker and is left so), `timeout` (a live claimer
/// held the counter longer than `options.timeout`). On `invalid_id` and a missing root no
/// file is touched. This function is thread-safe and safe across processes.
caf::expected<std::string> claim_next_id(const std::filesystem::path& root,
                                         std::string_view prefix,
                                         const claim_options& options = {});

/// The counter directory under a root: root/ai_comms/counters.
std::filesystem::path counters_dir(const std::filesystem::path& root);

/// The root scripts use when none is given: $AI_ROOT, else the current
/// directory.
std::filesystem::path default_root();

} // namespace spindle
