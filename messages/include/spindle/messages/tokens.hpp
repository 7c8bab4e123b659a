#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "spindle/messages/chat.hpp"
#include "spindle/messages/threads.hpp"

// What a prompt costs in tokens (docs/tokens.md, "Chat messages"): the
// rule that prices one chat message, and the interface of a counter that
// applies it with one encoding. The runtime's tokenizer implements the
// counter (runtime/tokenizer.hpp, `make_token_counter`); threads count each
// turn once, when it is stored, and the context builder fills its budget
// with those counts.

namespace spindle {

/// Stable numbers of the encodings, stored beside each turn's count (0: not
/// counted). Never renumbered: a store keeps them.
enum class token_encoding_id : uint8_t {
  none = 0,
  o200k_base = 1,
  cl100k_base = 2,
};

/// Counts tokens with one encoding. Implementations are immutable and
/// thread-safe.
class token_counter {
public:
  virtual ~token_counter();
  /// The encoding's stored number.
  virtual token_encoding_id id() const noexcept = 0;
  /// The encoding's name, e.g. "o200k_base".
  virtual std::string_view name() const noexcept = 0;
  /// The tokens of `text` (tiktoken's `encode_ordinary`).
  virtual size_t count_text(std::string_view text) const = 0;
  /// The tokens of a message's role (`count_text`; counters that know the
  /// roles' counts answer without encoding).
  virtual size_t count_role(std::string_view role) const;
};

/// Tokens around each message (`<|start|>{role}<|message|>...<|end|>`),
/// from OpenAI's cookbook "How to count tokens with tiktoken".
inline constexpr size_t message_overhead_tokens = 3;
/// Tokens of the reply's primer (`<|start|>assistant<|message|>`), once per
/// prompt.
inline constexpr size_t reply_primer_tokens = 3;
/// Tokens around each tool call of an assistant message (spindle's rule:
/// OpenAI does not publish how calls are rendered to the model).
inline constexpr size_t tool_call_overhead_tokens = 3;

/// The tokens of one chat message: 3, plus its role and content encoded,
/// plus its `tool_call_id` encoded (tool messages), plus for each tool call
/// 3 and its ID, function name and arguments encoded. For a message of
/// text only this is the cookbook's count, equal to the reference's.
/// This function is thread-safe.
size_t count_message_tokens(const token_counter& counter,
                            const chat_message& message);

/// `count_message_tokens` of the turn's chat message (`to_chat_message`).
/// This function is thread-safe.
size_t count_turn_tokens(const token_counter& counter, const turn& t);

/// Sets `t.tokens` and `t.token_encoding` to the turn's count with
/// `counter` (the most a count holds: 2^32 - 1).
void count_turn(const token_counter& counter, turn& t);

/// The turn's tokens with `counter`: its stored count when it was counted
/// with the same encoding, else counted now.
size_t turn_tokens(const token_counter& counter, const turn& t);

} // namespace spindle
