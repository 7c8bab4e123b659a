#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/scoped_actor.hpp>

#include "spindle/actors/id_allocator.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/task_id.hpp"
#include "spindle/runtime/config.hpp"
#include "spindle/runtime/storage.hpp"

namespace spindle {

/// Everything a runtime is started with.
struct runtime_options {
  /// Durable state; empty data_dir keeps everything in memory.
  storage_options storage;
  /// ID allocator tuning (reservation blocks).
  id_allocator_options ids;
  /// Scheduler worker threads; 0 means one per core.
  size_t scheduler_threads = 0;
  /// Timeout of blocking calls that do not name their own.
  std::chrono::milliseconds default_timeout{5000};
};

/// Thrown by the constructor of `runtime` when it cannot start; `start()`
/// reports the same failures as a value instead.
class startup_error : public std::runtime_error {
public:
  explicit startup_error(caf::error err);
  const caf::error& error() const noexcept {
    return err_;
  }

private:
  caf::error err_;
};

/// spindle embedded in a process: constructing it starts the actor system
/// and the core actors; destroying it stops them and waits until every one
/// has finished (no hang, no leaked actor).
///
/// Every member function is thread-safe and may be called from any thread
/// of an embedding server. Blocking calls wait at most their timeout and
/// return `caf::expected<T>`: a value or an error (errc::timeout when the
/// reply did not arrive in time, errc::unavailable after `stop()`).
/// Asynchronous variants (`*_async`) return at once and invoke their
/// callback exactly once, on one of the runtime's worker threads; the
/// callback must not block. The runtime must outlive every call into it.
class runtime {
public:
  /// Starts a runtime. Throws `startup_error` if storage cannot be opened.
  explicit runtime(runtime_options options = {});

  /// Starts a runtime, reporting a failure as a value.
  static caf::expected<std::unique_ptr<runtime>> start(
    runtime_options options = {});

  /// Stops all core actors and waits for them (calls `stop()`).
  ~runtime();

  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  /// Stops the core actors and waits for every actor of the system to
  /// finish. Idempotent. Calls made afterwards fail with `unavailable`.
  void stop();

  /// True until `stop()`.
  bool running() const noexcept;

  const runtime_options& options() const noexcept {
    return options_;
  }

  /// The actor system, for embedders that spawn their own actors.
  caf::actor_system& system() noexcept {
    return *system_;
  }

  // -- IDs (the ID allocator) -------------------------------------------------

  /// The ID allocator actor.
  id_allocator_actor id_allocator() const noexcept {
    return id_allocator_;
  }

  /// Hands out `count` consecutive values of counter `key` ("ctx",
  /// "global" or a task ID). Errors: invalid_id, invalid_argument,
  /// exhausted, storage_failure, timeout, unavailable.
  caf::expected<id_range> next_ids(const std::string& key, uint64_t count = 1);
  caf::expected<id_range> next_ids(const std::string& key, uint64_t count,
                                   std::chrono::milliseconds timeout);

  /// The next context item ID, `ctx-N`.
  caf::expected<std::string> next_context_id();
  /// `count` consecutive context item IDs, in order.
  caf::expected<std::vector<std::string>> next_context_ids(uint64_t count);
  /// The next orchestration ID: 0001, ..., 9999, A000, ..., ZZZZ.
  caf::expected<std::string> next_orchestration_id();
  /// The next task ID under `parent`: 0001 -> 0001_t1, 0001_t1 -> 0001_t1.1.
  caf::expected<std::string> next_task_id(const std::string& parent);
  /// `count` consecutive task IDs under `parent`, in order.
  caf::expected<std::vector<std::string>> next_task_ids(
    const std::string& parent, uint64_t count);

  /// Asynchronous `next_ids`.
  void next_ids_async(const std::string& key, uint64_t count,
                      std::function<void(caf::expected<id_range>)> done);

  // -- context items (per-thread sliding windows) ------------------------------

  // -- threads, memory, context builder ----------------------------------------

  // -- orchestration -------------------------------------------------------------

  // -- generic calls ---------------------------------------------------------

  /// Sends `xs...` to `receiver` and waits for its reply of type R.
  /// This member function is thread-safe.
  template <class R, class Handle, class... Ts>
  caf::expected<R> call(const Handle& receiver,
                        std::chrono::milliseconds timeout, Ts&&... xs) {
    if (!running() || !receiver)
      return make_error(errc::unavailable, "the runtime is stopped");
    caf::expected<R> out{caf::error{}};
    caf::scoped_actor self{*system_};
    self->request(receiver, timeout, std::forward<Ts>(xs)...)
      .receive([&](R& value) { out = std::move(value); },
               [&](caf::error& err) { out = std::move(err); });
    return out;
  }

  /// Sends `xs...` to `receiver` and invokes `done` with its reply of type R
  /// or an error. This member function is thread-safe.
  template <class R, class Handle, class... Ts>
  void call_async(const Handle& receiver, std::chrono::milliseconds timeout,
                  std::function<void(caf::expected<R>)> done, Ts&&... xs) {
    if (!running() || !receiver) {
      done(make_error(errc::unavailable, "the runtime is stopped"));
      return;
    }
    system_->spawn([=](caf::event_based_actor* self) mutable {
      self->request(receiver, timeout, std::move(xs)...)
        .then([done](R& value) { done(std::move(value)); },
              [done](caf::error& err) { done(std::move(err)); });
    });
  }

private:
  struct no_start_t {};
  runtime(runtime_options options, no_start_t);
  caf::error start_core();
  std::vector<caf::actor> core_actors() const;

  runtime_options options_;
  std::unique_ptr<config> config_;
  std::unique_ptr<caf::actor_system> system_;
  std::atomic<bool> running_{false};

  // -- core actors (each area appends its handles in its own section) ----------
  counter_store_actor counter_store_;
  id_allocator_actor id_allocator_;
  // context items:
  // threads, memory, builder:
  // orchestration:
};

} // namespace spindle
