#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/chat.hpp"
#include "spindle/messages/prompt.hpp"
#include "spindle/messages/threads.hpp"

// The context builder and the query rewriter: what they are asked, what they
// answer, and the pure prompt assembly of D7.

namespace spindle {

// -- query rewriting ----------------------------------------------------------

/// What a rewriter sees: the original message, the history window (oldest
/// first) and the long-term memory snippet (empty if none).
struct rewrite_request {
  std::string message;
  std::vector<chat_message> history;
  std::string memory_snippet;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rewrite_request& x) {
  return f(caf::meta::type_name("rewrite_request"), x.message, x.history,
           x.memory_snippet);
}

/// A rewriter's answer. `query` is never empty: on any failure it is the
/// original message and `fallback` says why ("error: ...", "timeout",
/// "empty output"); `fallback` is empty when the rewriter answered.
struct rewrite_result {
  std::string query;
  std::string fallback;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rewrite_result& x) {
  return f(caf::meta::type_name("rewrite_result"), x.query, x.fallback);
}

/// `(rewrite, request)` replies with a rewrite_result; it never fails (a
/// failure is a fallback to the original) and never touches a thread.
using query_rewriter_actor = caf::typed_actor<
  caf::replies_to<rewrite_atom, rewrite_request>::with<rewrite_result>>;

// -- prompt assembly (D7) -----------------------------------------------------

/// The prefix of the long-term memory system message.
inline constexpr std::string_view memory_message_prefix = "Long-term memory:\n";

/// The last message's content: `original` if `rewritten` is empty or equal
/// to it, else "Original user message:\n{original}\n\n---\n\n
/// Contextualized query:\n{rewritten}". The original is always in it.
/// This function is thread-safe.
std::string final_user_content(const std::string& original,
                               const std::string& rewritten);

/// The content of the tool result a prompt gives a call that has none
/// stored (`close_tool_calls`).
inline constexpr std::string_view interrupted_tool_result
  = "interrupted: no result was stored for this tool call";

/// History as an upstream takes it: every assistant message that calls
/// tools is followed at once by one tool message per call, in the calls'
/// order: the call's stored result (moved there if it was stored later),
/// else one saying the call was interrupted (`interrupted_tool_result`).
/// Tool messages answering no call of the history (their call fell out of
/// the window) are left out. Stored turns are not changed: only the
/// prompt is. This function is thread-safe.
std::vector<chat_message> close_tool_calls(std::vector<chat_message> history);

/// The messages of a prompt, in D7's order: the system prompt (if
/// non-empty); "Long-term memory:\n{snippet}" as a system message (if the
/// snippet is non-empty); the history turns in the order given, with their
/// tool calls closed (`close_tool_calls`); the current user message
/// (`final_user_content`). This function is thread-safe.
std::vector<chat_message> assemble_messages(const std::string& system_prompt,
                                            const std::string& memory_snippet,
                                            const std::vector<turn>& history,
                                            const std::string& original,
                                            const std::string& rewritten);

/// `assemble_messages` with the history already converted to chat
/// messages (`to_chat_message`), which it moves into the prompt.
std::vector<chat_message> assemble_messages(const std::string& system_prompt,
                                            const std::string& memory_snippet,
                                            std::vector<chat_message> history,
                                            const std::string& original,
                                            const std::string& rewritten);

// -- token budgets -------------------------------------------------------------

/// The most a context window may be (`max_context_tokens`), in tokens.
inline constexpr uint64_t max_context_tokens_limit = 10'000'000;
/// The server's default context window and reply reserve
/// (`--context-tokens`, `--reply-tokens`).
inline constexpr uint64_t default_context_tokens = 128'000;
inline constexpr uint64_t default_reply_tokens = 4'096;

/// What went into a prompt and what each part cost (the `/context` route's
/// `manifest`). Token counts are by the builder's encoding
/// (messages/tokens.hpp); `encoding` is empty and every count 0 when the
/// builder counts nothing.
struct context_manifest {
  std::string encoding;
  /// The model's window and the reply's reserve; `budget`, their
  /// difference, is what the prompt may take.
  uint64_t max_context_tokens = 0;
  uint64_t reply_tokens = 0;
  uint64_t budget = 0;
  /// Per part: the system prompt, the thread's summary, the memory
  /// snippet, the history, the current user message (with its
  /// contextualized query).
  uint64_t system_tokens = 0;
  uint64_t summary_tokens = 0;
  uint64_t memory_tokens = 0;
  uint64_t history_tokens = 0;
  uint64_t message_tokens = 0;
  /// The whole prompt, the reply's primer included: at most `budget`.
  uint64_t total_tokens = 0;
  /// The thread's indexes (0 = its first turn) of the history turns in the
  /// prompt, ascending.
  std::vector<uint64_t> turns;
  /// Turns of the history window not in the prompt: the oldest, left out
  /// for the budget, and tool results whose call is not in the window.
  uint64_t turns_left_out = 0;
  /// The long-term memory entries the snippet shows.
  std::vector<int64_t> memory_entries;
  /// The turns the thread's summary covers: [0, summary_upto); 0 when it
  /// has none. In the prompt unless `summary_left_out`.
  uint64_t summary_upto = 0;
  /// The thread has a summary but it did not fit the budget.
  bool summary_left_out = false;
  /// A snippet was retrieved but did not fit the budget.
  bool memory_left_out = false;
  /// The contextualized query did not fit the budget: the message went
  /// alone.
  bool rewrite_left_out = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, context_manifest& x) {
  return f(caf::meta::type_name("context_manifest"), x.encoding,
           x.max_context_tokens, x.reply_tokens, x.budget, x.system_tokens,
           x.summary_tokens, x.memory_tokens, x.history_tokens,
           x.message_tokens, x.total_tokens, x.turns, x.turns_left_out,
           x.memory_entries, x.summary_upto, x.summary_left_out,
           x.memory_left_out, x.rewrite_left_out);
}

class token_counter;

/// What a prompt is made of, before it is fitted to a budget.
struct prompt_parts {
  std::string system_prompt;
  /// The system message's tokens when the caller knows them (0: counted).
  uint64_t system_tokens = 0;
  /// The snippet, the entries it shows, and its tokens when the reader
  /// counted them in the counter's encoding (0: counted here).
  std::string memory_snippet;
  std::vector<int64_t> memory_entries;
  uint64_t memory_snippet_tokens = 0;
  /// The tokens of `memory_message_prefix` when the caller knows them (0:
  /// counted).
  uint64_t memory_prefix_tokens = 0;
  /// The thread's summary (`upto` 0: none).
  thread_summary summary;
  /// The history window, oldest first, and the thread index of its first
  /// turn.
  std::vector<turn> history;
  uint64_t first_index = 0;
  std::string original;
  std::string rewritten;
};

/// The prompt of `parts` within `max_context_tokens - reply_tokens` tokens
/// by `counter` (docs/builder.md, "The token budget"). The parts are taken
/// in this order, each only if it fits what the earlier ones left: the
/// system prompt and the current user message (with the contextualized
/// query, else alone: `rewrite_left_out`), the thread's summary (whole or
/// not at all: `summary_left_out`; with it, the history starts after the
/// turns it covers), the memory snippet (whole or not at all:
/// `memory_left_out`), then the newest history that fits: an
/// assistant message with its tool results as one unit, and once anything
/// was left out, never starting with an assistant or tool message (D6).
/// The prompt's order: the system prompt, the summary, the memory, the
/// history, the message (D7). Turns use their stored counts when they
/// were counted with `counter`'s encoding. `manifest` receives the counts.
/// Errors: `too_large` when the system prompt and the message alone do not
/// fit (both counts and the budget in the text); `invalid_argument` when
/// `reply_tokens` leaves no budget. The prompt owns copies of the turns it
/// keeps. This function is thread-safe.
caf::expected<prompt>
fit_prompt(const token_counter& counter, uint64_t max_context_tokens,
           uint64_t reply_tokens, const prompt_parts& parts,
           context_manifest& manifest);

/// `fit_prompt` with the history window given by `history` (oldest first,
/// the turns it points to outliving the call) instead of `parts.history`,
/// which is not read: a caller holding turns it may not move, such as a
/// thread's published log, fits them in place. With `owner`, which keeps
/// those turns alive and unchanged (the log), the prompt reads the turns
/// it keeps in place and keeps `owner`; without, it owns copies of them.
/// This function is thread-safe.
caf::expected<prompt>
fit_prompt(const token_counter& counter, uint64_t max_context_tokens,
           uint64_t reply_tokens, const prompt_parts& parts,
           const std::vector<const turn*>& history,
           context_manifest& manifest,
           std::shared_ptr<const void> owner = nullptr);

/// Errors: `invalid_argument` naming `max_context_tokens` when it is not in
/// (reply_tokens, max_context_tokens_limit]. Thread-safe.
caf::error validate_context_tokens(uint64_t max_context_tokens,
                                   uint64_t reply_tokens);

// -- the context builder ------------------------------------------------------

/// How to build one prompt.
struct build_options {
  /// History window (D6); at least 2.
  uint64_t max_turns = builder_default_max_turns;
  /// Empty uses the builder's default system prompt.
  std::string system_prompt;
  /// Retrieve a long-term memory snippet.
  bool memory = true;
  /// Ask the query rewriter.
  bool rewrite = true;
  /// The model's context window in tokens, the reply's reserve included
  /// (docs/builder.md, "The token budget"); 0: the builder's default.
  uint64_t max_context_tokens = 0;
  /// Copy the history turns the prompt holds into `short_term_history`
  /// (the `/context` route shows them). An exchange asks false: the
  /// prompt's messages already hold the turns, and `history_turns` counts
  /// them.
  bool turns = true;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, build_options& x) {
  return f(caf::meta::type_name("build_options"), x.max_turns,
           x.system_prompt, x.memory, x.rewrite, x.max_context_tokens,
           x.turns);
}

/// One build: for `message` in `thread_id`, on behalf of `user_id` (empty:
/// anonymous).
struct build_request {
  std::string thread_id;
  std::string user_id;
  std::string message;
  build_options options;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, build_request& x) {
  return f(caf::meta::type_name("build_request"), x.thread_id, x.user_id,
           x.message, x.options);
}

/// Errors: `invalid_id` (thread or user), `invalid_argument` (empty
/// message, max_turns < 2), `too_large` (message). Thread-safe.
caf::error validate_build_request(const build_request& x);

/// A built prompt and what went into it.
struct built_context {
  /// The prompt, in D7's order. Its history turns are read in place from
  /// the thread's log when the thread was resident (`prompt`).
  prompt messages;
  /// The history window used (oldest first); empty for an unknown thread,
  /// and when the request asked for no copy (`build_options::turns`).
  std::vector<turn> short_term_history;
  /// The number of history turns in the prompt (`short_term_history`'s
  /// size when it is copied).
  uint64_t history_turns = 0;
  /// The long-term memory snippet (empty if none or disabled).
  std::string memory_snippet;
  /// The rewriter's query; equal to the original message when there was no
  /// rewrite, it was disabled, or it fell back.
  std::string rewritten_query;
  /// Why the rewrite fell back to the original (empty otherwise).
  std::string rewrite_fallback;
  /// False if the thread does not exist (nothing was created).
  bool thread_found = false;
  /// The thread's turn count when its history was read.
  uint64_t total_turns = 0;
  /// The thread actor's ID (0 if not found), for logs.
  uint64_t thread_actor_id = 0;
  /// What went into `messages` and what each part cost.
  context_manifest manifest;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, built_context& x) {
  return f(caf::meta::type_name("built_context"), x.messages,
           x.short_term_history, x.history_turns, x.memory_snippet, x.rewritten_query,
           x.rewrite_fallback, x.thread_found, x.total_turns,
           x.thread_actor_id, x.manifest);
}

/// The context builder. `(buildctx, request)` replies with the prompt.
/// It reads through the registry's `get` and the thread's `history` only:
/// it never creates, clears or appends to a thread. A memory failure leaves
/// the snippet empty and a rewriter failure falls back to the original
/// (both logged). Errors: as `validate_build_request`, `timeout` or
/// `unavailable` if the registry or the thread does not answer.
using context_builder_actor = caf::typed_actor<
  caf::replies_to<build_context_atom, build_request>::with<built_context>>;

} // namespace spindle
