#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/messages/chat.hpp"
#include "spindle/messages/prompt.hpp"
#include "spindle/runtime/flow.hpp"
#include "spindle/messages/error.hpp"

// The LLM provider interface: a blocking, streaming chat completion. Network
// providers (OpenAI-compatible HTTP) implement it elsewhere; this file holds
// the interface and the offline provider, spindle's default.
//
// A provider streams in one of two ways: `start` (asynchronous: it returns
// at once and calls back from its own event loop; the built-in providers)
// or `complete` (blocking: the caller gives it a thread of its own, never an
// event-based actor's).

namespace spindle {

namespace net {
class io_pool;
} // namespace net

/// One piece of a tool call as a reply streams it: the call at `index` of
/// the reply's calls. Its first piece carries `id` and `name`; each piece
/// carries the next fragment of its `arguments` text (possibly empty).
struct tool_call_delta {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

/// Receives each piece of the reply's tool calls, in order with its text
/// deltas. Returning false stops the generation, as for `delta_callback`.
using tool_call_callback = std::function<bool(const tool_call_delta&)>;

/// What an upstream said of its own capacity with the head of its answer
/// (docs/limits.md, "When the upstream refuses"). Figures it did not send
/// are -1.
struct upstream_signal {
  /// The answer's HTTP status: 200, or 429 / 503 when it refused the call
  /// for its load (any other status is a failure of the call alone).
  int status = 0;
  /// `Retry-After` (seconds or an HTTP date) or `retry-after-ms`, in ms.
  int64_t retry_after_ms = -1;
  /// OpenAI's `x-ratelimit-remaining-requests` / `-tokens` and
  /// `x-ratelimit-reset-requests` / `-tokens` (durations such as "1s",
  /// "6m0s", "20ms"), in ms.
  int64_t remaining_requests = -1;
  int64_t remaining_tokens = -1;
  int64_t reset_requests_ms = -1;
  int64_t reset_tokens_ms = -1;

  /// The upstream refused the call for its load: 429 or 503.
  bool refused() const noexcept {
    return status == 429 || status == 503;
  }
};

/// Receives the upstream's signal once per call, when its answer's head
/// arrives (before any delta), on the provider's thread; must not block.
using upstream_signal_callback = std::function<void(const upstream_signal&)>;

/// Per-call settings. Zero or empty fields leave the provider's default.
struct completion_options {
  /// The whole call, first byte to last delta. A provider returns
  /// `errc::timeout` when it passes.
  std::chrono::milliseconds timeout{120000};
  /// Model name; empty uses the provider's default.
  std::string model;
  /// Upper bound on generated tokens; 0 uses the provider's default.
  uint32_t max_tokens = 0;
  /// Further sampling parameters, as the text of a JSON object in OpenAI's
  /// request format (`{"temperature":0.2,"stop":["\n"]}`); empty for
  /// none. An OpenAI-compatible provider adds each field to its request
  /// body (never over `model`, `messages` or `stream`); a provider without
  /// such parameters ignores them.
  std::string parameters;
  /// The tools the model may call, as the text of OpenAI's `tools` array,
  /// and `tool_choice` as JSON text (both checked by `validate_tools`);
  /// empty for none. An OpenAI-compatible provider sends them as they are;
  /// the offline provider ignores them (docs/llm.md).
  std::string tools;
  std::string tool_choice;
  /// Receives the reply's tool calls piece by piece; null: they only
  /// arrive whole, in `completion::tool_calls`.
  tool_call_callback on_tool_call;
  /// The consumer's backpressure (flow.hpp), or null. A provider that reads
  /// its reply from an upstream asks it between reads and stops reading
  /// while it is paused; its patience between bytes does not run out
  /// meanwhile, the call's `timeout` still does.
  std::shared_ptr<flow_control> flow;
  /// Receives what the upstream says of its capacity (an HTTP provider
  /// calls it once per call that got an answer; a provider without an
  /// upstream never does); null: not asked.
  upstream_signal_callback on_signal;
};

/// A finished completion.
struct completion {
  /// Everything generated (up to the stop, when interrupted).
  std::string text;
  /// True if the delta callback asked to stop (the client went away).
  bool interrupted = false;
  /// The tools the model called, whole, in order (finish reason
  /// "tool_calls"); empty for a text reply.
  std::vector<tool_call> tool_calls;
  /// The upstream's own count of the call's tokens, when it reported one
  /// (OpenAI's `usage`; a streamed call asks for it with
  /// `stream_options.include_usage`). False: the caller counts them.
  bool usage_reported = false;
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
};

/// Receives each piece of a reply as it is generated, in order. Returning
/// false stops the generation: the client went away. May be empty.
using delta_callback = std::function<bool(std::string_view delta)>;

/// Receives the end of an asynchronous completion, exactly once.
using completion_done = std::function<void(caf::expected<completion>)>;

/// A chat completion backend. Implementations must be thread-safe:
/// `complete` is called from several threads at once.
class llm_provider {
public:
  virtual ~llm_provider();

  /// A short name for logs ("offline", "openai:gpt-4o", ...).
  virtual std::string name() const = 0;

  /// Generates the reply to `messages` (OpenAI chat order), streaming it
  /// through `on_delta`, and returns the full text. Blocks the calling
  /// thread. Errors: `upstream_failure` (the backend failed or refused),
  /// `timeout` (`options.timeout` passed).
  virtual caf::expected<completion>
  complete(const prompt& messages,
           const completion_options& options, const delta_callback& on_delta)
    = 0;

  /// Starts the completion of `messages` and returns without waiting for
  /// it: `on_delta` receives each piece in order, then `done` runs exactly
  /// once with what `complete` would have returned. Both run on a thread of
  /// the provider's choosing (its event loop), possibly before `start`
  /// returns, and must not block. Returns false, calling neither, when the
  /// provider has no asynchronous form; the caller then runs `complete` on
  /// a thread of its own. The default returns false.
  virtual bool start(prompt messages,
                     completion_options options, delta_callback on_delta,
                     completion_done done);
};

/// What a prompt holds, read the way the context builder assembles it
/// (D7): a leading system prompt, the thread's summary, a "Long-term
/// memory:" system message,
/// history turns, and the current user message (which names a rewritten
/// query when it has the "Original user message:" form).
struct prompt_summary {
  size_t messages = 0;
  bool system_prompt = false;
  /// A "Summary of the earlier conversation:" system message (compaction).
  bool summary = false;
  bool memory = false;
  size_t history_turns = 0;
  bool rewrite = false;
  /// The user's original message (from the last message).
  std::string original;
  /// The rewritten query, if any.
  std::string rewritten;
};

/// A model's answer without whitespace (space, tab, CR, LF) at either end,
/// as the query rewriter and the summarizer take it. Thread-safe.
std::string trim_model_output(const std::string& text);

/// Reads a prompt back into its parts. This function is thread-safe.
prompt_summary summarize_prompt(const prompt& messages);

/// The default provider: no network, no model. Its reply says plainly that
/// it is the offline provider and reports what it received (how many
/// history turns, whether a memory snippet and a rewritten query were
/// present), so a person can watch the context flow. Deterministic: the
/// same prompt gives the same reply, streamed in the same 4 deltas (fewer
/// for short replies). Thread-safe.
class offline_provider : public llm_provider {
public:
  /// `delta_delay` passes before each delta (0: none), to watch streaming
  /// by eye or to make exchanges overlap in tests. With a delay, `start`
  /// waits on timers of `loops`; without loops it has no asynchronous form
  /// and `complete` sleeps instead.
  explicit offline_provider(std::chrono::milliseconds delta_delay = {},
                            std::shared_ptr<net::io_pool> loops = nullptr);

  std::string name() const override;

  caf::expected<completion> complete(const prompt& messages,
                                     const completion_options& options,
                                     const delta_callback& on_delta) override;

  /// Without a delay, streams every delta and ends before it returns.
  bool start(prompt messages, completion_options options,
             delta_callback on_delta, completion_done done) override;

  /// The reply for `messages`, without streaming.
  static std::string reply_for(const prompt& messages);

private:
  std::chrono::milliseconds delta_delay_;
  std::shared_ptr<net::io_pool> loops_;
};

/// A shared offline provider.
std::shared_ptr<llm_provider> make_offline_provider();

/// Splits `text` into at most `parts` pieces at spaces (for streaming).
/// Concatenated, the pieces are `text`. This function is thread-safe.
std::vector<std::string> split_deltas(const std::string& text, size_t parts);

} // namespace spindle
