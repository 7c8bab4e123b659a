#include "spindle/messages/threads.hpp"

#include <algorithm>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/tools.hpp"

namespace spindle {

// -- turns --------------------------------------------------------------------

const char* to_string(usage_source x) noexcept {
  switch (x) {
    case usage_source::none:
      return "none";
    case usage_source::counted:
      return "counted";
    case usage_source::upstream:
      return "upstream";
  }
  return "unknown";
}

const char* to_string(turn_role x) noexcept {
  switch (x) {
    case turn_role::system:
      return "system";
    case turn_role::user:
      return "user";
    case turn_role::assistant:
      return "assistant";
    case turn_role::tool:
      return "tool";
  }
  return "unknown";
}

caf::expected<turn_role> parse_turn_role(std::string_view name) {
  for (auto role : {turn_role::system, turn_role::user, turn_role::assistant,
                    turn_role::tool})
    if (name == to_string(role))
      return role;
  std::string shown{name.substr(0, 32)};
  return make_error(errc::invalid_argument,
                    "role '" + shown
                      + "' is unknown: use system, user, assistant or tool");
}

caf::error validate_turn(const turn& x) {
  if (static_cast<uint8_t>(x.role) > static_cast<uint8_t>(turn_role::tool))
    return make_error(errc::invalid_argument,
                      "role " + std::to_string(static_cast<int>(x.role))
                        + " is unknown");
  if (x.content.size() > max_turn_content)
    return make_error(errc::too_large,
                      "content has " + std::to_string(x.content.size())
                        + " bytes; a turn holds at most "
                        + std::to_string(max_turn_content));
  if (x.content.empty()
      && (x.role == turn_role::user || x.role == turn_role::system))
    return make_error(errc::invalid_argument,
                      std::string{"content of a "} + to_string(x.role)
                        + " turn must not be empty");
  if (x.role == turn_role::tool) {
    if (x.tool_call_id.empty() || x.tool_call_id.size() > max_tool_call_id)
      return make_error(errc::invalid_argument,
                        "tool_call_id of a tool turn must have 1 to "
                          + std::to_string(max_tool_call_id) + " bytes");
  } else if (!x.tool_call_id.empty()) {
    return make_error(errc::invalid_argument,
                      std::string{"tool_call_id is only for tool turns, not "}
                        + to_string(x.role) + " turns");
  }
  if (x.interrupted && x.role != turn_role::assistant)
    return make_error(errc::invalid_argument,
                      "only assistant turns can be interrupted");
  if (!x.tool_calls.empty()) {
    if (x.role != turn_role::assistant)
      return make_error(errc::invalid_argument,
                        std::string{"tool_calls are only for assistant "
                                    "turns, not "}
                          + to_string(x.role) + " turns");
    if (auto err = validate_tool_calls(x.tool_calls, x.content.size()))
      return err;
  }
  return caf::none;
}

caf::error validate_tool_calls(const std::vector<tool_call>& calls,
                               size_t content_bytes) {
  if (calls.size() > max_tool_calls)
    return make_error(errc::too_large,
                      "tool_calls has " + std::to_string(calls.size())
                        + " calls; a turn makes at most "
                        + std::to_string(max_tool_calls));
  auto bytes = content_bytes;
  for (size_t i = 0; i < calls.size(); ++i) {
    auto& c = calls[i];
    auto field = "tool_calls[" + std::to_string(i) + "]";
    if (c.id.empty() || c.id.size() > max_tool_call_id)
      return make_error(errc::invalid_argument,
                        field + ".id must have 1 to "
                          + std::to_string(max_tool_call_id) + " bytes");
    for (size_t j = 0; j < i; ++j)
      if (calls[j].id == c.id)
        return make_error(errc::invalid_argument,
                          field + ".id '" + c.id
                            + "' is given twice in the turn");
    if (!is_tool_name(c.name))
      return make_error(errc::invalid_argument,
                        field + ".function.name must have 1 to "
                          + std::to_string(max_tool_name)
                          + " characters of A-Z, a-z, 0-9, _ and -");
    bytes += c.arguments.size();
    if (bytes > max_turn_content)
      return make_error(errc::too_large,
                        "content and tool call arguments have more than "
                          + std::to_string(max_turn_content)
                          + " bytes; a turn holds at most that");
  }
  return caf::none;
}

void tool_call_ledger::add(const turn& t) {
  for (auto& c : t.tool_calls)
    made.insert(c.id);
  if (t.role == turn_role::tool)
    answered.insert(t.tool_call_id);
}

caf::error validate_turns_alone(const std::vector<turn>& batch) {
  if (batch.empty())
    return make_error(errc::invalid_argument,
                      "turns must hold at least one turn");
  if (batch.size() > max_turn_batch)
    return make_error(errc::too_large,
                      "turns holds " + std::to_string(batch.size())
                        + " turns; a batch appends at most "
                        + std::to_string(max_turn_batch));
  for (size_t i = 0; i < batch.size(); ++i)
    if (auto err = validate_turn(batch[i]))
      return make_error(classify(err), "turns[" + std::to_string(i)
                                         + "]: " + describe(err));
  return caf::none;
}

caf::error validate_turn_batch(tool_call_ledger ledger,
                               const std::vector<turn>& batch) {
  if (auto err = validate_turns_alone(batch))
    return err;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& t = batch[i];
    auto field = "turns[" + std::to_string(i) + "]";
    for (auto& c : t.tool_calls)
      if (ledger.made.count(c.id) > 0)
        return make_error(errc::invalid_argument,
                          field + ": tool call ID '" + c.id
                            + "' was already used in this thread");
    if (t.role == turn_role::tool) {
      if (ledger.made.count(t.tool_call_id) == 0)
        return make_error(errc::invalid_argument,
                          field + ": tool_call_id '" + t.tool_call_id
                            + "' answers no call this thread made");
      if (ledger.answered.count(t.tool_call_id) > 0)
        return make_error(errc::invalid_argument,
                          field + ": the call '" + t.tool_call_id
                            + "' was already answered");
    }
    ledger.add(t);
  }
  return caf::none;
}

turn make_user_turn(std::string content) {
  return turn{turn_role::user, std::move(content), 0, {}, false};
}

turn make_assistant_turn(std::string content, bool interrupted) {
  return turn{turn_role::assistant, std::move(content), 0, {}, interrupted};
}

turn make_system_turn(std::string content) {
  return turn{turn_role::system, std::move(content), 0, {}, false};
}

turn make_tool_turn(std::string content, std::string tool_call_id) {
  return turn{turn_role::tool, std::move(content), 0, std::move(tool_call_id),
              false};
}

chat_message to_chat_message(const turn& x) {
  return chat_message{to_string(x.role), x.content, x.tool_call_id,
                      x.tool_calls};
}

// -- history windows ----------------------------------------------------------

caf::error validate_max_turns(uint64_t max_turns) {
  if (max_turns < min_max_turns)
    return make_error(errc::invalid_argument,
                      "max_turns must be at least "
                        + std::to_string(min_max_turns) + ", got "
                        + std::to_string(max_turns));
  return caf::none;
}

size_t history_window_start(const std::vector<turn>& turns,
                            size_t max_turns) {
  return history_window_start_in(turns, turns.size(), max_turns);
}

// -- exchanges ----------------------------------------------------------------

const char* to_string(conflict_policy x) noexcept {
  switch (x) {
    case conflict_policy::queue:
      return "queue";
    case conflict_policy::exit:
      return "exit";
    case conflict_policy::fork:
      return "fork";
  }
  return "unknown";
}

caf::expected<conflict_policy> parse_conflict_policy(std::string_view name) {
  for (auto p :
       {conflict_policy::queue, conflict_policy::exit, conflict_policy::fork})
    if (name == to_string(p))
      return p;
  std::string shown{name.substr(0, 32)};
  return make_error(errc::invalid_argument,
                    "on_conflict '" + shown
                      + "' is unknown: use queue, exit or fork");
}

std::string make_uuid_v4() {
  thread_local std::mt19937_64 gen{[] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64{seq};
  }()};
  uint64_t hi = gen();
  uint64_t lo = gen();
  hi = (hi & 0xffffffffffff0fffULL) | 0x0000000000004000ULL; // version 4
  lo = (lo & 0x3fffffffffffffffULL) | 0x8000000000000000ULL; // variant 10
  char buf[37];
  std::snprintf(buf, sizeof(buf), "%08x-%04x-%04x-%04x-%012llx",
                static_cast<unsigned>(hi >> 32),
                static_cast<unsigned>((hi >> 16) & 0xffff),
                static_cast<unsigned>(hi & 0xffff),
                static_cast<unsigned>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xffffffffffffULL));
  return buf;
}


// -- threads as resources ---------------------------------------------------------

caf::error validate_metadata_key(const std::string& key,
                                 const std::string& what) {
  auto good = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':'
           || c == '-';
  };
  if (key.empty() || key.size() > max_metadata_key
      || !std::all_of(key.begin(), key.end(), good)) {
    std::string shown = key.substr(0, max_metadata_key);
    for (auto& c : shown)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        c = '?';
    return make_error(errc::invalid_argument,
                      what + " key '" + shown
                        + "' is not 1 to 64 characters of "
                          "[A-Za-z0-9_.:-]");
  }
  return caf::none;
}

caf::error validate_metadata_patch(const thread_metadata_patch& patch) {
  if (patch.set.size() + patch.remove.size() > 4 * max_metadata_keys)
    return make_error(errc::too_large,
                      "metadata: at most "
                        + std::to_string(max_metadata_keys)
                        + " keys per thread");
  for (auto& [key, value] : patch.set) {
    if (auto err = validate_metadata_key(key))
      return err;
    if (value.size() > max_metadata_value)
      return make_error(errc::too_large,
                        "metadata value of '" + key + "' has "
                          + std::to_string(value.size())
                          + " bytes; at most "
                          + std::to_string(max_metadata_value));
  }
  for (auto& key : patch.remove)
    if (auto err = validate_metadata_key(key))
      return err;
  return caf::none;
}

caf::expected<thread_metadata>
apply_metadata_patch(thread_metadata current,
                     const thread_metadata_patch& patch) {
  for (auto& key : patch.remove)
    current.erase(key);
  for (auto& [key, value] : patch.set)
    current[key] = value;
  if (current.size() > max_metadata_keys)
    return make_error(errc::too_large,
                      "metadata would hold " + std::to_string(current.size())
                        + " keys; at most "
                        + std::to_string(max_metadata_keys));
  return current;
}

std::string metadata_to_json(const thread_metadata& x) {
  nlohmann::json out = nlohmann::json::object();
  for (auto& [key, value] : x)
    out[key] = value;
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

thread_metadata metadata_from_json(const std::string& text) {
  thread_metadata out;
  auto parsed = nlohmann::json::parse(text, nullptr, false);
  if (!parsed.is_object())
    return out;
  for (auto& [key, value] : parsed.items())
    if (value.is_string())
      out.emplace(key, value.get<std::string>());
  return out;
}

caf::error validate_thread_list_request(const thread_list_request& x) {
  if (x.limit < 1 || x.limit > max_thread_page)
    return make_error(errc::invalid_argument,
                      "limit must be between 1 and "
                        + std::to_string(max_thread_page) + ", not "
                        + std::to_string(x.limit));
  if (x.snapshot != 0 && x.after_version > x.snapshot)
    return make_error(errc::invalid_argument,
                      "cursor: its place lies after its snapshot");
  if (x.snapshot == 0 && (x.after_version != 0 || !x.after_id.empty()))
    return make_error(errc::invalid_argument,
                      "cursor: a place without a snapshot");
  if (x.filters.size() > max_metadata_keys)
    return make_error(errc::invalid_argument,
                      "at most " + std::to_string(max_metadata_keys)
                        + " metadata filters");
  for (auto& [key, value] : x.filters) {
    if (auto err = validate_metadata_key(key, "metadata filter"))
      return err;
    if (value.size() > max_metadata_value)
      return make_error(errc::invalid_argument,
                        "metadata filter value of '" + key
                          + "' is longer than any stored value");
  }
  if (!x.tenant_prefix.empty()) {
    // TENANT~, or an end user's TENANT~USER~.
    std::string_view prefix{x.tenant_prefix};
    bool ok = x.scoped && prefix.back() == tenant_separator;
    if (ok) {
      prefix.remove_suffix(1);
      auto sep = prefix.find(tenant_separator);
      ok = valid_tenant_id(prefix.substr(0, sep))
           && (sep == std::string_view::npos
               || !validate_client_user_id(prefix.substr(sep + 1)));
    }
    if (!ok)
      return make_error(errc::invalid_argument,
                        "tenant_prefix must be a tenant ID followed by '~', "
                        "or that and an end user's ID followed by '~'");
  }
  // Milliseconds up to the year 9999: larger ones are no time.
  if (x.updated_after_ms < 0 || x.updated_after_ms > 253402300799999)
    return make_error(errc::invalid_argument,
                      "updated_after must be milliseconds since the Unix "
                      "epoch, from 0 to 253402300799999");
  return caf::none;
}

} // namespace spindle
