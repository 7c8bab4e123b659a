#pragma once

// A fault-injecting SQLite VFS for tests (docs/reliability.md, "Injected
// faults"): it wraps the "unix-excl" VFS spindle opens its files with and
// takes its name, so every connection spindle opens afterwards goes
// through it.
// Faults apply to the files whose path contains `match` (empty: every
// file) and are switched at any moment from any thread.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace spindle::test {

class fault_vfs {
public:
  /// Registers the VFS, once per process.
  static fault_vfs& install();

  /// Writes (xWrite, xTruncate) fail with SQLITE_IOERR_WRITE.
  std::atomic<bool> fail_writes{false};
  /// Syncs (xSync) fail with SQLITE_IOERR_FSYNC.
  std::atomic<bool> fail_syncs{false};
  /// Each sync first waits this long.
  std::atomic<uint32_t> sync_delay_ms{0};
  /// Faults injected so far (calls refused or delayed).
  std::atomic<uint64_t> injected{0};
  /// Syncs under way (started, not yet returned).
  std::atomic<uint32_t> syncing{0};

  /// The files the faults apply to: those whose path contains `part`.
  void match(std::string part);
  bool matches(const char* path) const;

  /// Clears every fault.
  void heal();

private:
  fault_vfs() = default;
  mutable std::mutex mtx_;
  std::string match_;
};

} // namespace spindle::test
