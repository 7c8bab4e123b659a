#include "llm/usage.hpp"

#include <algorithm>
#include <limits>

#include "spindle/messages/tokens.hpp"

namespace spindle {

namespace {

uint32_t held(uint64_t v) {
  return static_cast<uint32_t>(
    std::min<uint64_t>(v, std::numeric_limits<uint32_t>::max()));
}

} // namespace

turn_usage call_usage(const completion& reply, const token_counter* counter,
                      uint64_t prompt_tokens) {
  turn_usage u;
  if (reply.usage_reported) {
    u.source = usage_source::upstream;
    u.prompt_tokens = held(reply.prompt_tokens);
    u.completion_tokens = held(reply.completion_tokens);
    return u;
  }
  if (counter == nullptr)
    return u;
  uint64_t out = counter->count_text(reply.text);
  for (auto& call : reply.tool_calls)
    out += counter->count_text(call.name) + counter->count_text(call.arguments);
  u.source = usage_source::counted;
  u.prompt_tokens = held(prompt_tokens);
  u.completion_tokens = held(out);
  return u;
}

} // namespace spindle
