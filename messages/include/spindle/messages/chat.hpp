#pragma once

#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace spindle {

/// One message of a prompt in the OpenAI chat format: `role` is "system",
/// "user", "assistant" or "tool"; `tool_call_id` names the call a "tool"
/// message answers and is empty for every other role.
struct chat_message {
  std::string role;
  std::string content;
  std::string tool_call_id;

  friend bool operator==(const chat_message& x, const chat_message& y) {
    return x.role == y.role && x.content == y.content
           && x.tool_call_id == y.tool_call_id;
  }
  friend bool operator!=(const chat_message& x, const chat_message& y) {
    return !(x == y);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chat_message& x) {
  return f(caf::meta::type_name("chat_message"), x.role, x.content,
           x.tool_call_id);
}

} // namespace spindle
