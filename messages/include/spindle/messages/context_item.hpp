#pragma once

// Context items (seeds 000, 002): a piece of code or text with metadata that
// can be put into an LLM prompt. This header holds the value type, its JSON
// codec (the seed's schema, docs/schemas/context-item.schema.json), its
// token estimate and its markdown rendering. Everything here is a pure
// function of its arguments; nothing talks to an actor.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>
#include <nlohmann/json.hpp>

namespace spindle {

/// What a context item holds. The JSON and display names are those of the
/// seed: "code", "text", "file", "repl-history", "error", "custom".
enum class context_type : uint8_t {
  code,
  text,
  file,
  repl_history,
  error,
  custom,
};

/// Every context type, in declaration order.
inline constexpr std::array<context_type, 6> all_context_types{
  context_type::code,         context_type::text,  context_type::file,
  context_type::repl_history, context_type::error, context_type::custom,
};

/// The JSON name of `x`, e.g. "repl-history". This function is thread-safe.
std::string to_string(context_type x);

/// Parses a JSON name of a context type. Errors: `invalid_argument` naming
/// the value and the allowed names. This function is thread-safe.
caf::expected<context_type> parse_context_type(std::string_view text);

/// Seconds between 1900-01-01 and 1970-01-01 (UTC): Universal Time minus
/// Unix time.
inline constexpr int64_t universal_time_offset = 2208988800;

/// The current time as Universal Time (seconds since 1900-01-01 UTC), the
/// seed's timestamp. This function is thread-safe.
int64_t universal_time_now();

/// Estimated LLM tokens of `content`: ceil(UTF-8 bytes / 4). Headings and
/// fences added by rendering are not counted. This function is thread-safe.
inline uint64_t estimate_tokens(std::string_view content) noexcept {
  return (static_cast<uint64_t>(content.size()) + 3) / 4;
}

/// True if `text` is well-formed UTF-8 (no overlong forms, no surrogates,
/// nothing above U+10FFFF). This function is thread-safe.
bool is_valid_utf8(std::string_view text) noexcept;

/// Checks context metadata and returns it in canonical form: null or a JSON
/// object whose conventional keys have their types (filename and package
/// strings; start_line and end_line integers >= 1, start_line <= end_line).
/// Integral floats (5.0) are accepted as integers, as JSON Schema draft-07
/// does, and stored as integers. Other keys pass unchanged. Errors:
/// `malformed` for a wrong JSON type or invalid UTF-8, `invalid_argument`
/// for a value out of range; each names the field, e.g.
/// "metadata.start_line must be at least 1, got 0".
/// This function is thread-safe.
caf::expected<nlohmann::json> normalize_context_metadata(
  nlohmann::json metadata);

/// One context item. Immutable once made: there is no setter, and every
/// item made by `make` (or decoded by `context_item_from_json`) satisfies
/// the codec's rules. A default-constructed item (empty ID) exists only so
/// that CAF can deserialize into it. Copies may be read from any thread.
class context_item {
public:
  context_item() = default;

  /// Makes an item after checking every field: `id` must be `ctx-N`
  /// (`invalid_id`), `content` well-formed UTF-8 (`malformed`), metadata as
  /// for `normalize_context_metadata`, `timestamp` >= 0
  /// (`invalid_argument`). This function is thread-safe.
  static caf::expected<context_item> make(std::string id, context_type type,
                                          std::string content,
                                          nlohmann::json metadata,
                                          int64_t timestamp);

  /// `ctx-N`.
  const std::string& id() const noexcept {
    return id_;
  }

  /// N of `ctx-N`; 0 for a default-constructed item.
  uint64_t sequence() const noexcept;

  context_type type() const noexcept {
    return type_;
  }

  const std::string& content() const noexcept {
    return content_;
  }

  /// The metadata: null or an object.
  nlohmann::json metadata() const;

  /// The metadata as compact JSON text; empty when there is none.
  const std::string& metadata_text() const noexcept {
    return metadata_;
  }

  /// Universal Time (seconds since 1900-01-01 UTC) of creation.
  int64_t timestamp() const noexcept {
    return timestamp_;
  }

  /// `estimate_tokens(content())`.
  uint64_t tokens() const noexcept {
    return estimate_tokens(content_);
  }

  friend bool operator==(const context_item& x, const context_item& y) {
    return x.id_ == y.id_ && x.type_ == y.type_ && x.content_ == y.content_
           && x.metadata_ == y.metadata_ && x.timestamp_ == y.timestamp_;
  }

  friend bool operator!=(const context_item& x, const context_item& y) {
    return !(x == y);
  }

  // Metadata travels as its JSON text: nlohmann::json is not inspectable.
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f,
                                                 context_item& x) {
    return f(caf::meta::type_name("context_item"), x.id_, x.type_,
             x.content_, x.metadata_, x.timestamp_);
  }

private:
  std::string id_;
  context_type type_ = context_type::code;
  std::string content_;
  std::string metadata_;
  int64_t timestamp_ = 0;
};

/// What a caller supplies to create an item; the context manager adds the
/// ID (from the ID allocator) and the timestamp (now).
struct context_draft {
  context_type type = context_type::code;
  std::string content;
  /// Compact JSON text of the metadata; empty for none.
  std::string metadata;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, context_draft& x) {
  return f(caf::meta::type_name("context_draft"), x.type, x.content,
           x.metadata);
}

/// Checks content and metadata as `context_item::make` does and serializes
/// the metadata. This function is thread-safe.
caf::expected<context_draft> make_context_draft(context_type type,
                                                std::string content,
                                                nlohmann::json metadata
                                                = nullptr);

/// Turns a draft into an item with the given ID and timestamp, checking
/// every field (a draft may have been built by hand).
caf::expected<context_item> make_context_item(const context_draft& draft,
                                              std::string id,
                                              int64_t timestamp);

// -- JSON codec (seed 002 schema) -------------------------------------------

/// The item as a JSON object with exactly the keys id, type, content,
/// metadata (null when absent) and timestamp. This function is thread-safe.
nlohmann::json context_item_to_json(const context_item& item);

/// Decodes an item, refusing anything the schema refuses and more. Errors
/// (each names the field): `malformed` for a non-object, a missing required
/// key, an unknown key, a wrong JSON type (content not a string, metadata
/// not an object or null, a conventional metadata key of the wrong type) or
/// invalid UTF-8; `invalid_id` for an id off `ctx-N`; `invalid_argument`
/// for an unknown type, a negative timestamp, start_line or end_line below
/// 1, or start_line > end_line. This function is thread-safe.
caf::expected<context_item> context_item_from_json(const nlohmann::json& j);

/// Parses JSON text and decodes it. Errors: `malformed` for a syntax error,
/// then as `context_item_from_json`. This function is thread-safe.
caf::expected<context_item> parse_context_item(std::string_view text);

/// Decodes a draft: an object with content (required string), type
/// (optional, default "code") and metadata (optional). Any other key,
/// including id and timestamp, is refused as `malformed`.
caf::expected<context_draft> context_draft_from_json(const nlohmann::json& j);

// -- markdown rendering (the seed's context-to-string) ----------------------

/// The heading of a type: Code, Text, File, REPL History, Error, Custom.
std::string_view context_heading(context_type type) noexcept;

/// The fenced-code language for a file name, from its extension or, for a
/// few well-known names, the name itself ("x.lisp" -> "lisp",
/// "a.hpp" -> "cpp", "CMakeLists.txt" -> "cmake"); empty when unknown.
/// Case-insensitive. This function is thread-safe.
std::string_view language_for(std::string_view filename) noexcept;

/// The shortest backtick fence (at least 3) longer than every run of
/// backticks in `content`, so the content cannot close it (CommonMark).
std::string fence_for(std::string_view content);

/// Renders one item as markdown:
///   ### <heading>
///   #### <filename>[:<start>[-<end>]]     (only when metadata has filename)
///   <fence><language>
///   <content>
///   <fence>
/// Every line ends with "\n". This function is thread-safe.
std::string render_markdown(const context_item& item);

/// Renders items in the given order (a window passes oldest first), one
/// blank line between items; empty for no items.
std::string render_markdown(const std::vector<context_item>& items);

} // namespace spindle
