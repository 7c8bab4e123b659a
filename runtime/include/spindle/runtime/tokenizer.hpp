#pragma once

// Exact token counts for OpenAI's models (docs/tokens.md): the byte-pair
// encodings o200k_base and cl100k_base, equal token for token to OpenAI's
// tiktoken (`encode_ordinary`), the model -> encoding table, and the chat
// format's per-message overhead. The rank tables are embedded in the
// library: nothing is read from disk or the network at run time.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::tokens {

/// One of OpenAI's byte-pair encodings. Immutable once loaded, shared by
/// every caller of the process; all member functions are thread-safe.
class encoding {
public:
  /// The encoding named `name` (`o200k_base`, `cl100k_base`), loaded on
  /// the first call for that name (its rank table is inflated and indexed,
  /// a few tens of milliseconds; concurrent first callers wait for one
  /// load); null for any other name. The object lives until the process
  /// ends. This function is thread-safe.
  static const encoding* find(std::string_view name);

  /// The encoding's name, e.g. "o200k_base".
  std::string_view name() const noexcept;

  /// The tokens of `text`, as tiktoken's `encode_ordinary`: special-token
  /// text such as `<|endoftext|>` is ordinary text. `text` is UTF-8; an
  /// invalid sequence counts as U+FFFD, as a WHATWG decoder reads it (each
  /// maximal invalid subpart is one replacement character).
  std::vector<uint32_t> encode(std::string_view text) const;

  /// Appends the tokens of `text` to `out` (see `encode`).
  void encode(std::string_view text, std::vector<uint32_t>& out) const;

  /// The number of tokens `encode(text)` returns, without building them.
  size_t count(std::string_view text) const;

  /// The bytes of `tokens`, concatenated (not necessarily valid UTF-8: a
  /// token may end inside a character). Throws std::out_of_range for a
  /// token outside the vocabulary.
  std::string decode(const std::vector<uint32_t>& tokens) const;

  /// Tokens in the rank table (special tokens excluded).
  size_t vocabulary_size() const noexcept;

  /// Seconds the load of this encoding took (inflate, index, compile the
  /// split pattern).
  double load_seconds() const noexcept;

  struct impl;
  explicit encoding(std::unique_ptr<impl> self);
  ~encoding();
  encoding(const encoding&) = delete;
  encoding& operator=(const encoding&) = delete;

private:
  std::unique_ptr<impl> impl_;
};

/// The encodings `encoding::find` knows, in a stable order.
const std::vector<std::string>& encoding_names();

/// The encoding a model's tokens are counted with.
struct model_encoding {
  /// `o200k_base` or `cl100k_base`.
  std::string encoding;
  /// False when the model is in neither of tiktoken's tables (exact names,
  /// then prefixes such as `gpt-4o-` or `ft:gpt-4`): `encoding` is then the
  /// default, `o200k_base`.
  bool known = false;
};

/// tiktoken's model table (docs/tokens.md, "Models"), restricted to the
/// two encodings. A pure function; thread-safe.
model_encoding encoding_for_model(std::string_view model);

/// One chat message as counted: every field is encoded.
struct message_text {
  std::string_view role;
  std::string_view content;
  /// The author's name, when the message has one (even an empty one).
  std::optional<std::string_view> name;
};

/// The chat format's overhead, from OpenAI's cookbook "How to count tokens
/// with tiktoken": tokens around each message, for a name, and for the
/// reply's primer (`<|start|>assistant<|message|>`).
inline constexpr size_t tokens_per_message = 3;
inline constexpr size_t tokens_per_name = 1;
inline constexpr size_t tokens_reply_primer = 3;

/// The prompt tokens of `messages` for a chat completion: per message 3
/// plus its encoded role, content and name (plus 1 when it has a name),
/// plus 3 for the reply's primer.
size_t count_messages(const encoding& enc,
                      const std::vector<message_text>& messages);

} // namespace spindle::tokens

namespace spindle {

class token_counter;

/// The counter (messages/tokens.hpp) threads and the context builder use,
/// over the encoding named `name` (`o200k_base`, `cl100k_base`); null for
/// any other name. Thread-safe; lives until the process ends.
std::shared_ptr<const token_counter> make_token_counter(std::string_view name);

} // namespace spindle
