#include "tenancy/scopes.hpp"

#include <iterator>

namespace spindle::tenancy {

namespace {

struct named {
  scope value;
  const char* name;
};

constexpr named scopes[] = {
  {scope::threads_read, "threads:read"},
  {scope::threads_write, "threads:write"},
  {scope::memories_read, "memories:read"},
  {scope::memories_write, "memories:write"},
  {scope::tasks_read, "tasks:read"},
  {scope::tasks_write, "tasks:write"},
  {scope::events_read, "events:read"},
  {scope::usage_read, "usage:read"},
  {scope::keys_admin, "keys:admin"},
};

} // namespace

const char* name_of(scope s) noexcept {
  for (auto& x : scopes)
    if (x.value == s)
      return x.name;
  return "?";
}

bool parse_scope(std::string_view name, scope& out) noexcept {
  for (auto& x : scopes)
    if (name == x.name) {
      out = x.value;
      return true;
    }
  return false;
}

std::vector<std::string> names_of(scope_set set) {
  std::vector<std::string> out;
  for (auto& x : scopes)
    if (set & bit(x.value))
      out.emplace_back(x.name);
  return out;
}

std::string all_scope_names() {
  std::string out;
  for (auto& x : scopes) {
    if (!out.empty())
      out += ", ";
    out += x.name;
  }
  return out;
}

} // namespace spindle::tenancy
