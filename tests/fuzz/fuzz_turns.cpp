// The turn codecs (docs/threads.md): an assistant turn's tool calls as
// stored and as clients send them, thread metadata as stored, and the
// names of roles, conflict policies and context types.
//
// Invariants: accepted tool calls encode back to text that decodes to the
// same calls; calls `validate_tool_calls` accepts keep its limits;
// metadata round-trips; a parsed name prints as itself.

#include <cctype>
#include <string>

#include "fuzz.hpp"
#include "spindle/messages/chat.hpp"
#include "spindle/messages/context_item.hpp"
#include "spindle/messages/threads.hpp"

using namespace spindle;
using spindle::fuzz::check;

namespace {

bool is_tool_name(const std::string& name) {
  if (name.empty() || name.size() > max_tool_name)
    return false;
  for (unsigned char c : name)
    if (!(std::isalnum(c) || c == '_' || c == '-'))
      return false;
  return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto input = fuzz::text(data, size);
  if (auto calls = tool_calls_from_json(input)) {
    auto again = tool_calls_from_json(tool_calls_to_json(*calls));
    check(static_cast<bool>(again), "encoded tool calls decode");
    check(*again == *calls, "tool calls round-trip");
    if (!validate_tool_calls(*calls, 0)) {
      check(calls->size() <= max_tool_calls, "at most max_tool_calls");
      for (auto& c : *calls) {
        check(!c.id.empty() && c.id.size() <= max_tool_call_id,
              "a call ID has 1 to 256 bytes");
        check(is_tool_name(c.name), "a tool name is [A-Za-z0-9_-]{1,64}");
      }
      turn t;
      t.role = turn_role::assistant;
      t.tool_calls = *calls;
      check(!validate_turn(t), "an assistant turn may make valid calls");
      t.role = turn_role::user;
      t.content = "x";
      check(calls->empty() || validate_turn(t),
            "only assistant turns make calls");
    }
  }
  auto meta = metadata_from_json(std::string{input});
  check(metadata_from_json(metadata_to_json(meta)) == meta,
        "metadata round-trips");
  if (auto role = parse_turn_role(input))
    check(input == to_string(*role), "a role prints as parsed");
  if (auto policy = parse_conflict_policy(input))
    check(input == to_string(*policy), "a policy prints as parsed");
  if (auto type = parse_context_type(input))
    check(input == to_string(*type), "a context type prints as parsed");
  return 0;
}
