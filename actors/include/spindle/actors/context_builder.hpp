#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <caf/typed_event_based_actor.hpp>

#include "spindle/actors/turn_log.hpp"
#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/threads.hpp"
#include "spindle/messages/tokens.hpp"

namespace spindle {

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

/// State of the context builder (protocol in
/// messages/context_builder.hpp). It owns nothing mutable: per build it
/// reads the history from the thread's published view when the thread is
/// resident (an immutable prefix of its turns, no message), else through
/// the registry's read path (`get, history`: forwarded to the thread's
/// `history`, never creating a thread; never `put`, `add` or `reset`),
/// retrieves memory in parallel with the
/// history, then asks the rewriter and assembles the prompt (D7). Many
/// builds run interleaved; none blocks the actor.
struct context_builder_state {
  static inline const char* name = "spindle.context_builder";
  thread_registry_actor registry;
  /// Invalid: no long-term memory.
  memory_actor memory;
  /// Invalid: no rewriting.
  query_rewriter_actor rewriter;
  context_builder_options options;
  /// The tokens of the default system prompt's message (0: not counted
  /// yet).
  uint64_t system_tokens = 0;
  /// The tokens of `memory_message_prefix` (0: not counted yet).
  uint64_t memory_prefix_tokens = 0;
};

using context_builder_pointer
  = context_builder_actor::stateful_pointer<context_builder_state>;

/// Behaviour of the context builder. Spawn it once per runtime.
context_builder_actor::behavior_type
context_builder(context_builder_pointer self, thread_registry_actor registry,
                memory_actor memory, query_rewriter_actor rewriter,
                context_builder_options options);

/// Messages a context builder handles each time a worker runs it, at most
/// (a build of a resident thread whose memory a reader keeps is one).
inline constexpr size_t context_builder_turn = 1;

/// Spawns `context_builder` as an actor that handles at most `per_turn`
/// messages each time a worker runs it, then goes to the back of that
/// worker's queue. CAF 0.17 runs an actor until its mailbox is empty: a
/// builder whose mailbox keeps filling would keep its worker while the
/// exchanges its replies woke, queued on that worker behind it, wait
/// (docs/builder.md, "Latency").
context_builder_actor
spawn_context_builder(caf::actor_system& system,
                      thread_registry_actor registry, memory_actor memory,
                      query_rewriter_actor rewriter,
                      context_builder_options options,
                      size_t per_turn = context_builder_turn);

} // namespace spindle
