#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "spindle/runtime/process.hpp"

namespace spindle {

/// What a session lock file says about its holder. The file,
/// ROOT/locks/{session}.lock, holds four lines: the PID (first, as the
/// seed's `head -1` readers expect), the ISO-8601 time it was taken, the
/// session name, and the PID's start time (D11).
struct session_holder {
  process_identity who;
  std::string since;
  std::string session;

  /// "pid 1234 (session build, since 2025-01-01T10:00:00+0000)".
  std::string describe() const;
};

/// Validates a session name: the grammar of agent names (D10), since it
/// becomes a file name. Errors: `invalid_id`. Thread-safe.
caf::error validate_session_name(std::string_view name);

/// The lock directory under a root: ROOT/locks.
std::filesystem::path locks_dir(const std::filesystem::path& root);

/// A held session lock; releases it on destruction (or `release()`).
///
/// Acquisition is atomic: the complete lock file is written under a private
/// name and link(2)ed into place, which fails if a lock exists; it is never
/// check-then-write. A lock whose holder is gone (PID dead, or reused by a
/// process with another start time) is taken over: the taker flock(2)s the
/// stale file, checks that it is still the one at the lock's path, unlinks
/// it and links its own, so of several takers exactly one wins.
/// An instance is owned by one thread; distinct instances are independent.
class session_lock {
public:
  /// Takes ROOT/locks/{session}.lock for `me`. When a live process holds
  /// it, fails with `conflict` and fills `*busy` (if given) with the holder.
  /// Errors: invalid_id (session name), conflict, io_failure.
  static caf::expected<session_lock>
  acquire(const std::filesystem::path& root, const std::string& session,
          session_holder* busy = nullptr,
          const process_identity& me = self_identity());

  /// Reads the holder of a lock file; nullopt when there is none or it
  /// cannot be parsed.
  static std::optional<session_holder>
  read(const std::filesystem::path& lock_file);

  session_lock(session_lock&& other) noexcept;
  session_lock& operator=(session_lock&& other) noexcept;
  session_lock(const session_lock&) = delete;
  session_lock& operator=(const session_lock&) = delete;
  ~session_lock();

  /// Removes the lock file if it is still ours. Idempotent.
  void release();

  const std::filesystem::path& path() const noexcept {
    return path_;
  }
  const std::string& session() const noexcept {
    return session_;
  }

private:
  session_lock(std::filesystem::path path, std::string session,
               process_identity me);

  std::filesystem::path path_;
  std::string session_;
  process_identity me_;
  bool held_ = false;
};

} // namespace spindle
