#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/context_window.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/tokens.hpp"

// The options of the runtime's actors: what `runtime_options` and
// `conversation_options` carry to the ID allocator, the context directory,
// the context builder and the thread registry (docs/embedding.md). They
// sit here, below the actors that read them, so that the public headers
// name them without including the actors.

namespace spindle {

class thread_views;     // spindle/actors/turn_log.hpp
class event_log;        // spindle/actors/event_log.hpp
class cluster_standing; // spindle/actors/cluster_standing.hpp

/// How an owner keeps its virtual actors in memory.
struct activation_options {
  /// Most actors kept in memory; beyond it the least recently used idle
  /// ones are passivated. 0: no cap.
  uint64_t max_resident = 10000;
  /// An actor unused this long is passivated. 0: never for being idle.
  std::chrono::milliseconds idle_timeout{std::chrono::minutes{5}};
};

/// Tuning of the ID allocator.
struct id_allocator_options {
  /// Values of the `ctx` counter reserved durably ahead of use.
  uint64_t context_block = 4096;
  /// Values reserved ahead for orchestration and task counters. Smaller,
  /// because at most 736335 of them exist and a restart skips what was
  /// reserved but not handed out.
  uint64_t sequence_block = 64;
  /// How long a load or store at the counter store may take.
  std::chrono::milliseconds store_timeout{30000};
  /// Counters kept in memory; beyond it the least recently used idle ones
  /// are forgotten. A forgotten counter's next use loads it again and
  /// continues above its durable mark, as after a restart (a gap, never a
  /// reuse). Every task with children has a counter, so without a cap
  /// memory grows with the tasks ever created. 0: no cap.
  uint64_t max_counters = 10000;
  /// Cluster mode, for a counter store that several nodes share
  /// (PostgreSQL): no block is held, every `next`, `advance` and `peek`
  /// reaches the counter store, and an ID is answered only after the
  /// increment that made it is committed, so an ID handed out after
  /// another's request was answered, on any node, is larger. Requests for
  /// one counter that arrive while its round trip is in flight go
  /// together in the next one. The blocks above are then unused. Off: the
  /// block reservation of one process per store (SQLite, in memory). The
  /// runtime turns it on for PostgreSQL (`for_store`).
  bool cluster = false;

  /// These options, in cluster mode when the counter store is shared by
  /// nodes (`shared_store`), else as they are.
  id_allocator_options for_store(bool shared_store) const {
    auto out = *this;
    out.cluster = out.cluster || shared_store;
    return out;
  }
};

/// How the context directory and the managers it creates are set up.
struct context_directory_options {
  /// Bounds of a window created without explicit options.
  window_options window;
  /// Timeout of each request a manager makes (ID allocator, directory,
  /// state store).
  std::chrono::milliseconds request_timeout{30000};
  /// With a state store: how many managers stay in memory, and for how
  /// long an unused one does.
  activation_options activation;
};

/// The system prompt used when a build request names none.
inline constexpr const char* default_system_prompt
  = "You are a helpful assistant. Earlier turns of this conversation "
    "precede the latest message; use them to understand follow-up "
    "questions.";

/// Tuning of the context builder.
struct context_builder_options {
  std::string system_prompt = default_system_prompt;
  /// The share of a caller's build timeout left for the history read
  /// (the builder's own read through the registry is not timed: see
  /// docs/architecture.md, rules).
  std::chrono::milliseconds read_timeout{5000};
  /// Memory retrieval; past it the prompt is built without memory.
  std::chrono::milliseconds memory_timeout{2000};
  /// Query rewriting; past it the original message is used (D7).
  std::chrono::milliseconds rewrite_timeout{2000};
  /// Snippet budget (at most 2000, D8).
  uint64_t memory_max_chars = 2000;
  /// A rewriter that never blocks (the offline one), called by the builder
  /// itself instead of messaging the rewriter actor. Empty: use the actor.
  std::function<rewrite_result(const rewrite_request&)> inline_rewriter;
  /// Counts each prompt's tokens and fits it to its budget
  /// (docs/builder.md, "The token budget"). Null: no counting, and
  /// `max_turns` alone bounds the history.
  std::shared_ptr<const token_counter> tokens;
  /// The budget of a build that names none (`--context-tokens`) and the
  /// reply's reserve (`--reply-tokens`).
  uint64_t context_tokens = default_context_tokens;
  uint64_t reply_tokens = default_reply_tokens;
  /// The views resident threads publish (turn_log.hpp): a build finds
  /// its thread's turns there without a message; threads not published
  /// are read through the registry. Null: always the registry.
  std::shared_ptr<const thread_views> views;
  /// Retrievals answered on the builder's own thread from what the memory
  /// readers keep (`spawn_memory`'s); a retrieval it leaves goes to the
  /// memory actor. Empty: always the actor.
  kept_memory_retrieval kept_memory;
};

/// Tuning of the thread registry.
struct thread_registry_options {
  /// How long a fork waits for the source thread's snapshot.
  std::chrono::milliseconds snapshot_timeout{5000};
  /// How long a load from or a write to the state store may take.
  std::chrono::milliseconds store_timeout{30000};
  /// With a state store: how many thread actors stay in memory, and for
  /// how long an unused one does.
  activation_options activation;
  /// Where thread actors publish their turns for readers that do not
  /// message them (the context builder); null: nowhere.
  std::shared_ptr<thread_views> views;
  /// Where threads' changes are published (docs/api.md, "Events"); null:
  /// nowhere.
  std::shared_ptr<event_log> events;
  /// Counts every turn once, when it is stored (null: not counted).
  std::shared_ptr<const token_counter> tokens;
  /// In a cluster (a PostgreSQL store shared by several nodes): this
  /// node's standing. A thread is activated only under its lease, every
  /// write of it is fenced with the lease's epoch, and nothing is served
  /// while the node's own lease does not run (docs/cluster.md). Null: not
  /// in a cluster.
  std::shared_ptr<const cluster_standing> cluster;
};

} // namespace spindle
