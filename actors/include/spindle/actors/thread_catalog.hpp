#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "spindle/messages/threads.hpp"

namespace spindle {

/// The next version of a sequence whose last one was `last`: strictly
/// larger, and at least the current time in microseconds since the Unix
/// epoch, so versions stay increasing across restarts (the store starts
/// from the largest one it holds) and tell when a change was made.
/// This function is thread-safe.
uint64_t next_thread_version(uint64_t last) noexcept;

/// How long a walk over the threads stays valid (its cursors are refused
/// after it): versions a walk may still need are kept this long.
inline constexpr std::chrono::seconds thread_walk_ttl{3600};

/// What the state store's `threads` and `thread_versions` tables hold, for
/// a runtime that keeps its state in memory: each thread's creation time,
/// turn count, metadata and version, and the versions that walks started
/// before a change still need (docs/threads.md, "Listing"). Thread-safe:
/// thread actors update it, the registry reads it.
class thread_catalog {
public:
  /// Adds a thread (a no-op if it exists).
  void create(const std::string& id, int64_t created_ms, uint64_t turns,
              thread_metadata metadata);

  /// The thread's turn count changed (an append or a clear).
  void set_turns(const std::string& id, uint64_t turns);

  /// The thread's metadata changed.
  void set_metadata(const std::string& id, thread_metadata metadata);

  /// Forgets the thread and every version of it.
  void remove(const std::string& id);

  std::optional<thread_info> get(const std::string& id) const;

  /// One page of a walk (validated by the caller).
  thread_page list(const thread_list_request& request);

  /// The latest version handed out.
  uint64_t last_version() const;

private:
  struct entry {
    int64_t created_ms = 0;
    uint64_t version = 0;
    uint64_t turns = 0;
    thread_metadata metadata;
  };

  using key = std::pair<uint64_t, std::string>; // version, thread ID

  // Gives `e` a new version, keeping the old one if a walk may need it.
  void bump(const std::string& id, entry& e);
  void prune();

  mutable std::mutex mtx_;
  std::unordered_map<std::string, entry> threads_;
  std::set<key> current_;
  /// Versions superseded after a walk's snapshot: (version, id) ->
  /// the version that replaced it.
  std::map<key, uint64_t> past_;
  uint64_t last_ = 0;
  /// The latest snapshot handed to a walk.
  uint64_t pin_ = 0;
};

} // namespace spindle
