#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <sys/types.h>

namespace spindle {

/// A process identity that survives PID reuse (D11): the PID together with
/// the process's start time in clock ticks since boot, as
/// /proc/PID/stat field 22 gives it.
struct process_identity {
  pid_t pid = 0;
  uint64_t start_time = 0;

  /// "PID:START", the form spindle writes into markers and lock files.
  std::string to_string() const;

  /// Parses "PID:START" (or a bare "PID", start time 0 = unknown).
  static std::optional<process_identity> parse(const std::string& text);
};

/// The start time of `pid`, or nullopt when no such process exists.
/// This function is thread-safe.
std::optional<uint64_t> process_start_time(pid_t pid);

/// The identity of `pid` now, or nullopt when it does not exist.
std::optional<process_identity> identify(pid_t pid);

/// The identity of the calling process.
process_identity self_identity();

/// True while `who` runs: its PID exists and, when `who.start_time` is
/// known (non-zero), that PID still belongs to the process that started
/// then. A zombie counts as gone. This function is thread-safe.
bool is_alive(const process_identity& who);

} // namespace spindle
