#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/actor_control_block.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "spindle/actors/records.hpp"
#include "spindle/actors/thread_catalog.hpp"
#include "spindle/actors/turn_log.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/actors/event_log.hpp"
#include "spindle/messages/threads.hpp"
#include "spindle/messages/tokens.hpp"

namespace spindle {

/// State of one conversation thread (protocol in messages/threads.hpp).
///
/// Turns are append-only; `clear` is the only way they disappear, and it
/// bumps `epoch`. An exchange (D9) holds the thread through a lease; while
/// it does, other writes and exchanges wait in `waiting` in arrival order,
/// and reads are served at once. The lease holder is monitored, so a
/// holder that terminates without ending its exchange releases the thread.
struct thread_state {
  static inline const char* name = "spindle.thread";

  /// A write or exchange that arrived while the thread was held.
  struct waiter {
    enum class op : uint8_t { add, add_batch, clear, begin } what;
    turn item;
    std::vector<turn> items; // add_batch
    caf::typed_response_promise<uint64_t> promise;
    caf::strong_actor_ptr requester;
  };

  std::string thread_id;
  /// The turns, published to readers through `views` (a clear replaces the
  /// log; readers holding the old one keep a consistent pre-clear prefix).
  std::shared_ptr<turn_log> turns = std::make_shared<turn_log>();
  uint64_t epoch = 0;
  /// Where the thread publishes its view (null: nowhere).
  std::shared_ptr<thread_views> views;
  uint64_t actor_id = 0;

  /// The current lease (0: no exchange holds the thread).
  uint64_t lease = 0;
  uint64_t last_lease = 0;
  caf::actor_addr holder;
  /// Turn count when the current exchange began.
  uint64_t committed = 0;
  std::deque<waiter> waiting;

  /// Appends handed to the state store and not yet answered, shared with
  /// their hooks (which run on the store's thread).
  struct write_progress {
    std::string thread_id;
    std::atomic<size_t> in_flight{0};
  };

  /// The state store (invalid: in memory only). With a store, a write is
  /// made durable first and applied when it committed. Appends are handed
  /// to the store as they come, several in flight: the store publishes each
  /// in `turns` after its commit and answers its caller (write_hook). A
  /// clear, or an exchange's start while appends are in flight, waits for
  /// the store's answer instead; meanwhile `writing` holds later requests
  /// back, so everything commits and applies in arrival order.
  storage_actor store;
  /// In a cluster: the epoch of the thread's lease; every write is fenced
  /// with it (docs/cluster.md, "Fencing"). 0: not in a cluster.
  uint64_t lease_epoch = 0;
  bool writing = false;
  std::shared_ptr<write_progress> appends = std::make_shared<write_progress>();
  /// Sequence number of the next turn in the store.
  uint64_t next_seq = 0;

  /// Counts each turn once, before it is stored (null: turns are not
  /// counted).
  std::shared_ptr<const token_counter> tokens;
  /// The summary of the turns before the prompts' window (null: none).
  std::shared_ptr<const thread_summary> summary;

  /// The thread's metadata (docs/threads.md, "Threads as resources").
  thread_metadata metadata;
  /// Without a store: where the thread's turn count and metadata are
  /// listed (null: nowhere).
  std::shared_ptr<thread_catalog> catalog;
  /// Where the thread's changes are published after their commit (null:
  /// nowhere).
  std::shared_ptr<event_log> events;
  /// Metadata patches in arrival order; the first is being written.
  struct metadata_change {
    thread_metadata_patch patch;
    caf::typed_response_promise<thread_metadata> promise;
  };
  std::deque<metadata_change> metadata_changes;
  /// A deletion waiting for the running exchange or write to end.
  std::optional<caf::typed_response_promise<uint64_t>> deleting;

  thread_state() = default;
  thread_state(const thread_state&) = delete;
  thread_state& operator=(const thread_state&) = delete;
  /// Publishes the current log and epoch in `views`.
  void publish();
  /// Withdraws this actor's view from `views`.
  void withdraw();

  /// Answers every waiting request with `unavailable` (the thread stops)
  /// and withdraws the view.
  ~thread_state();
};

using thread_pointer = thread_actor::stateful_pointer<thread_state>;

/// Behaviour of a thread actor starting from `initial` (as loaded from the
/// store, a fork's copy, or nothing), writing through `store` when valid.
/// Spawned only by the thread registry.
///
/// Besides the protocol of `thread_actor` it answers `(passivate)` with
/// true and stops when it is idle (no exchange, no waiting or unfinished
/// write), else with false: the registry passivates only idle threads.
/// With `views`, it publishes its turns there from its first message on
/// (turn_log.hpp) and withdraws them before it passivates or stops. With
/// `tokens`, every turn is counted before it is stored, and loaded turns
/// without a count in that encoding are counted when the thread starts.
thread_actor::behavior_type
conversation_thread(thread_pointer self, std::string thread_id,
                    records::stored_thread initial, storage_actor store,
                    std::shared_ptr<thread_views> views = nullptr,
                    std::shared_ptr<thread_catalog> catalog = nullptr,
                    std::shared_ptr<event_log> events = nullptr,
                    std::shared_ptr<const token_counter> tokens = nullptr);

} // namespace spindle
