#include "spindle/messages/context_builder.hpp"

#include <cstdint>
#include <unordered_map>
#include <string_view>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/tokens.hpp"

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

namespace {

// A history message and the tool messages a prompt puts right after it:
// per call of `head`, in the calls' order, the index of its first stored
// result, or `npos` when it has none (the prompt says it was interrupted).
struct history_unit {
  static constexpr size_t npos = SIZE_MAX;
  size_t head = 0;
  std::vector<size_t> results;
};

bool is_tool(const turn& x) {
  return x.role == turn_role::tool;
}

bool is_tool(const chat_message& x) {
  return x.role == "tool";
}

bool is_tool(const turn* x) {
  return is_tool(*x);
}

const turn& deref(const turn* x) {
  return *x;
}

template <class Message>
const Message& deref(const Message& x) {
  return x;
}

// The history as a prompt gives it (`close_tool_calls`), in units: tool
// messages answering no call of the history are left out, and a result
// stored after other turns moves to its call.
template <class Message>
std::vector<history_unit> close_units(const std::vector<Message>& history) {
  std::unordered_map<std::string_view, size_t> result_of;
  for (size_t i = 0; i < history.size(); ++i)
    if (is_tool(history[i]))
      result_of.emplace(deref(history[i]).tool_call_id, i); // the first one
  std::vector<history_unit> out;
  out.reserve(history.size());
  for (size_t i = 0; i < history.size(); ++i) {
    auto& m = deref(history[i]);
    if (is_tool(m))
      continue; // placed after the call it answers, or left out
    history_unit u{i, {}};
    for (auto& c : m.tool_calls) {
      auto found = result_of.find(c.id);
      if (found != result_of.end() && found->second != history_unit::npos) {
        u.results.push_back(found->second);
        found->second = history_unit::npos; // one result per call
      } else {
        u.results.push_back(history_unit::npos);
      }
    }
    out.push_back(std::move(u));
  }
  return out;
}

chat_message interrupted_result(const std::string& call_id) {
  return chat_message{"tool", std::string{interrupted_tool_result}, call_id,
                      {}};
}

// Appends the unit's messages; `take(i)` gives history[i] as a message.
template <class Take>
void append_unit(std::vector<chat_message>& out, const history_unit& u,
                 Take take) {
  out.push_back(take(u.head));
  auto calls = out.back().tool_calls; // `out` may grow below
  for (size_t k = 0; k < calls.size(); ++k) {
    if (u.results[k] == history_unit::npos) {
      out.push_back(interrupted_result(calls[k].id));
    } else {
      auto result = take(u.results[k]);
      result.tool_call_id = calls[k].id;
      result.tool_calls.clear();
      out.push_back(std::move(result));
    }
  }
}

// Appends the unit's messages to a prompt: its stored turns read in
// place (`in_place`, the prompt keeping what holds them) or copied.
void append_unit(prompt& out, const history_unit& u,
                 const std::vector<const turn*>& history, bool in_place) {
  auto& head = *history[u.head];
  if (in_place)
    out.push_turn(head);
  else
    out.push_back(to_chat_message(head));
  auto& calls = head.tool_calls;
  for (size_t k = 0; k < calls.size(); ++k) {
    if (u.results[k] == history_unit::npos) {
      out.push_back(interrupted_result(calls[k].id));
      continue;
    }
    // A result was matched to its call by its `tool_call_id`.
    auto& result = *history[u.results[k]];
    if (in_place) {
      out.push_turn(result, true);
    } else {
      auto m = to_chat_message(result);
      m.tool_calls.clear();
      out.push_back(std::move(m));
    }
  }
}

} // namespace

std::vector<chat_message> close_tool_calls(std::vector<chat_message> history) {
  bool any = false;
  for (auto& m : history)
    any = any || is_tool(m) || !m.tool_calls.empty();
  if (!any)
    return history;
  auto units = close_units(history);
  std::vector<chat_message> out;
  out.reserve(history.size());
  for (auto& u : units)
    append_unit(out, u, [&](size_t i) { return std::move(history[i]); });
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

caf::error validate_context_tokens(uint64_t max_context_tokens,
                                   uint64_t reply_tokens) {
  if (max_context_tokens > max_context_tokens_limit)
    return make_error(errc::invalid_argument,
                      "max_context_tokens must be at most "
                        + std::to_string(max_context_tokens_limit) + ", got "
                        + std::to_string(max_context_tokens));
  if (max_context_tokens <= reply_tokens + reply_primer_tokens)
    return make_error(errc::invalid_argument,
                      "max_context_tokens must exceed the reply's reserve of "
                        + std::to_string(reply_tokens) + " tokens (and "
                        + std::to_string(reply_primer_tokens)
                        + " for its primer), got "
                        + std::to_string(max_context_tokens));
  return caf::none;
}

caf::expected<prompt>
fit_prompt(const token_counter& counter, uint64_t max_context_tokens,
           uint64_t reply_tokens, const prompt_parts& parts,
           context_manifest& manifest) {
  std::vector<const turn*> history;
  history.reserve(parts.history.size());
  for (auto& t : parts.history)
    history.push_back(&t);
  return fit_prompt(counter, max_context_tokens, reply_tokens, parts, history,
                    manifest);
}

caf::expected<prompt>
fit_prompt(const token_counter& counter, uint64_t max_context_tokens,
           uint64_t reply_tokens, const prompt_parts& parts,
           const std::vector<const turn*>& history,
           context_manifest& manifest, std::shared_ptr<const void> owner) {
  if (auto err = validate_context_tokens(max_context_tokens, reply_tokens))
    return err;
  manifest.encoding = std::string{counter.name()};
  manifest.max_context_tokens = max_context_tokens;
  manifest.reply_tokens = reply_tokens;
  manifest.budget = max_context_tokens - reply_tokens;
  // 1. The system prompt and the current message: the prompt's floor.
  chat_message system{"system", parts.system_prompt, {}, {}};
  manifest.system_tokens = system.content.empty() ? 0
                           : parts.system_tokens != 0
                             ? parts.system_tokens
                             : count_message_tokens(counter, system);
  const auto system_role = counter.count_role("system");
  uint64_t used = reply_primer_tokens + manifest.system_tokens;
  chat_message user{"user", final_user_content(parts.original,
                                               parts.rewritten),
                    {}, {}};
  manifest.message_tokens = count_message_tokens(counter, user);
  if (used + manifest.message_tokens > manifest.budget
      && user.content != parts.original) {
    user.content = parts.original;
    manifest.rewrite_left_out = true;
    manifest.message_tokens = count_message_tokens(counter, user);
  }
  used += manifest.message_tokens;
  if (used > manifest.budget)
    return make_error(
      errc::too_large,
      "the message takes " + std::to_string(manifest.message_tokens)
        + " tokens and the system prompt "
        + std::to_string(manifest.system_tokens) + " ("
        + std::to_string(used) + " with the reply's primer); the budget is "
        + std::to_string(manifest.budget) + " (max_context_tokens "
        + std::to_string(max_context_tokens) + " less "
        + std::to_string(reply_tokens) + " kept for the reply)");
  // 2. The thread's summary, whole or not at all.
  chat_message summary{"system", {}, {}, {}};
  uint64_t covered = 0; // turns the summary in the prompt stands for
  manifest.summary_upto = parts.summary.upto;
  if (parts.summary.upto > 0 && !parts.summary.content.empty()) {
    summary.content = std::string{summary_message_prefix}
                      + parts.summary.content;
    auto cost
      = parts.summary.token_encoding == static_cast<uint8_t>(counter.id())
            && parts.summary.tokens != 0
          ? message_overhead_tokens + system_role + parts.summary.tokens
          : count_message_tokens(counter, summary);
    if (used + cost <= manifest.budget) {
      used += cost;
      manifest.summary_tokens = cost;
      covered = parts.summary.upto;
    } else {
      summary.content.clear();
      manifest.summary_left_out = true;
    }
  }
  // 3. The memory snippet, whole or not at all.
  chat_message memory{"system", {}, {}, {}};
  if (!parts.memory_snippet.empty()) {
    memory.content = std::string{memory_message_prefix} + parts.memory_snippet;
    // The prefix ends with ":\n", the snippet starts with "- ": no piece
    // crosses between them, so counts add up.
    auto cost = parts.memory_snippet_tokens == 0
                  ? count_message_tokens(counter, memory)
                  : message_overhead_tokens + system_role
                      + (parts.memory_prefix_tokens != 0
                           ? parts.memory_prefix_tokens
                           : counter.count_text(memory_message_prefix))
                      + parts.memory_snippet_tokens;
    if (used + cost <= manifest.budget) {
      used += cost;
      manifest.memory_tokens = cost;
      manifest.memory_entries = parts.memory_entries;
    } else {
      memory.content.clear();
      manifest.memory_left_out = true;
    }
  }
  // 4. The newest history that fits, a call with its results as one unit;
  // with the summary, only the turns after those it covers.
  auto units = close_units(history);
  size_t floor_unit = 0;
  while (floor_unit < units.size()
         && parts.first_index + units[floor_unit].head < covered)
    ++floor_unit;
  std::vector<uint64_t> unit_cost(units.size(), 0);
  size_t first = units.size();
  uint64_t history_used = 0;
  while (first > floor_unit) {
    auto& u = units[first - 1];
    uint64_t cost = turn_tokens(counter, *history[u.head]);
    auto& calls = history[u.head]->tool_calls;
    for (size_t k = 0; k < u.results.size(); ++k) {
      if (u.results[k] != history_unit::npos) {
        cost += turn_tokens(counter, *history[u.results[k]]);
      } else {
        cost += count_message_tokens(counter,
                                     interrupted_result(calls[k].id));
      }
    }
    if (used + history_used + cost > manifest.budget)
      break;
    history_used += cost;
    unit_cost[first - 1] = cost;
    --first;
  }
  if (first > 0 && first > floor_unit) {
    // Something was left out: never start with a message whose turns
    // before it are gone (D6).
    while (first < units.size()) {
      auto role = history[units[first].head]->role;
      if (role == turn_role::user || role == turn_role::system)
        break;
      history_used -= unit_cost[first];
      ++first;
    }
  }
  manifest.history_tokens = history_used;
  manifest.total_tokens = used + history_used;
  // The prompt, in D7's order.
  prompt out;
  out.reserve(history.size() + 4);
  const bool in_place = owner != nullptr;
  if (in_place)
    out.keep(std::move(owner));
  if (!system.content.empty())
    out.push_back(std::move(system));
  if (!summary.content.empty())
    out.push_back(std::move(summary));
  if (!memory.content.empty())
    out.push_back(std::move(memory));
  std::vector<bool> kept(history.size(), false);
  for (size_t i = first; i < units.size(); ++i) {
    kept[units[i].head] = true;
    for (auto r : units[i].results)
      if (r != history_unit::npos)
        kept[r] = true;
    append_unit(out, units[i], history, in_place);
  }
  manifest.turns.reserve(history.size());
  for (size_t i = 0; i < history.size(); ++i) {
    if (kept[i])
      manifest.turns.push_back(parts.first_index + i);
    else
      ++manifest.turns_left_out;
  }
  out.push_back(std::move(user));
  return out;
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
