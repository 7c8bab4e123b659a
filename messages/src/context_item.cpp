#include "spindle/messages/context_item.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

namespace {

using json = nlohmann::json;

constexpr std::array<std::string_view, 6> type_names{
  "code", "text", "file", "repl-history", "error", "custom",
};

// Shortens a user-supplied value for an error message and keeps it
// printable.
std::string quote(std::string_view text) {
  std::string out = "'";
  for (char c : text.substr(0, 48))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > 48)
    out += "...";
  return out + "'";
}

enum class int_status { ok, not_integer, too_large };

// Reads a JSON integer as JSON Schema draft-07 does: an integral float
// (5.0) is an integer, a boolean is not.
int_status read_int64(const json& v, int64_t& out) {
  switch (v.type()) {
    case json::value_t::number_integer:
      out = v.get<int64_t>();
      return int_status::ok;
    case json::value_t::number_unsigned: {
      auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return int_status::too_large;
      out = static_cast<int64_t>(u);
      return int_status::ok;
    }
    case json::value_t::number_float: {
      auto d = v.get<double>();
      if (!std::isfinite(d) || std::floor(d) != d)
        return int_status::not_integer;
      // 2^63 is exactly representable; everything below it fits int64_t.
      if (d >= 9223372036854775808.0 || d < -9223372036854775808.0)
        return int_status::too_large;
      out = static_cast<int64_t>(d);
      return int_status::ok;
    }
    default:
      return int_status::not_integer;
  }
}

caf::error check_line(json& metadata, const char* key,
                      std::optional<int64_t>& out) {
  auto i = metadata.find(key);
  if (i == metadata.end())
    return caf::none;
  int64_t value = 0;
  auto field = std::string{"metadata."} + key;
  switch (read_int64(*i, value)) {
    case int_status::not_integer:
      return make_error(errc::malformed, field + " must be an integer, got "
                                           + std::string{i->type_name()});
    case int_status::too_large:
      return make_error(errc::invalid_argument, field + " is too large");
    case int_status::ok:
      break;
  }
  if (value < 1)
    return make_error(errc::invalid_argument, field + " must be at least 1, got "
                                                + std::to_string(value));
  *i = value; // canonical: an integer, never 5.0
  out = value;
  return caf::none;
}

caf::error check_string(const json& metadata, const char* key) {
  auto i = metadata.find(key);
  if (i == metadata.end() || i->is_string())
    return caf::none;
  return make_error(errc::malformed, std::string{"metadata."} + key
                                       + " must be a string, got "
                                       + i->type_name());
}

// Serializes metadata (already normalized); empty text for null.
caf::expected<std::string> serialize_metadata(const json& metadata) {
  if (metadata.is_null())
    return std::string{};
  try {
    return metadata.dump();
  } catch (const json::type_error&) {
    return make_error(errc::malformed, "metadata contains invalid UTF-8");
  }
}

caf::error check_content(const std::string& content) {
  if (!is_valid_utf8(content))
    return make_error(errc::malformed, "content is not valid UTF-8");
  return caf::none;
}

} // namespace

std::string to_string(context_type x) {
  auto i = static_cast<size_t>(x);
  return i < type_names.size() ? std::string{type_names[i]} : "unknown";
}

caf::expected<context_type> parse_context_type(std::string_view text) {
  for (size_t i = 0; i < type_names.size(); ++i)
    if (type_names[i] == text)
      return all_context_types[i];
  return make_error(errc::invalid_argument,
                    "type " + quote(text)
                      + " is not one of code, text, file, repl-history, "
                        "error, custom");
}

int64_t universal_time_now() {
  auto unix_seconds = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  return static_cast<int64_t>(unix_seconds) + universal_time_offset;
}

bool is_valid_utf8(std::string_view text) noexcept {
  size_t i = 0;
  auto n = text.size();
  auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < n) {
    auto c = byte(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF; // allowed range of the 2nd byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0)
        lo = 0xA0; // no overlong forms
      else if (c == 0xED)
        hi = 0x9F; // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0)
        lo = 0x90;
      else if (c == 0xF4)
        hi = 0x8F; // nothing above U+10FFFF
    } else {
      return false;
    }
    if (i + len > n)
      return false;
    if (byte(i + 1) < lo || byte(i + 1) > hi)
      return false;
    for (size_t k = 2; k < len; ++k)
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF)
        return false;
    i += len;
  }
  return true;
}

caf::expected<json> normalize_context_metadata(json metadata) {
  if (metadata.is_null())
    return metadata;
  if (!metadata.is_object())
    return make_error(errc::malformed, "metadata must be an object or null, got "
                                         + std::string{metadata.type_name()});
  for (auto key : {"filename", "package"})
    if (auto err = check_string(metadata, key))
      return err;
  std::optional<int64_t> start, end;
  if (auto err = check_line(metadata, "start_line", start))
    return err;
  if (auto err = check_line(metadata, "end_line", end))
    return err;
  if (start && end && *start > *end)
    return make_error(errc::invalid_argument,
                      "metadata.start_line (" + std::to_string(*start)
                        + ") is after metadata.end_line ("
                        + std::to_string(*end) + ")");
  if (auto text = serialize_metadata(metadata); !text)
    return text.error();
  return metadata;
}

// -- context_item ------------------------------------------------------------

caf::expected<context_item> context_item::make(std::string id,
                                               context_type type,
                                               std::string content,
                                               json metadata,
                                               int64_t timestamp) {
  if (!parse_context_id(id))
    return make_error(errc::invalid_id,
                      "id " + quote(id)
                        + " is not a context item ID (ctx-N, N >= 1)");
  if (static_cast<size_t>(type) >= type_names.size())
    return make_error(errc::invalid_argument,
                      "type " + std::to_string(static_cast<int>(type))
                        + " is not a context type");
  if (auto err = check_content(content))
    return err;
  auto normalized = normalize_context_metadata(std::move(metadata));
  if (!normalized)
    return normalized.error();
  if (timestamp < 0)
    return make_error(errc::invalid_argument,
                      "timestamp must be at least 0, got "
                        + std::to_string(timestamp));
  auto text = serialize_metadata(*normalized);
  if (!text)
    return text.error();
  context_item item;
  item.id_ = std::move(id);
  item.type_ = type;
  item.content_ = std::move(content);
  item.metadata_ = std::move(*text);
  item.timestamp_ = timestamp;
  return item;
}

uint64_t context_item::sequence() const noexcept {
  auto n = parse_context_id(id_);
  return n ? *n : 0;
}

json context_item::metadata() const {
  if (metadata_.empty())
    return nullptr;
  // Written by make() from a valid object; a hand-built item (CAF
  // deserialization) with broken text reads as no metadata.
  auto parsed = json::parse(metadata_, nullptr, false);
  return parsed.is_object() ? parsed : json{};
}

caf::expected<context_draft> make_context_draft(context_type type,
                                                std::string content,
                                                json metadata) {
  if (static_cast<size_t>(type) >= type_names.size())
    return make_error(errc::invalid_argument,
                      "type " + std::to_string(static_cast<int>(type))
                        + " is not a context type");
  if (auto err = check_content(content))
    return err;
  auto normalized = normalize_context_metadata(std::move(metadata));
  if (!normalized)
    return normalized.error();
  auto text = serialize_metadata(*normalized);
  if (!text)
    return text.error();
  return context_draft{type, std::move(content), std::move(*text)};
}

caf::expected<context_item> make_context_item(const context_draft& draft,
                                              std::string id,
                                              int64_t timestamp) {
  json metadata;
  if (!draft.metadata.empty()) {
    metadata = json::parse(draft.metadata, nullptr, false);
    if (metadata.is_discarded())
      return make_error(errc::malformed, "metadata is not valid JSON");
  }
  return context_item::make(std::move(id), draft.type, draft.content,
                            std::move(metadata), timestamp);
}

// -- JSON codec --------------------------------------------------------------

json context_item_to_json(const context_item& item) {
  // Insertion order is irrelevant to nlohmann::json (keys sort); the set of
  // keys is exactly the schema's.
  return json{
    {"id", item.id()},
    {"type", to_string(item.type())},
    {"content", item.content()},
    {"metadata", item.metadata()},
    {"timestamp", item.timestamp()},
  };
}

caf::expected<context_item> context_item_from_json(const json& j) {
  if (!j.is_object())
    return make_error(errc::malformed, "a context item must be a JSON object, got "
                                         + std::string{j.type_name()});
  static constexpr std::array<std::string_view, 5> known{
    "id", "type", "content", "metadata", "timestamp"};
  for (auto& [key, value] : j.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      return make_error(errc::malformed,
                        "unknown property " + quote(key)
                          + " (allowed: id, type, content, metadata, "
                            "timestamp)");
  for (auto key : {"id", "type", "content", "timestamp"})
    if (!j.contains(key))
      return make_error(errc::malformed,
                        std::string{"missing required property '"} + key
                          + "'");
  auto& id = j["id"];
  if (!id.is_string())
    return make_error(errc::malformed, "id must be a string, got "
                                         + std::string{id.type_name()});
  if (!parse_context_id(id.get_ref<const std::string&>()))
    return make_error(errc::invalid_id,
                      "id " + quote(id.get_ref<const std::string&>())
                        + " is not a context item ID (ctx-N, N >= 1)");
  auto& type_value = j["type"];
  if (!type_value.is_string())
    return make_error(errc::malformed, "type must be a string, got "
                                         + std::string{type_value.type_name()});
  auto type = parse_context_type(type_value.get_ref<const std::string&>());
  if (!type)
    return type.error();
  auto& content = j["content"];
  if (!content.is_string())
    return make_error(errc::malformed, "content must be a string, got "
                                         + std::string{content.type_name()});
  json metadata;
  if (auto i = j.find("metadata"); i != j.end())
    metadata = *i;
  auto& ts = j["timestamp"];
  int64_t timestamp = 0;
  switch (read_int64(ts, timestamp)) {
    case int_status::not_integer:
      return make_error(errc::malformed, "timestamp must be an integer, got "
                                           + std::string{ts.type_name()});
    case int_status::too_large:
      return make_error(errc::invalid_argument, "timestamp is too large");
    case int_status::ok:
      break;
  }
  return context_item::make(id.get<std::string>(), *type,
                            content.get<std::string>(), std::move(metadata),
                            timestamp);
}

caf::expected<context_item> parse_context_item(std::string_view text) {
  auto j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded())
    return make_error(errc::malformed, "context item is not valid JSON");
  return context_item_from_json(j);
}

caf::expected<context_draft> context_draft_from_json(const json& j) {
  if (!j.is_object())
    return make_error(errc::malformed, "a context draft must be a JSON object, got "
                                         + std::string{j.type_name()});
  for (auto& [key, value] : j.items())
    if (key != "type" && key != "content" && key != "metadata")
      return make_error(errc::malformed,
                        "unknown property " + quote(key)
                          + " (allowed: type, content, metadata)");
  auto type = context_type::code;
  if (auto i = j.find("type"); i != j.end()) {
    if (!i->is_string())
      return make_error(errc::malformed, "type must be a string, got "
                                           + std::string{i->type_name()});
    auto parsed = parse_context_type(i->get_ref<const std::string&>());
    if (!parsed)
      return parsed.error();
    type = *parsed;
  }
  auto content = j.find("content");
  if (content == j.end())
    return make_error(errc::malformed, "missing required property 'content'");
  if (!content->is_string())
    return make_error(errc::malformed, "content must be a string, got "
                                         + std::string{content->type_name()});
  json metadata;
  if (auto i = j.find("metadata"); i != j.end())
    metadata = *i;
  return make_context_draft(type, content->get<std::string>(),
                            std::move(metadata));
}

// -- markdown ------------------------------------------------------------------

std::string_view context_heading(context_type type) noexcept {
  switch (type) {
    case context_type::code:
      return "Code";
    case context_type::text:
      return "Text";
    case context_type::file:
      return "File";
    case context_type::repl_history:
      return "REPL History";
    case context_type::error:
      return "Error";
    case context_type::custom:
      return "Custom";
  }
  return "Context";
}

std::string_view language_for(std::string_view filename) noexcept {
  struct entry {
    std::string_view key;
    std::string_view language;
  };
  // Whole file names first (compared without case), then extensions.
  static constexpr entry names[] = {
    {"cmakelists.txt", "cmake"}, {"makefile", "makefile"},
    {"gnumakefile", "makefile"}, {"dockerfile", "dockerfile"},
  };
  static constexpr entry extensions[] = {
    {"lisp", "lisp"},      {"lsp", "lisp"},        {"cl", "lisp"},
    {"asd", "lisp"},       {"el", "elisp"},        {"scm", "scheme"},
    {"ss", "scheme"},      {"rkt", "racket"},      {"clj", "clojure"},
    {"cljs", "clojure"},   {"cljc", "clojure"},    {"edn", "clojure"},
    {"c", "c"},            {"h", "c"},             {"cc", "cpp"},
    {"cpp", "cpp"},        {"cxx", "cpp"},         {"c++", "cpp"},
    {"hh", "cpp"},         {"hpp", "cpp"},         {"hxx", "cpp"},
    {"ipp", "cpp"},        {"py", "python"},       {"pyi", "python"},
    {"js", "javascript"},  {"mjs", "javascript"},  {"cjs", "javascript"},
    {"ts", "typescript"},  {"tsx", "tsx"},         {"jsx", "jsx"},
    {"rs", "rust"},        {"go", "go"},           {"java", "java"},
    {"kt", "kotlin"},      {"scala", "scala"},     {"rb", "ruby"},
    {"php", "php"},        {"pl", "perl"},         {"lua", "lua"},
    {"hs", "haskell"},     {"ml", "ocaml"},        {"erl", "erlang"},
    {"ex", "elixir"},      {"exs", "elixir"},      {"swift", "swift"},
    {"cs", "csharp"},      {"sh", "bash"},         {"bash", "bash"},
    {"zsh", "zsh"},        {"fish", "fish"},       {"ps1", "powershell"},
    {"sql", "sql"},        {"json", "json"},       {"yaml", "yaml"},
    {"yml", "yaml"},       {"toml", "toml"},       {"ini", "ini"},
    {"xml", "xml"},        {"html", "html"},       {"htm", "html"},
    {"css", "css"},        {"md", "markdown"},     {"cmake", "cmake"},
    {"diff", "diff"},      {"patch", "diff"},      {"proto", "protobuf"},
  };
  auto equal_nocase = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size())
      return false;
    for (size_t i = 0; i < a.size(); ++i) {
      auto x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] + 32) : a[i];
      if (x != b[i])
        return false;
    }
    return true;
  };
  auto slash = filename.find_last_of("/\\");
  auto base = slash == std::string_view::npos ? filename
                                              : filename.substr(slash + 1);
  for (auto& e : names)
    if (equal_nocase(base, e.key))
      return e.language;
  auto dot = base.rfind('.');
  if (dot == std::string_view::npos || dot == 0)
    return {};
  auto ext = base.substr(dot + 1);
  for (auto& e : extensions)
    if (equal_nocase(ext, e.key))
      return e.language;
  return {};
}

std::string fence_for(std::string_view content) {
  size_t longest = 0, run = 0;
  for (char c : content) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return std::string(std::max<size_t>(3, longest + 1), '`');
}

namespace {

// A heading line ends at the first line break; control characters in a
// file name must not start a new markdown block.
std::string single_line(std::string_view text) {
  std::string out{text};
  for (auto& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      c = ' ';
  return out;
}

} // namespace

std::string render_markdown(const context_item& item) {
  std::string out = "### ";
  out += context_heading(item.type());
  out += '\n';
  std::string_view language;
  auto metadata = item.metadata();
  std::string filename;
  if (metadata.is_object()) {
    if (auto f = metadata.find("filename"); f != metadata.end() && f->is_string())
      filename = f->get<std::string>();
  }
  if (!filename.empty()) {
    out += "#### ";
    out += single_line(filename);
    auto start = metadata.find("start_line");
    auto end = metadata.find("end_line");
    if (start != metadata.end() && start->is_number_integer()) {
      out += ':';
      out += std::to_string(start->get<int64_t>());
      if (end != metadata.end() && end->is_number_integer()) {
        out += '-';
        out += std::to_string(end->get<int64_t>());
      }
    }
    out += '\n';
    language = language_for(filename);
  }
  auto fence = fence_for(item.content());
  out += fence;
  out += language;
  out += '\n';
  out += item.content();
  if (!item.content().empty() && item.content().back() != '\n')
    out += '\n';
  out += fence;
  out += '\n';
  return out;
}

std::string render_markdown(const std::vector<context_item>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0)
      out += '\n';
    out += render_markdown(items[i]);
  }
  return out;
}

} // namespace spindle
