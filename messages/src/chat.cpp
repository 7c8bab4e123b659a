#include "spindle/messages/chat.hpp"

#include <nlohmann/json.hpp>

#include "spindle/messages/error.hpp"

namespace spindle {

std::string tool_calls_to_json(const std::vector<tool_call>& calls) {
  if (calls.empty())
    return {};
  auto out = nlohmann::json::array();
  for (auto& c : calls)
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out.dump();
}

caf::expected<std::vector<tool_call>>
tool_calls_from_json(std::string_view text) {
  std::vector<tool_call> out;
  if (text.empty())
    return out;
  auto doc = nlohmann::json::parse(text, nullptr, false);
  if (!doc.is_array())
    return make_error(errc::invalid_argument,
                      "tool_calls must be an array of calls");
  for (size_t i = 0; i < doc.size(); ++i) {
    auto& c = doc[i];
    auto field = "tool_calls[" + std::to_string(i) + "]";
    if (!c.is_object())
      return make_error(errc::invalid_argument, field + " must be an object");
    for (auto& [key, value] : c.items())
      if (key != "id" && key != "type" && key != "function")
        return make_error(errc::invalid_argument,
                          field + " has an unknown field '"
                            + key.substr(0, 64) + "'");
    auto id = c.find("id");
    auto type = c.find("type");
    auto fn = c.find("function");
    if (id == c.end() || !id->is_string())
      return make_error(errc::invalid_argument,
                        field + ".id must be a string");
    if (type != c.end() && (!type->is_string() || *type != "function"))
      return make_error(errc::invalid_argument,
                        field + ".type must be \"function\"");
    if (fn == c.end() || !fn->is_object())
      return make_error(errc::invalid_argument,
                        field + ".function must be an object with name and "
                                "arguments");
    auto name = fn->find("name");
    auto args = fn->find("arguments");
    if (name == fn->end() || !name->is_string())
      return make_error(errc::invalid_argument,
                        field + ".function.name must be a string");
    if (args != fn->end() && !args->is_string())
      return make_error(errc::invalid_argument,
                        field + ".function.arguments must be a string (the "
                                "arguments as JSON text)");
    for (auto& [key, value] : fn->items())
      if (key != "name" && key != "arguments")
        return make_error(errc::invalid_argument,
                          field + ".function has an unknown field '"
                            + key.substr(0, 64) + "'");
    out.push_back(tool_call{id->get<std::string>(), name->get<std::string>(),
                            args == fn->end() ? std::string{}
                                              : args->get<std::string>()});
  }
  return out;
}

} // namespace spindle
