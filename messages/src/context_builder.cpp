#include "spindle/messages/context_builder.hpp"

#include <cstdint>
#include <unordered_map>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/memory.hpp"

namespace spindle {

std::string final_user_content(const std::string& original,
                               const std::string& rewritten) {
  if (rewritten.empty() || rewritten == original)
    return original;
  std::string out;
  out.reserve(original.size() + rewritten.size() + 64);
  out += "Original user message:\n";
  out += original;
  out += "\n\n---\n\nContextualized query:\n";
  out += rewritten;
  return out;
}

std::vector<chat_message> close_tool_calls(std::vector<chat_message> history) {
  // Each call's first stored result, wherever it is.
  std::unordered_map<std::string, size_t> result_of;
  bool any_calls = false;
  for (size_t i = 0; i < history.size(); ++i) {
    if (history[i].role == "tool")
      result_of.emplace(history[i].tool_call_id, i);
    any_calls = any_calls || !history[i].tool_calls.empty();
  }
  if (!any_calls && result_of.empty())
    return history;
  std::vector<chat_message> out;
  out.reserve(history.size());
  for (auto& m : history) {
    if (m.role == "tool")
      continue; // placed after the call it answers, or left out
    auto calls = m.tool_calls; // `m` moves into `out`
    out.push_back(std::move(m));
    for (auto& c : calls) {
      auto found = result_of.find(c.id);
      if (found != result_of.end() && found->second != SIZE_MAX) {
        auto& result = history[found->second];
        out.push_back(chat_message{"tool", std::move(result.content), c.id,
                                   {}});
        found->second = SIZE_MAX; // one result per call
      } else {
        out.push_back(
          chat_message{"tool", std::string{interrupted_tool_result}, c.id,
                       {}});
      }
    }
  }
  return out;
}

std::vector<chat_message> assemble_messages(const std::string& system_prompt,
                                            const std::string& memory_snippet,
                                            std::vector<chat_message> history,
                                            const std::string& original,
                                            const std::string& rewritten) {
  std::vector<chat_message> out;
  out.reserve(history.size() + 3);
  if (!system_prompt.empty())
    out.push_back(chat_message{"system", system_prompt, {}});
  if (!memory_snippet.empty())
    out.push_back(chat_message{
      "system", std::string{memory_message_prefix} + memory_snippet, {}});
  for (auto& m : close_tool_calls(std::move(history)))
    out.push_back(std::move(m));
  out.push_back(
    chat_message{"user", final_user_content(original, rewritten), {}});
  return out;
}

std::vector<chat_message> assemble_messages(const std::string& system_prompt,
                                            const std::string& memory_snippet,
                                            const std::vector<turn>& history,
                                            const std::string& original,
                                            const std::string& rewritten) {
  std::vector<chat_message> chat;
  chat.reserve(history.size());
  for (auto& t : history)
    chat.push_back(to_chat_message(t));
  return assemble_messages(system_prompt, memory_snippet, std::move(chat),
                           original, rewritten);
}

caf::error validate_build_request(const build_request& x) {
  if (auto err = validate_thread_id(x.thread_id))
    return err;
  if (!x.user_id.empty())
    if (auto err = validate_user_id(x.user_id))
      return err;
  if (x.message.empty())
    return make_error(errc::invalid_argument, "message must not be empty");
  if (x.message.size() > max_turn_content)
    return make_error(errc::too_large,
                      "message has " + std::to_string(x.message.size())
                        + " bytes; at most "
                        + std::to_string(max_turn_content) + " are allowed");
  return validate_max_turns(x.options.max_turns);
}

} // namespace spindle
