#include "spindle/messages/tokens.hpp"

#include <limits>

namespace spindle {

token_counter::~token_counter() = default;

size_t token_counter::count_role(std::string_view role) const {
  return count_text(role);
}

namespace {

size_t count_parts(const token_counter& counter, std::string_view role,
                   const std::string& content, const std::string& call_id,
                   const std::vector<tool_call>& calls) {
  auto n = message_overhead_tokens + counter.count_role(role)
           + counter.count_text(content);
  if (!call_id.empty())
    n += counter.count_text(call_id);
  for (auto& c : calls)
    n += tool_call_overhead_tokens + counter.count_text(c.id)
         + counter.count_text(c.name) + counter.count_text(c.arguments);
  return n;
}

} // namespace

size_t count_message_tokens(const token_counter& counter,
                            const chat_message& message) {
  return count_parts(counter, message.role, message.content,
                     message.tool_call_id, message.tool_calls);
}

size_t count_turn_tokens(const token_counter& counter, const turn& t) {
  return count_parts(counter, to_string(t.role), t.content, t.tool_call_id,
                     t.tool_calls);
}

void count_turn(const token_counter& counter, turn& t) {
  auto n = count_turn_tokens(counter, t);
  constexpr size_t most = std::numeric_limits<uint32_t>::max();
  t.tokens = static_cast<uint32_t>(n < most ? n : most);
  t.token_encoding = static_cast<uint8_t>(counter.id());
}

size_t turn_tokens(const token_counter& counter, const turn& t) {
  if (t.token_encoding == static_cast<uint8_t>(counter.id())
      && t.token_encoding != 0)
    return t.tokens;
  return count_turn_tokens(counter, t);
}

} // namespace spindle
