#pragma once

// Summaries of what falls out of a thread's prompts (docs/threads.md,
// "Compaction"): one interface, an offline extractive implementation (the
// default) and one backed by an LLM provider. A summarizer folds the
// previous summary and the turns after it into a new summary; it never
// sees a thread, so it cannot change one.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/messages/chat.hpp"
#include "spindle/messages/threads.hpp"

namespace spindle {

class llm_provider;
struct completion_options;

/// What a summarizer folds: the summary so far (empty: none) and the turns
/// after it, oldest first.
struct summary_input {
  std::string previous;
  std::vector<turn> turns;
};

/// What `summarizer::start` calls when a summary is done or failed.
using summary_done = std::function<void(caf::expected<std::string>)>;

/// A summarizer. Implementations must be thread-safe. The runtime calls
/// `summarize` inline when `blocking()` is false; else `start`, and when
/// that has no asynchronous form, `summarize` on a thread of its own,
/// never on the scheduler's.
class summarizer {
public:
  virtual ~summarizer();

  /// A short name for logs.
  virtual std::string name() const = 0;

  /// True if `summarize` may block (network). The default is true.
  virtual bool blocking() const noexcept;

  /// Starts `summarize(input)` and returns without waiting: `done` runs
  /// exactly once with its result, on a thread of the summarizer's choosing
  /// (it must not block), possibly before `start` returns. False, calling
  /// nothing, when there is no asynchronous form. The default is false.
  virtual bool start(summary_input input, summary_done done);

  /// The new summary: `input.previous` with `input.turns` folded in, at
  /// most `max_summary_content` bytes. Errors: `upstream_failure`,
  /// `timeout`, `invalid_argument` (an empty or oversized answer).
  virtual caf::expected<std::string> summarize(const summary_input& input)
    = 0;
};

/// The offline summarizer: deterministic and extractive. Each turn becomes
/// one line, "{role}: {its first sentence}" (at most 160 bytes, cut at a
/// word; an assistant's tool calls as "called name, name"); the lines are
/// appended to the previous summary's, and the oldest lines go first when
/// the summary would pass `max_bytes` (default 2000).
class extractive_summarizer : public summarizer {
public:
  explicit extractive_summarizer(size_t max_bytes = 2000);
  std::string name() const override;
  /// False: it only copies text.
  bool blocking() const noexcept override;
  caf::expected<std::string> summarize(const summary_input& input) override;

private:
  size_t max_bytes_;
};

/// A summarizer that asks an LLM provider (prompt: `summary_prompt`) with
/// its own model (empty: the provider's) and timeout.
class llm_summarizer : public summarizer {
public:
  llm_summarizer(std::shared_ptr<llm_provider> provider,
                 std::chrono::milliseconds timeout
                 = std::chrono::milliseconds{30000},
                 std::string model = {});
  std::string name() const override;
  caf::expected<std::string> summarize(const summary_input& input) override;
  /// Through the provider's asynchronous form (its event loop), when it
  /// has one.
  bool start(summary_input input, summary_done done) override;

private:
  completion_options options() const;
  std::shared_ptr<llm_provider> provider_;
  std::chrono::milliseconds timeout_;
  std::string model_;
};

/// The prompt `llm_summarizer` sends: an instruction, then one user message
/// holding the previous summary and the new turns. Thread-safe.
std::vector<chat_message> summary_prompt(const summary_input& input);

} // namespace spindle
