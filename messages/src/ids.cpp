#include "spindle/messages/ids.hpp"

#include <limits>

#include "spindle/messages/error.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/task_id.hpp"

namespace spindle {

caf::expected<counter_kind> classify_counter_key(std::string_view key) {
  if (key == counter_keys::context)
    return counter_kind::context;
  if (key == counter_keys::orchestration)
    return counter_kind::orchestration;
  auto id = task_id::parse(key);
  if (!id)
    return make_error(errc::invalid_id,
                      "counter key must be 'ctx', 'global' or a task ID: "
                        + describe(id.error()));
  return counter_kind::task;
}

uint64_t max_sequence(counter_kind kind) noexcept {
  if (kind == counter_kind::context)
    return static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return hybrid36::max_ordinal;
}

caf::expected<std::string> render_id(std::string_view key, uint64_t n) {
  auto kind = classify_counter_key(key);
  if (!kind)
    return kind.error();
  if (n == 0 || n > max_sequence(*kind))
    return make_error(errc::exhausted, "value " + std::to_string(n)
                                         + " is outside counter '"
                                         + std::string{key} + "'");
  switch (*kind) {
    case counter_kind::context:
      return format_context_id(n);
    case counter_kind::orchestration:
      return *hybrid36::format(n);
    case counter_kind::task:
    default:
      return task_id::parse(key)->child(n).to_string();
  }
}

caf::expected<std::vector<std::string>> render_ids(const id_range& range) {
  std::vector<std::string> out;
  out.reserve(range.count);
  for (uint64_t i = 0; i < range.count; ++i) {
    auto id = render_id(range.key, range.first + i);
    if (!id)
      return id.error();
    out.push_back(std::move(*id));
  }
  return out;
}

namespace {

std::string shorten(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 48))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > 48)
    out += "...";
  return out;
}

} // namespace

bool valid_tenant_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > max_tenant_id)
    return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
      return false;
  return true;
}

std::string_view tenant_of_id(std::string_view id) noexcept {
  auto sep = id.find(tenant_separator);
  return sep == std::string_view::npos ? std::string_view{}
                                       : id.substr(0, sep);
}

std::string_view local_id(std::string_view id) noexcept {
  auto sep = id.find(tenant_separator);
  return sep == std::string_view::npos ? id : id.substr(sep + 1);
}

std::string qualify_id(std::string_view prefix, std::string_view id) {
  std::string out;
  out.reserve(prefix.size() + id.size());
  out.append(prefix).append(id);
  return out;
}

caf::error validate_thread_id(std::string_view whole) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_id,
                      "thread_id '" + shorten(whole) + "' is invalid: " + why);
  };
  auto id = whole;
  if (auto sep = whole.find(tenant_separator); sep != std::string_view::npos) {
    if (!valid_tenant_id(whole.substr(0, sep)))
      return bad("its tenant must have 1 to 32 characters of a-z 0-9");
    id = whole.substr(sep + 1);
    // An end user's thread: TENANT~USER~ID.
    if (auto user_sep = id.find(tenant_separator);
        user_sep != std::string_view::npos) {
      if (auto err = validate_client_user_id(id.substr(0, user_sep)))
        return bad("its end user is invalid");
      id = id.substr(user_sep + 1);
    }
  }
  if (id.empty() || id.size() > 128)
    return bad("it must have 1 to 128 characters");
  if (id == "." || id == "..")
    return bad("'.' and '..' are reserved");
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':'
              || c == '-';
    if (!ok)
      return bad("only A-Z a-z 0-9 . _ : - are allowed");
  }
  return caf::none;
}

caf::error validate_client_thread_id(std::string_view id) {
  if (id.find(tenant_separator) != std::string_view::npos)
    return make_error(errc::invalid_id,
                      "thread_id '" + shorten(id)
                        + "' is invalid: only A-Z a-z 0-9 . _ : - are "
                          "allowed");
  return validate_thread_id(id);
}

caf::error validate_agent_name(std::string_view name) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_id,
                      "agent '" + shorten(name) + "' is invalid: " + why);
  };
  if (name.empty() || name.size() > 64)
    return bad("it must have 1 to 64 characters");
  if (name[0] == '.' || name[0] == '-')
    return bad("it must not start with '.' or '-'");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return bad("only A-Z a-z 0-9 . _ - are allowed");
  }
  return caf::none;
}

std::string format_context_id(uint64_t n) {
  return "ctx-" + std::to_string(n);
}

std::optional<uint64_t> parse_context_id(std::string_view text) {
  constexpr std::string_view prefix = "ctx-";
  if (text.substr(0, prefix.size()) != prefix)
    return std::nullopt;
  auto digits = text.substr(prefix.size());
  if (digits.empty() || digits.size() > 19 || digits[0] == '0')
    return std::nullopt;
  uint64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9')
      return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > max_sequence(counter_kind::context))
    return std::nullopt;
  return value;
}

} // namespace spindle
