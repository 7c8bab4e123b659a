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
#include "spindle/messages/options.hpp"

namespace spindle {

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
