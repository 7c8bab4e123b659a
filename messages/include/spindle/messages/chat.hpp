#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

#include <caf/meta/type_name.hpp>

namespace spindle {

/// A call of a tool that an assistant message makes, as OpenAI's chat
/// format defines it: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`. `arguments` is kept as the model wrote it (a JSON text,
/// not parsed: a model may write one that does not parse).
struct tool_call {
  std::string id;
  std::string name;
  std::string arguments;

  friend bool operator==(const tool_call& x, const tool_call& y) {
    return x.id == y.id && x.name == y.name && x.arguments == y.arguments;
  }
  friend bool operator!=(const tool_call& x, const tool_call& y) {
    return !(x == y);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tool_call& x) {
  return f(caf::meta::type_name("tool_call"), x.id, x.name, x.arguments);
}

/// Tool calls in OpenAI's JSON form, `[{"id", "type": "function",
/// "function": {"name", "arguments"}}]`, as one text; empty for none.
std::string tool_calls_to_json(const std::vector<tool_call>& calls);

/// Parses what `tool_calls_to_json` makes (and OpenAI's form, `type`
/// optional); an empty text is no calls. Errors: `invalid_argument`
/// naming the field. Checks the form only: `validate_tool_calls` checks
/// the values.
caf::expected<std::vector<tool_call>>
tool_calls_from_json(std::string_view text);

/// One message of a prompt in the OpenAI chat format: `role` is "system",
/// "user", "assistant" or "tool"; `tool_call_id` names the call a "tool"
/// message answers and is empty for every other role.
struct chat_message {
  std::string role;
  std::string content;
  std::string tool_call_id;
  /// The calls an assistant message makes; empty for every other role.
  std::vector<tool_call> tool_calls;

  friend bool operator==(const chat_message& x, const chat_message& y) {
    return x.role == y.role && x.content == y.content
           && x.tool_call_id == y.tool_call_id && x.tool_calls == y.tool_calls;
  }
  friend bool operator!=(const chat_message& x, const chat_message& y) {
    return !(x == y);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chat_message& x) {
  return f(caf::meta::type_name("chat_message"), x.role, x.content,
           x.tool_call_id, x.tool_calls);
}

} // namespace spindle
