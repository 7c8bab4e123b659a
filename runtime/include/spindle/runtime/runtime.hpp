#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/scoped_actor.hpp>

#include "spindle/messages/context_manager.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/task_id.hpp"
#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/options.hpp"
#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/runtime/cluster.hpp"
#include "spindle/runtime/process.hpp"
#include "spindle/runtime/config.hpp"
#include "spindle/runtime/storage.hpp"
#include "spindle/runtime/conversation.hpp"
#include "spindle/runtime/limits.hpp"
#include "spindle/runtime/llm.hpp"

namespace spindle {

namespace admission {
class limiter;
class upstream_queue;
} // namespace admission

// Held by the runtime, defined by the parts that own them (internal).
class compactor;
class event_log;
class exchange_set;
class storage_counters;
class token_counter;

/// How `runtime::usage` groups a tenant's usage.
enum class usage_grouping { none, thread, user, day };

/// A question to the usage counters (docs/usage.md).
struct usage_query {
  /// The tenant ("" for the default one).
  std::string tenant;
  /// Seconds since the Unix epoch: [from_s, to_s), widened to whole hours
  /// (the counters' unit).
  int64_t from_s = 0;
  int64_t to_s = std::numeric_limits<int64_t>::max();
  usage_grouping group_by = usage_grouping::none;
  /// Only this thread's or this user's exchanges (qualified); empty: all.
  std::string thread_id;
  std::string user_id;
  /// At most this many groups, after the group `after` (a thread or user
  /// ID, or a day's first second as decimal text); empty: from the first.
  size_t limit = 1000;
  std::string after;
};

/// What exchanges spent, by one source.
struct usage_figures {
  uint64_t exchanges = 0;
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
};

/// One group of `runtime::usage`: its key (the thread or user ID,
/// qualified; a day's first second as decimal text; "" without grouping)
/// and its figures by source, never added together.
struct usage_group {
  std::string key;
  usage_figures counted;
  usage_figures upstream;
};

struct usage_page {
  std::vector<usage_group> groups;
  /// More groups follow the last one.
  bool more = false;
};

/// Everything a runtime is started with.
struct runtime_options {
  /// Durable state; empty data_dir keeps everything in memory.
  storage_options storage;
  /// ID allocator tuning (reservation blocks).
  id_allocator_options ids;
  /// Context windows: default bounds (capacity 50, no token budget) and the
  /// managers' request timeout.
  context_directory_options context;
  /// Scheduler worker threads; 0 means one per core.
  size_t scheduler_threads = 0;
  /// Timeout of blocking calls that do not name their own.
  std::chrono::milliseconds default_timeout{5000};
  /// The LLM provider of exchanges; null means the offline provider.
  std::shared_ptr<llm_provider> provider;
  /// Threads, memory, query rewriting, context builder, exchanges.
  conversation_options conversation;
  /// How many of the latest events the event stream keeps for clients that
  /// reconnect (docs/api.md, "Events").
  size_t event_backlog = 50000;
  /// With a PostgreSQL store shared by several processes: this node's
  /// name and address in the cluster (docs/cluster.md). With a name the
  /// runtime joins the cluster at start, takes a lease for every thread
  /// it activates and fences every write of it; `spindle serve` on
  /// PostgreSQL always gives one. Empty name: not a cluster node (one
  /// process per database).
  cluster_options cluster;
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

  /// The encoding turns and usage are counted with (null before the
  /// runtime started).
  std::shared_ptr<const spindle::token_counter> token_counter() const {
    return tokens_;
  }

  /// The state store of threads, context windows and tasks; invalid when
  /// the runtime keeps its state in memory only (docs/storage.md).
  storage_actor state_store() const noexcept {
    return state_store_;
  }

  /// What the state store did since the runtime started: commits, the
  /// writes they carried, journal folds (all zero in memory). Read without
  /// asking the store, so it never waits for a commit. Thread-safe.
  storage_stats store_stats() const noexcept;

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
  // Design and protocol: docs/context.md. Read calls on a thread that has no
  // window answer as for an empty window and create none.

  /// The context directory: creates and finds each thread's manager.
  context_directory_actor context_directory() const noexcept {
    return context_directory_;
  }

  /// The `limit` that means every item of a window.
  static constexpr uint64_t all_items = UINT64_MAX;

  /// The context manager of `thread_id`, created with the default bounds if
  /// missing and `create`. Errors: invalid_id (thread ID, D10), not_found
  /// (none and not `create`), timeout, unavailable.
  caf::expected<context_manager_actor>
  context_manager_of(const std::string& thread_id, bool create);

  /// Adds an item to the window of `thread_id` (created on first use) with
  /// a fresh `ctx-N` ID and the current Universal Time. Returns the stored
  /// item and the IDs evicted to make room, oldest first. Errors:
  /// invalid_id (thread ID), invalid_argument (type), malformed (content or
  /// metadata, naming the field), capacity_exceeded (larger than the whole
  /// token budget; the window is unchanged), storage_failure, timeout,
  /// unavailable.
  caf::expected<context_add_result>
  add_context(const std::string& thread_id, context_type type,
              std::string content, nlohmann::json metadata = nullptr);
  caf::expected<context_add_result> add_context(const std::string& thread_id,
                                                context_draft draft);

  /// Stores an item with its own ID and timestamp (a restore, D4): the
  /// `ctx` counter is advanced past its ID. Errors as for `add_context`,
  /// plus already_exists when the ID is live in any window of this runtime.
  caf::expected<context_add_result>
  restore_context(const std::string& thread_id, context_item item);

  /// The newest `limit` items of the window, oldest first.
  caf::expected<std::vector<context_item>>
  context_items(const std::string& thread_id, uint64_t limit = all_items);

  /// One item. Errors: invalid_id, not_found, timeout, unavailable.
  caf::expected<context_item> get_context_item(const std::string& thread_id,
                                               const std::string& id);

  /// Removes one item and returns it. Errors as for `get_context_item`.
  caf::expected<context_item>
  remove_context_item(const std::string& thread_id, const std::string& id);

  /// Removes every item of the window; returns how many.
  caf::expected<uint64_t> clear_context(const std::string& thread_id);

  /// The newest `limit` items as markdown, oldest first (docs/context.md).
  caf::expected<std::string> render_context(const std::string& thread_id,
                                            uint64_t limit = all_items);

  /// Size, bounds and eviction counters of the window.
  caf::expected<context_stats> get_context_stats(const std::string& thread_id);

  /// Sets the bounds of the window (creating it if missing), evicting oldest
  /// first to fit. Errors: invalid_argument (capacity < 1, token_budget <
  /// 0), invalid_id, timeout, unavailable.
  caf::expected<context_evicted>
  configure_context(const std::string& thread_id, window_options options);

  /// Asynchronous variants; `done` runs once on a runtime thread.
  void add_context_async(
    const std::string& thread_id, context_draft draft,
    std::function<void(caf::expected<context_add_result>)> done);
  void context_items_async(
    const std::string& thread_id, uint64_t limit,
    std::function<void(caf::expected<std::vector<context_item>>)> done);
  void get_context_item_async(
    const std::string& thread_id, const std::string& id,
    std::function<void(caf::expected<context_item>)> done);
  void remove_context_item_async(
    const std::string& thread_id, const std::string& id,
    std::function<void(caf::expected<context_item>)> done);
  void clear_context_async(const std::string& thread_id,
                           std::function<void(caf::expected<uint64_t>)> done);
  void render_context_async(
    const std::string& thread_id, uint64_t limit,
    std::function<void(caf::expected<std::string>)> done);

  // -- threads, memory, context builder ----------------------------------------
  // Design and protocols: docs/threads.md, docs/memory.md, docs/builder.md,
  // docs/llm.md. Read calls never create a thread; only add_turn and
  // send_message do.

  /// The thread registry (thread ID -> thread actor).
  /// This node's cluster membership; null when it is not a cluster node.
  cluster_membership* cluster() const noexcept {
    return cluster_.get();
  }

  /// Where `thread_id` is served: here, or by another node of the cluster
  /// (docs/cluster.md, "Forwarding"); always here outside a cluster. Calls
  /// `done` once, on an actor's thread. This member function is
  /// thread-safe.
  void locate_thread(const std::string& thread_id,
                     std::function<void(thread_location)> done);

  thread_registry_actor thread_registry() const noexcept {
    return thread_registry_;
  }
  /// The context builder.
  context_builder_actor context_builder() const noexcept {
    return context_builder_;
  }
  /// The long-term memory.
  memory_actor memory() const noexcept {
    return memory_;
  }
  /// The query rewriter actor.
  query_rewriter_actor rewriter() const noexcept {
    return rewriter_;
  }
  /// The LLM provider of exchanges.
  std::shared_ptr<llm_provider> provider() const noexcept {
    return options_.provider;
  }

  /// Appends exactly one turn to `thread_id`, creating the thread if it
  /// does not exist (a write path), and returns the thread's turn count.
  /// Waits while a message exchange holds the thread (D9). Errors:
  /// invalid_id ("new" included: it names no thread), invalid_argument,
  /// too_large, timeout, unavailable.
  caf::expected<uint64_t> add_turn(const std::string& thread_id, turn t);

  /// The last turns of `thread_id` per D6 (default 20); empty for an
  /// unknown thread, which is not created. Errors: invalid_id,
  /// invalid_argument (max_turns < 2), timeout, unavailable.
  caf::expected<std::vector<turn>>
  history(const std::string& thread_id,
          uint64_t max_turns = store_default_max_turns);

  /// As `history`, with the thread's total turn count and clear epoch.
  caf::expected<history_window>
  read_history(const std::string& thread_id,
               uint64_t max_turns = store_default_max_turns);

  /// A copy of every turn of `thread_id`. Errors: invalid_id, not_found
  /// (nothing is created), timeout, unavailable.
  caf::expected<thread_snapshot> snapshot(const std::string& thread_id);

  /// Removes every turn of `thread_id` (the only way turns disappear) and
  /// returns how many. Waits for a running exchange. Errors: invalid_id,
  /// not_found, timeout, unavailable.
  caf::expected<uint64_t> clear_thread(const std::string& thread_id);

  /// Every thread ID, sorted.
  caf::expected<std::vector<std::string>> list_threads();

  /// How many message exchanges run now. Thread-safe.
  size_t exchanges_in_flight() const;

  /// What compaction did since start (docs/threads.md, "Compaction").
  compaction_stats compaction() const;

  // Threads as resources (docs/threads.md, "Threads as resources").

  /// Creates a thread with a fresh ID holding `metadata`, of the tenant
  /// whose IDs start with `tenant_prefix` ("" the default tenant, else
  /// "TENANT~", docs/tenants.md). Errors: invalid_argument, too_large,
  /// storage_failure, timeout.
  caf::expected<thread_info> create_thread(thread_metadata metadata,
                                           const std::string& tenant_prefix
                                           = {});

  /// Appends `turns` to the existing thread `thread_id` in one write, all
  /// or nothing, without generating; replies with the new turn count. The
  /// batch is checked against the thread (`validate_turn_batch`): tool
  /// call IDs unique in the thread, each tool turn answering an open call.
  /// Waits for a running exchange. Errors: invalid_id, not_found,
  /// invalid_argument, too_large (nothing is stored), storage_failure,
  /// timeout.
  caf::expected<uint64_t> append_turns(const std::string& thread_id,
                                       std::vector<turn> turns);

  /// A new thread (fresh ID) holding the first `at_turn` completed turns
  /// of `thread_id` (all of them without `at_turn`) and its metadata; the
  /// original is untouched. A running exchange's turns stay with the
  /// original. Errors: invalid_id, not_found, invalid_argument (an
  /// `at_turn` past the completed turns), storage_failure, timeout.
  caf::expected<thread_info>
  copy_thread(const std::string& thread_id,
              std::optional<uint64_t> at_turn = std::nullopt);

  /// The thread's creation and update times, turn count and metadata.
  /// Errors: invalid_id, not_found, storage_failure, timeout.
  caf::expected<thread_info> thread_details(const std::string& thread_id);

  /// Applies `patch` to the thread's metadata; returns the thread after it.
  /// Errors: invalid_id, not_found, invalid_argument, too_large,
  /// storage_failure, timeout.
  caf::expected<thread_info>
  update_thread_metadata(const std::string& thread_id,
                         thread_metadata_patch patch);

  /// One page of a walk over every thread, newest change first
  /// (`thread_list_request`). Errors: invalid_argument, storage_failure,
  /// timeout.
  caf::expected<thread_page> list_threads(thread_list_request request);

  /// What deleting a thread removed.
  struct thread_deletion {
    uint64_t turns = 0;
    uint64_t context_items = 0;
    uint64_t memories = 0;
  };

  /// Deletes the thread for good: its message in flight is cancelled and
  /// waited for, then its context items, its turns, metadata and context
  /// window, and its anonymous long-term memories go, each durably before
  /// this returns. The ID is free again (a message to it creates a new,
  /// empty thread). Errors: invalid_id, not_found, storage_failure,
  /// timeout.
  caf::expected<thread_deletion> delete_thread(const std::string& thread_id);

  /// How many threads exist.
  caf::expected<uint64_t> count_threads();

  /// Thread actors in memory, activations and passivations since start.
  caf::expected<thread_registry_stats> thread_stats();

  /// Builds the prompt for `message` in `thread_id` (D7) without storing
  /// anything; an unknown thread gives an empty history and is not
  /// created. Errors: invalid_id, invalid_argument, too_large, timeout,
  /// unavailable.
  caf::expected<built_context> build_context(const std::string& thread_id,
                                             const std::string& user_id,
                                             const std::string& message,
                                             build_options options = {});

  /// Stores a long-term memory entry with container tags `user:{id}`
  /// and/or `thread:{id}` (see memory_tags); returns its ID. Errors:
  /// invalid_argument, invalid_id, too_large, storage_failure, timeout,
  /// unavailable (memory disabled).
  caf::expected<int64_t> store_memory(const std::string& content,
                                      std::vector<std::string> tags);

  /// The memory snippet for a request of `user_id` (empty: anonymous) in
  /// `thread_id`, ranked by relevance to `query` (D8). Errors: invalid_id,
  /// invalid_argument, storage_failure, timeout, unavailable.
  caf::expected<memory_snippet>
  retrieve_memory(const std::string& user_id, const std::string& thread_id,
                  const std::string& query,
                  uint64_t max_chars = max_memory_snippet);

  /// A page of a scope's memory entries, newest first (a user's from every
  /// thread, or a thread's anonymous ones). Errors: invalid_id,
  /// invalid_argument, storage_failure, timeout, unavailable.
  caf::expected<memory_listing> list_memories(memory_list_request request);

  /// Deletes every memory entry of a user (`user_id` set) or the anonymous
  /// entries of a thread; returns how many went. Committed before it
  /// returns: no later retrieval shows them. Errors: invalid_id,
  /// invalid_argument, storage_failure, timeout, unavailable.
  caf::expected<uint64_t> delete_memories(const std::string& user_id,
                                          const std::string& thread_id);

  /// Deletes one memory entry; false when there is none with `id`. With
  /// `tenant` only an entry of that tenant: "" the default tenant (whose
  /// IDs are unqualified), a tenant's ID prefix ("TENANT~",
  /// docs/tenants.md), an end user's ("TENANT~USER~": its own entries and
  /// those of its threads); "*" any. Errors: storage_failure, timeout,
  /// unavailable.
  caf::expected<bool> delete_memory(int64_t id, const std::string& tenant = "*");

  /// Deletes every memory entry of the tenant whose IDs start with
  /// `tenant_prefix` ("TENANT~"); returns how many went. With `dry_run`,
  /// deletes nothing and returns how many scopes (users, or threads
  /// without a user) hold its entries. Reads every entry: for deleting a
  /// tenant. Errors: invalid_argument, storage_failure, timeout,
  /// unavailable.
  caf::expected<uint64_t> delete_tenant_memories(
    const std::string& tenant_prefix, bool dry_run = false);

  /// What a tenant's exchanges spent (docs/usage.md), read from the usage
  /// counters (one row per hour, thread, user and source), never from the
  /// turns. Errors: invalid_argument, storage_failure, timeout,
  /// unavailable (no state store).
  caf::expected<usage_page> usage(const usage_query& query);

  /// Adds the usage of a call that stores no turn (a chat completion
  /// without a thread) to `tenant`'s counters, under thread "", without
  /// waiting for the write (a failure is logged). Nothing without usage.
  void record_usage(const std::string& tenant, const turn_usage& usage);

  /// Holds each tenant's calls to the model to the limits `source` gives
  /// (docs/limits.md): exchanges started after this call count against
  /// them, and are refused (`rate_limited`), queued or bounded as the
  /// limits say. An empty `source` turns limits off. Thread-safe.
  void set_limits(limits_source source);
  /// What `set_limits` made; null without limits. Internal type: for
  /// spindle's own HTTP layer.
  std::shared_ptr<admission::limiter> limiter() const {
    return std::atomic_load(&limiter_);
  }
  /// Bounds what the runtime sends its provider as a whole (docs/limits.md,
  /// "The upstream"): past `limits` calls wait, the tenants served by
  /// their `weight` (null: all 1) and each tenant's calls in arrival
  /// order. Exchanges started after this call count. Unbounded limits
  /// turn the bounds off; the upstream's gate (docs/limits.md, "When the
  /// upstream refuses") is there either way. Thread-safe.
  void set_upstream_limits(upstream_limits limits, weight_source weight = {});
  /// The upstream's queue and gate (never null). Internal type.
  std::shared_ptr<admission::upstream_queue> upstream() const {
    return std::atomic_load(&upstream_);
  }

  /// Deletes the tenant's usage counters; returns how many rows went.
  /// Errors: storage_failure, timeout, unavailable.
  caf::expected<uint64_t> delete_usage(const std::string& tenant);

  /// Sends one user message and waits for the reply: the whole exchange of
  /// docs/threads.md (history read before the message is stored, user turn
  /// stored before the reply, reply streamed through `on_delta`, assistant
  /// turn stored, memory stored). `thread_id` "new" creates a thread with a
  /// UUIDv4 ID. Errors: see spawn_exchange (conversation.hpp).
  caf::expected<exchange_result>
  send_message(const std::string& thread_id, const std::string& content,
               const std::string& user_id = {},
               conflict_policy on_conflict = conflict_policy::queue,
               uint64_t max_turns = builder_default_max_turns,
               delta_callback on_delta = {});
  caf::expected<exchange_result> send_message(exchange_request request,
                                              delta_callback on_delta = {});

  /// Asynchronous variants; `done` runs once on a runtime thread (for
  /// send_message: the exchange's own thread, which may block briefly).
  void send_message_async(exchange_request request, delta_callback on_delta,
                          exchange_done done);
  /// As `send_message_async`, with every callback of an exchange: the
  /// thread held, each delta, the reply stored, the end (conversation.hpp).
  void start_exchange(exchange_request request, exchange_callbacks callbacks);
  /// Cancels the reply of the message running on `thread_id`: the provider
  /// is stopped at once, what it generated is stored as the interrupted
  /// assistant turn, the result says `cancelled`, and the thread is free
  /// for its next message. False when no message runs on it (one queued
  /// behind it, D9, is not touched).
  bool cancel_exchange(const std::string& thread_id);
  void add_turn_async(const std::string& thread_id, turn t,
                      std::function<void(caf::expected<uint64_t>)> done);
  void history_async(const std::string& thread_id, uint64_t max_turns,
                     std::function<void(caf::expected<history_window>)> done);
  void build_context_async(
    build_request request,
    std::function<void(caf::expected<built_context>)> done);

  // -- events ----------------------------------------------------------------------

  /// The changes of tasks and threads, published after their commit, with
  /// a backlog of the latest `runtime_options::event_backlog` (docs/api.md,
  /// "Events"). Never null while the runtime runs.
  std::shared_ptr<event_log> events() const noexcept {
    return events_;
  }

  // -- orchestration -------------------------------------------------------------

  /// The scheduler, front door of orchestration (protocol in
  /// messages/orchestration.hpp; design in docs/orchestration.md). In a
  /// cluster only the node holding the scheduler seat runs one; elsewhere
  /// (or between seats) this is invalid (docs/cluster.md, "One
  /// scheduler"). This member function is thread-safe.
  scheduler_actor scheduler() const {
    std::lock_guard<std::mutex> guard{scheduler_mtx_};
    return scheduler_;
  }

  /// The scheduler of `tenant`'s orchestrations ("": the default tenant's,
  /// `scheduler()`; docs/tenants.md), started on first use where the
  /// default one runs; invalid where none runs. Every orchestration call
  /// below takes its tenant from the task ID, parent, orchestration or
  /// worker it names (`TENANT~ID`, messages/ids.hpp); IDs in the answers
  /// are the tenant's own (unqualified). Thread-safe.
  scheduler_actor scheduler_of(const std::string& tenant);

  /// Where orchestration requests are served: here, or by the node
  /// holding the scheduler seat (`url` empty: no node holds it now, or
  /// none is known yet). Always here outside a cluster. Thread-safe.
  thread_location locate_scheduler() const;
  /// The error of an orchestration call on a node without a scheduler:
  /// `not_owner` naming the seat's holder, or saying none holds it now.
  caf::error no_scheduler_here() const;

  /// Creates an orchestration holding `payload` and returns its ID
  /// (0001, ..., 9999, A000, ...). Errors: exhausted, storage_failure,
  /// timeout, unavailable.
  caf::expected<std::string> create_orchestration(std::string payload);
  /// The same, tried up to `retry.max_attempts` times (docs/orchestration.md,
  /// "Retries"). Errors also: invalid_argument (a bad `retry`).
  caf::expected<std::string> create_orchestration(std::string payload,
                                                  task_retry retry);
  /// The same, in `tenant` ("": the default tenant). Errors also:
  /// invalid_id (not a tenant ID).
  caf::expected<std::string> create_orchestration(std::string payload,
                                                  task_retry retry,
                                                  const std::string& tenant);

  /// Creates a subtask of task `parent` and returns its ID (0001 -> 0001_t1,
  /// 0001_t1 -> 0001_t1.1). Errors: invalid_id, not_found, conflict (the
  /// parent is completed), timeout, unavailable.
  caf::expected<std::string> spawn_subtask(const std::string& parent,
                                           std::string payload);

  /// Creates one subtask per payload under `parent`, IDs in order.
  /// Errors as for `spawn_subtask`, plus invalid_argument (no payloads).
  caf::expected<std::vector<std::string>>
  spawn_subtasks(const std::string& parent, std::vector<std::string> payloads);
  /// The same, each subtask tried up to `retry.max_attempts` times.
  caf::expected<std::vector<std::string>>
  spawn_subtasks(const std::string& parent, std::vector<std::string> payloads,
                 task_retry retry);

  /// Hands the first executable task in D1 order to `worker` (it becomes
  /// running); nullopt when no task is executable. Errors: invalid_argument
  /// (worker name), timeout, unavailable.
  caf::expected<std::optional<task_info>> claim_task(const std::string& worker);

  /// running -> completed, keeping `result`. Errors: invalid_id, not_found,
  /// conflict (not running), timeout, unavailable.
  caf::expected<task_info> complete_task(const std::string& task,
                                         std::string result);

  /// running -> failed, keeping `reason`. Errors as for `complete_task`.
  caf::expected<task_info> fail_task(const std::string& task,
                                     std::string reason);

  /// stale or failed -> pending. Errors as for `complete_task`.
  caf::expected<task_info> requeue_task(const std::string& task);

  // Leases (docs/orchestration.md, "Leases"): a task claimed under a lease
  // becomes stale when the lease expires without a heartbeat; only the
  // lease's holder may extend, complete or fail it.

  /// As `claim_task`, under a lease of `length` (1 s to 1 h): `lease` and
  /// `lease_expires_ms` of the answer. `claimed` is false when no task is
  /// executable. Errors: invalid_argument, timeout, unavailable.
  caf::expected<task_claim> claim_task(const std::string& worker,
                                       std::chrono::milliseconds length);

  /// The leased claim (`length` 0: none), waiting up to `wait` (at most
  /// 60 s) for a task to become executable when none is; `claimed` is
  /// false when the time is up. Waiting claims are served in arrival
  /// order and hold no thread. `done` runs once on a runtime thread.
  void claim_task_async(const std::string& worker,
                        std::chrono::milliseconds length,
                        std::chrono::milliseconds wait,
                        std::function<void(caf::expected<task_claim>)> done);
  caf::expected<task_claim> claim_task(const std::string& worker,
                                       std::chrono::milliseconds length,
                                       std::chrono::milliseconds wait);

  /// Extends the lease `lease` of `task` to `length` from now. Errors:
  /// lease_lost (expired, taken over, another task's, or none given),
  /// invalid_argument, invalid_id, not_found.
  caf::expected<task_claim> heartbeat_task(const std::string& task,
                                           const std::string& lease,
                                           std::chrono::milliseconds length);

  /// `complete_task` and `fail_task` by the holder of `lease` (empty: a task
  /// no lease holds). Errors: lease_lost, and those of `complete_task`;
  /// nothing changes on an error.
  caf::expected<task_info> complete_task(const std::string& task,
                                         std::string result,
                                         const std::string& lease);
  caf::expected<task_info> fail_task(const std::string& task,
                                     std::string reason,
                                     const std::string& lease);

  /// Every task of `orchestration` with its state, in preorder by value.
  /// Errors: invalid_id (also for a task ID), not_found.
  caf::expected<task_tree> orchestration_tree(const std::string& orchestration);

  /// One task. Errors: invalid_id, not_found.
  caf::expected<task_info> task(const std::string& id);

  /// The executable tasks in D1 order (at most `limit`), of one
  /// orchestration or, for "", of all.
  caf::expected<std::vector<std::string>>
  executable_tasks(const std::string& orchestration = {},
                   uint64_t limit = UINT64_MAX);

  /// Every orchestration's ID, by value. Errors: timeout, unavailable.
  caf::expected<std::vector<std::string>>
  list_orchestrations(const std::string& tenant = {});

  /// Monitors an in-process worker actor: when it goes down, the tasks
  /// `worker` runs become stale. Errors: invalid_argument.
  caf::expected<void> attach_worker(const std::string& worker,
                                    const caf::actor_addr& actor);

  /// Records that `worker` is the process `who` (PID + start time, D11);
  /// `detect_stale_tasks` checks it. Errors: invalid_argument.
  caf::expected<void> attach_worker(const std::string& worker,
                                    const process_identity& who);

  /// Marks every running task of `worker` stale; returns their IDs.
  caf::expected<std::vector<std::string>>
  mark_worker_stale(const std::string& worker);

  /// How many tasks are in each state, over every orchestration of every
  /// tenant whose scheduler runs here. Errors: timeout, unavailable.
  caf::expected<task_counts> count_tasks();

  /// Checks every attached process worker that runs tasks; the tasks of
  /// those whose process is gone (or whose PID now names another process)
  /// become stale. Returns their IDs. Reads /proc on the calling thread.
  caf::expected<std::vector<std::string>> detect_stale_tasks();

  /// Asynchronous variants; `done` runs once on a runtime thread.
  void create_orchestration_async(
    std::string payload, std::function<void(caf::expected<std::string>)> done);
  void spawn_subtasks_async(
    const std::string& parent, std::vector<std::string> payloads,
    std::function<void(caf::expected<std::vector<std::string>>)> done);
  void claim_task_async(
    const std::string& worker,
    std::function<void(caf::expected<std::optional<task_info>>)> done);
  void complete_task_async(const std::string& task, std::string result,
                           std::function<void(caf::expected<task_info>)> done);
  void fail_task_async(const std::string& task, std::string reason,
                       std::function<void(caf::expected<task_info>)> done);
  void requeue_task_async(const std::string& task,
                          std::function<void(caf::expected<task_info>)> done);
  void orchestration_tree_async(
    const std::string& orchestration,
    std::function<void(caf::expected<task_tree>)> done);

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
    // The timeout is the blocking receive's own deadline, not a timer of
    // the actor clock: a late answer goes to a caller that is gone.
    auto id = self->request(receiver, caf::infinite, std::forward<Ts>(xs)...)
                .id();
    caf::blocking_actor::accept_one_cond until_answered;
    self->varargs_receive(
      until_answered, id, [&](R& value) { out = std::move(value); },
      [&](caf::error& err) { out = std::move(err); },
      caf::after(timeout) >> [&] {
        out = caf::make_error(caf::sec::request_timeout);
      });
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

  /// The cluster membership (null: not a cluster node); joined before the
  /// core actors that need it, left after every actor stopped.
  std::unique_ptr<cluster_membership> cluster_;

  // -- core actors (each area appends its handles in its own section) ----------
  counter_store_actor counter_store_;
  /// Invalid when the runtime keeps its state in memory only.
  storage_actor state_store_;
  std::shared_ptr<storage_counters> storage_counters_;
  id_allocator_actor id_allocator_;
  // context items:
  context_directory_actor context_directory_;
  // threads, memory, builder:
  caf::error start_threads();
  thread_registry_actor thread_registry_;
  memory_actor memory_;
  query_rewriter_actor rewriter_;
  context_builder_actor context_builder_;
  /// The exchanges running now; stopped first.
  std::shared_ptr<exchange_set> exchanges_;
  /// Folds what leaves the prompts into summaries (null: off).
  std::shared_ptr<compactor> compactor_;
  /// The encoding turns and usage are counted with.
  std::shared_ptr<const spindle::token_counter> tokens_;
  /// Each tenant's limits on the model (null: none).
  std::shared_ptr<admission::limiter> limiter_;
  /// The fair queue toward the provider (null: none).
  std::shared_ptr<admission::upstream_queue> upstream_;
  // orchestration:
  caf::error start_orchestration();
  /// Starts a scheduler (its load runs behind it); in a cluster, writing
  /// through a store fenced with the scheduler seat's `epoch`.
  scheduler_actor spawn_scheduler(uint64_t epoch,
                                  const std::string& tenant = {});
  /// Starts the schedulers of the tenants that hold orchestrations (their
  /// loads run behind them); `wait`: blocks until their tenants are known.
  void start_tenant_schedulers(bool wait);
  /// `tenant`'s scheduler, started here if it does not run yet
  /// (`spawned`); invalid where the default one does not run.
  scheduler_actor tenant_scheduler(const std::string& tenant, bool& spawned);
  /// Every scheduler running here: the default one first.
  std::vector<scheduler_actor> all_schedulers() const;
  /// The seat was taken (`epoch` > 0) or lost (0): the scheduler that ran
  /// under the old one stops, a new one starts.
  void scheduler_seat_changed(uint64_t epoch);
  /// `call`/`call_async` to the scheduler, or `no_scheduler_here`.
  template <class R, class... Ts>
  caf::expected<R> ask_scheduler(std::chrono::milliseconds timeout,
                                 Ts&&... xs);
  template <class R, class... Ts>
  void ask_scheduler_async(std::chrono::milliseconds timeout,
                           std::function<void(caf::expected<R>)> done,
                           Ts&&... xs);
  /// The same to `tenant`'s scheduler (invalid_id for no tenant ID).
  template <class R, class... Ts>
  caf::expected<R> ask_scheduler_in(const std::string& tenant,
                                    std::chrono::milliseconds timeout,
                                    Ts&&... xs);
  template <class R, class... Ts>
  void ask_scheduler_in_async(const std::string& tenant,
                              std::chrono::milliseconds timeout,
                              std::function<void(caf::expected<R>)> done,
                              Ts&&... xs);
  mutable std::mutex scheduler_mtx_;
  scheduler_actor scheduler_;
  /// The other tenants' schedulers, and the seat's epoch they write under.
  std::map<std::string, scheduler_actor> tenant_schedulers_;
  uint64_t seat_epoch_ = 0;
  // events:
  std::shared_ptr<event_log> events_;
};

} // namespace spindle
