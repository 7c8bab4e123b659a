#pragma once

// Summaries of what falls out of a thread's prompts (docs/threads.md,
// "Compaction"): one interface, an offline extractive implementation (the
// default) and one backed by an LLM provider. A summarizer folds the
// previous summary and the turns after it into a new summary; it never
// sees a thread, so it cannot change one.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/messages/chat.hpp"
#include "spindle/messages/threads.hpp"

namespace spindle {

class llm_provider;

/// What a summarizer folds: the summary so far (empty: none) and the turns
/// after it, oldest first.
struct summary_input {
  std::string previous;
  std::vector<turn> turns;
};

/// A summarizer. Implementations must be thread-safe; `summarize` may
/// block (network): the runtime calls it on a thread of its own, never on
/// the scheduler's.
class summarizer {
public:
  virtual ~summarizer();

  /// A short name for logs.
  virtual std::string name() const = 0;

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

private:
  std::shared_ptr<llm_provider> provider_;
  std::chrono::milliseconds timeout_;
  std::string model_;
};

/// The prompt `llm_summarizer` sends: an instruction, then one user message
/// holding the previous summary and the new turns. Thread-safe.
std::vector<chat_message> summary_prompt(const summary_input& input);

} // namespace spindle
