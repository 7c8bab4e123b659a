#pragma once

// Compaction (docs/threads.md, "Compaction"): the turns that leave a
// thread's prompts are folded into its summary by a summarizer, off the
// reply path. An exchange asks for it once its reply is stored; the turns
// to fold are read in place from the thread's published log (only those,
// at most `max_turns_per_job`: the cost of a job never grows with the
// thread), a job runs as an actor of its own (a summarizer may take
// seconds), at most one per thread at a time, and hands the new summary
// to the thread, which stores it. A failed job is logged and counted; the
// next exchange asks again. Turns are never deleted.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "spindle/messages/threads.hpp"
#include "spindle/messages/tokens.hpp"
#include "spindle/actors/turn_log.hpp"
#include "spindle/runtime/conversation.hpp"
#include "spindle/runtime/summarizer.hpp"

namespace spindle {

/// Starts compaction jobs. Thread-safe.
class compactor : public std::enable_shared_from_this<compactor> {
public:
  struct options {
    /// Turns out of the prompt and not yet summarized that start a job.
    uint64_t min_turns = 4;
    /// The most turns one job folds; a longer backlog is folded a piece
    /// per exchange.
    uint64_t max_turns_per_job = 64;
    /// Each registry and thread step of a job.
    std::chrono::milliseconds step_timeout{5000};
  };

  /// `views`: where resident threads publish their turns (read in place).
  compactor(caf::actor_system& sys, thread_registry_actor registry,
            std::shared_ptr<const thread_views> views,
            std::shared_ptr<summarizer> impl,
            std::shared_ptr<const token_counter> tokens, options opts);

  /// Folds the turns of `thread_id` before turn `upto` that its summary
  /// (which covers [0, `summary_upto`)) does not cover yet into a new
  /// summary (at most `max_turns_per_job` of them), unless fewer than
  /// `min_turns` are left, a job for the thread is running or the thread
  /// is not resident. Reads only those turns. Returns at once.
  void request(const std::string& thread_id, uint64_t summary_upto,
               uint64_t upto);

  compaction_stats stats() const;

  /// Stops every job still running (a stopping runtime does not wait for
  /// a summary model).
  void stop_all();

  const std::string& summarizer_name() const noexcept {
    return name_;
  }

private:
  enum class outcome { stored, failed };
  void finish(const std::string& thread_id, outcome how);

  caf::actor_system& sys_;
  thread_registry_actor registry_;
  std::shared_ptr<const thread_views> views_;
  std::shared_ptr<summarizer> impl_;
  std::shared_ptr<const token_counter> tokens_;
  options opts_;
  std::string name_;
  mutable std::mutex mtx_;
  std::unordered_map<std::string, caf::actor> running_;
  std::atomic<uint64_t> started_{0};
  std::atomic<uint64_t> stored_{0};
  std::atomic<uint64_t> failed_{0};
};

} // namespace spindle
