#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/options.hpp"
#include "spindle/messages/threads.hpp"
#include "spindle/runtime/limits.hpp"
#include "spindle/runtime/llm.hpp"
#include "spindle/runtime/memory.hpp"
#include "spindle/runtime/rewriter.hpp"
#include "spindle/runtime/summarizer.hpp"

// The exchange: one user message in, one assistant reply out, with the
// thread held for the whole exchange (D9). See docs/threads.md.

namespace spindle {

/// Threads, memory, rewriting, the context builder and exchanges.
struct conversation_options {
  /// The query rewriter; null means the offline rewriter.
  std::shared_ptr<query_rewriter> rewriter;
  /// Long-term memory: retrieved into prompts and fed by exchanges.
  bool memory = true;
  /// How long-term memory is served: readers of a durable memory (each
  /// an actor with its own connection, beside the one writer; in-memory
  /// mode has one actor for both) and their linger (docs/memory.md).
  memory_options memory_serving;
  /// The encoding turns are counted in and prompts fitted with
  /// (docs/builder.md, "The token budget"): `o200k_base` or `cl100k_base`;
  /// empty: `o200k_base`. The budget is the builder's `context_tokens` and
  /// `reply_tokens`.
  std::string encoding;
  /// System prompt, timeouts and token budget of the context builder.
  context_builder_options builder;
  /// Folds the turns that leave the prompts into each thread's summary
  /// (docs/threads.md, "Compaction"); null: the offline extractive one.
  std::shared_ptr<spindle::summarizer> summary_maker;
  /// Turns out of a prompt and not yet summarized that start compaction;
  /// 0: no compaction.
  uint64_t compact_min_turns = 4;
  /// Timeouts of the thread registry.
  thread_registry_options registry;
  /// How long a queued message waits for its thread (D9 `queue`).
  std::chrono::milliseconds queue_timeout{300000};
  /// How long the provider may take for one reply.
  std::chrono::milliseconds reply_timeout{120000};
  /// Each registry, thread and memory step of an exchange.
  std::chrono::milliseconds step_timeout{5000};
};

/// What compaction did since the runtime started.
struct compaction_stats {
  /// Jobs started, summaries stored, jobs that failed (summarizer or
  /// store), jobs running now.
  uint64_t started = 0;
  uint64_t stored = 0;
  uint64_t failed = 0;
  uint64_t running = 0;
};

/// One message to send.
struct exchange_request {
  /// An existing thread, a new thread's ID, or "new" for a fresh UUIDv4.
  std::string thread_id;
  std::string content;
  /// Empty: anonymous (memory scoped to the thread, D8).
  std::string user_id;
  /// What to do when another message holds the thread (D9).
  conflict_policy on_conflict = conflict_policy::queue;
  /// History window (default 12), system prompt, memory and rewrite.
  build_options build;
  /// The model call's model, max_tokens, parameters and tools (empty: the
  /// provider's defaults); the exchange sets its timeout, flow and tool
  /// call callback.
  completion_options completion;
  /// No new user message: the thread's last turns are tool results and the
  /// reply continues after them. `content` stays empty, no user turn is
  /// stored, the prompt has no memory and no rewrite.
  bool after_tool_results = false;
};

/// What an exchange did.
struct exchange_result {
  /// The thread that holds the exchange: the request's, a fresh one for
  /// "new", or the fork's.
  std::string thread_id;
  /// The assistant's reply as stored (partial when interrupted).
  std::string reply;
  /// The tools the reply calls, as stored (none when interrupted).
  std::vector<tool_call> tool_calls;
  /// The thread's turn count after the assistant turn.
  uint64_t turns = 0;
  /// History turns the prompt carried.
  uint64_t history_turns = 0;
  /// The thread was created by this exchange (new ID, "new" or fork).
  bool created = false;
  /// For `fork`: the thread this one was copied from.
  std::string forked_from;
  /// The client went away while the reply streamed.
  bool interrupted = false;
  /// The reply was cancelled (`runtime::cancel_exchange`); it is stored
  /// as interrupted.
  bool cancelled = false;
  /// What the exchange spent (docs/usage.md), as stored with its
  /// assistant turn; source `none` when nothing counted it.
  turn_usage usage;
  /// The query the rewriter produced (the original when none).
  std::string rewritten_query;
  /// The thread actor's ID, for logs.
  uint64_t thread_actor_id = 0;
};

/// Called once with the outcome of an exchange.
using exchange_done = std::function<void(caf::expected<exchange_result>)>;

/// What an exchange reports as it goes. Every callback is optional, runs
/// on a runtime thread (`on_delta` on the provider's) and must not block.
struct exchange_callbacks {
  /// The thread is held (D9): `thread_id`, `created` and `forked_from` of
  /// the result are final. Runs before the prompt is built; for a tenant
  /// with limits (limits.hpp), once the call is admitted, after the
  /// prompt is built (a refusal comes before it).
  std::function<void(const exchange_result&)> on_held;
  /// For a tenant with limits: where they stand, once, when the call was
  /// admitted or refused (before `on_held`); for OpenAI's `x-ratelimit-*`
  /// headers.
  std::function<void(const rate_state&)> on_limits;
  /// The call waits for the upstream's capacity (runtime's
  /// `set_upstream_limits`): its place, once, after `on_held` and before
  /// any of the reply.
  std::function<void(const upstream_place&)> on_queued;
  /// Each piece of the reply; false stops the generation (the client went
  /// away) and the reply is stored as interrupted.
  delta_callback on_delta;
  /// Each piece of the reply's tool calls, in order with `on_delta`; false
  /// stops the generation as there.
  tool_call_callback on_tool_call;
  /// The assistant turn is stored: the result is complete. Runs before the
  /// exchange goes to long-term memory, so a reply never waits for it.
  std::function<void(const exchange_result&)> on_reply;
  /// The exchange ended: after memory and the release of the thread, or
  /// with its error (a failure after `on_reply` is logged, not reported).
  exchange_done done;
  /// The consumer's backpressure on the reply (flow.hpp), passed to the
  /// provider; null: none.
  std::shared_ptr<flow_control> flow;
};

} // namespace spindle
