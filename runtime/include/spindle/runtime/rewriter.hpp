#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "spindle/messages/context_builder.hpp"
#include "spindle/runtime/llm.hpp"

// Query rewriting: one interface, an offline implementation (the default)
// and one backed by an LLM provider. A rewriter sees the original message,
// the history window and the memory snippet; it never sees a thread, so it
// cannot change one. Every failure falls back to the original message.

namespace spindle {

/// A query rewriter. Implementations must be thread-safe and must not
/// throw: every failure is a fallback to the original (with a reason).
class query_rewriter {
public:
  virtual ~query_rewriter();

  /// A short name for logs.
  virtual std::string name() const = 0;

  /// True if `rewrite` blocks (network); the runtime then runs each call
  /// in its own detached actor, never on the scheduler's threads.
  virtual bool blocking() const noexcept = 0;

  /// Rewrites `request.message` into a standalone query, or returns it
  /// unchanged with `fallback` naming why.
  virtual rewrite_result rewrite(const rewrite_request& request) = 0;

  /// True if `rewrite` returns every message unchanged: the context
  /// builder then asks nothing (no request is made, no history converted)
  /// and the prompt ends with the original message.
  virtual bool identity() const noexcept;
};

/// The offline rewriter: returns the original message, always. Without a
/// model there is no honest way to resolve "his" or "that one"; pretending
/// to (string tricks that look like contextualisation) would put made-up
/// queries into prompts. Its one rule is therefore the identity, and the
/// prompt's last message stays the original (D7).
class offline_rewriter : public query_rewriter {
public:
  std::string name() const override;
  bool blocking() const noexcept override;
  rewrite_result rewrite(const rewrite_request& request) override;
  bool identity() const noexcept override;
};

/// A rewriter that asks an LLM provider (prompt: `rewrite_prompt`). Falls
/// back to the original when the provider fails, when the call takes
/// longer than `timeout` (default 2 s), when the output is empty after
/// trimming, or when it is implausibly long for a query (more than
/// max(2000, 4 x the message) bytes).
class llm_rewriter : public query_rewriter {
public:
  /// `model` names the model of rewrites (a small fast one); empty: the
  /// provider's own.
  explicit llm_rewriter(std::shared_ptr<llm_provider> provider,
                        std::chrono::milliseconds timeout
                        = std::chrono::milliseconds{2000},
                        std::string model = {});

  std::string name() const override;
  bool blocking() const noexcept override;
  rewrite_result rewrite(const rewrite_request& request) override;

  std::chrono::milliseconds timeout() const noexcept {
    return timeout_;
  }

private:
  std::shared_ptr<llm_provider> provider_;
  std::chrono::milliseconds timeout_;
  std::string model_;
};

/// The prompt `llm_rewriter` sends: a system instruction, then one user
/// message holding the memory snippet, the history and the latest message.
/// This function is thread-safe.
std::vector<chat_message> rewrite_prompt(const rewrite_request& request);

/// A shared offline rewriter.
std::shared_ptr<query_rewriter> make_offline_rewriter();

/// Spawns the query rewriter actor serving `impl`. A non-blocking rewriter
/// is answered inline; a blocking one gets a detached one-shot actor per
/// request, so a slow provider call never holds a scheduler thread and
/// never delays another rewrite.
query_rewriter_actor spawn_query_rewriter(caf::actor_system& sys,
                                          std::shared_ptr<query_rewriter> impl);

} // namespace spindle
