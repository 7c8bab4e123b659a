#include "spindle/messages/tools.hpp"

#include <set>

#include <nlohmann/json.hpp>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

using json = nlohmann::json;

caf::error invalid(std::string what) {
  return make_error(errc::invalid_argument, std::move(what));
}

std::string shown(const std::string& key) {
  return key.substr(0, 64);
}

} // namespace

bool is_tool_name(std::string_view name) {
  if (name.empty() || name.size() > 64)
    return false;
  for (auto ch : name)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
          || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
      return false;
  return true;
}

caf::error validate_tools(std::string_view tools,
                          std::string_view tool_choice) {
  std::set<std::string> names;
  if (!tools.empty()) {
    if (tools.size() > max_tools_bytes)
      return make_error(errc::too_large,
                        "tools has " + std::to_string(tools.size())
                          + " bytes of JSON; at most "
                          + std::to_string(max_tools_bytes)
                          + " are allowed");
    auto doc = json::parse(tools, nullptr, false);
    if (!doc.is_array())
      return invalid("tools must be an array of function tools");
    if (doc.size() > max_tools)
      return make_error(errc::too_large,
                        "tools declares " + std::to_string(doc.size())
                          + " tools; a request declares at most "
                          + std::to_string(max_tools));
    for (size_t i = 0; i < doc.size(); ++i) {
      auto& t = doc[i];
      auto field = "tools[" + std::to_string(i) + "]";
      if (!t.is_object())
        return invalid(field + " must be an object");
      for (auto& [key, value] : t.items())
        if (key != "type" && key != "function")
          return invalid(field + " has an unknown field '" + shown(key)
                         + "'; a tool has type and function");
      auto type = t.find("type");
      if (type == t.end() || *type != "function")
        return invalid(field + ".type must be \"function\"");
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object())
        return invalid(field + ".function must be an object");
      for (auto& [key, value] : fn->items())
        if (key != "name" && key != "description" && key != "parameters"
            && key != "strict")
          return invalid(field + ".function has an unknown field '"
                         + shown(key)
                         + "'; a function has name, description, "
                           "parameters and strict");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string()
          || !is_tool_name(name->get_ref<const std::string&>()))
        return invalid(field
                       + ".function.name must have 1 to 64 characters of "
                         "A-Z, a-z, 0-9, _ and -");
      if (!names.insert(name->get<std::string>()).second)
        return invalid(field + ".function.name '" + name->get<std::string>()
                       + "' is declared twice");
      auto description = fn->find("description");
      if (description != fn->end() && !description->is_string())
        return invalid(field + ".function.description must be a string");
      auto parameters = fn->find("parameters");
      if (parameters != fn->end() && !parameters->is_object())
        return invalid(field
                       + ".function.parameters must be a JSON Schema object");
      auto strict = fn->find("strict");
      if (strict != fn->end() && !strict->is_boolean()
          && !strict->is_null())
        return invalid(field + ".function.strict must be a boolean");
    }
  }
  if (tool_choice.empty())
    return caf::none;
  if (tools.empty())
    return invalid("tool_choice needs tools");
  auto choice = json::parse(tool_choice, nullptr, false);
  if (choice.is_string()) {
    if (choice != "none" && choice != "auto" && choice != "required")
      return invalid("tool_choice must be \"none\", \"auto\", \"required\" "
                     "or {\"type\": \"function\", \"function\": {\"name\"}}");
    return caf::none;
  }
  auto fn = choice.is_object() ? choice.find("function") : choice.end();
  if (!choice.is_object() || choice.size() != 2 || choice["type"] != "function"
      || fn == choice.end() || !fn->is_object() || fn->size() != 1
      || !(*fn)["name"].is_string())
    return invalid("tool_choice must be \"none\", \"auto\", \"required\" or "
                   "{\"type\": \"function\", \"function\": {\"name\"}}");
  auto wanted = (*fn)["name"].get<std::string>();
  if (names.count(wanted) == 0)
    return invalid("tool_choice names '" + shown(wanted)
                   + "', which tools does not declare");
  return caf::none;
}

} // namespace spindle
