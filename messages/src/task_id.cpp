#include "spindle/messages/task_id.hpp"

#include "spindle/messages/error.hpp"
#include "spindle/messages/hybrid36.hpp"

namespace spindle {

namespace {

caf::error bad(std::string_view text, const std::string& why) {
  std::string shown{text.substr(0, 64)};
  if (text.size() > 64)
    shown += "...";
  return make_error(errc::invalid_id,
                    "'" + shown + "' is not a task ID: " + why);
}

// Parses a decimal sequence number: no sign, no leading zero, 1..max.
std::optional<uint64_t> parse_seq(std::string_view digits) {
  if (digits.empty() || digits.size() > 7 || digits[0] == '0')
    return std::nullopt;
  uint64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9')
      return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > hybrid36::max_ordinal)
    return std::nullopt;
  return value;
}

} // namespace

caf::expected<task_id> task_id::parse(std::string_view text) {
  task_id result;
  if (text.size() < 4)
    return bad(text, "an orchestration ID has 4 characters");
  auto orch = hybrid36::parse(text.substr(0, 4));
  if (!orch)
    return bad(text, "it must start with a 4-character hybrid base36 "
                     "orchestration ID (0001..9999, A000..ZZZZ)");
  if (*orch == 0)
    return bad(text, "0000 is never an ID");
  result.orchestration = *orch;
  auto rest = text.substr(4);
  if (rest.empty())
    return result;
  if (rest.substr(0, 2) != "_t")
    return bad(text, "a task below an orchestration is written _t<n>");
  rest.remove_prefix(2);
  while (true) {
    auto dot = rest.find('.');
    auto seq = parse_seq(rest.substr(0, dot));
    if (!seq)
      return bad(text, "each sequence number is a decimal from 1 to 736335 "
                       "without leading zeros");
    result.path.push_back(*seq);
    if (result.path.size() > max_depth)
      return bad(text, "deeper than " + std::to_string(max_depth) + " levels");
    if (dot == std::string_view::npos)
      break;
    rest.remove_prefix(dot + 1);
  }
  return result;
}

std::string task_id::to_string() const {
  std::string out = hybrid36::format(orchestration).value_or("????");
  for (size_t i = 0; i < path.size(); ++i) {
    out += i == 0 ? "_t" : ".";
    out += std::to_string(path[i]);
  }
  return out;
}

std::optional<task_id> task_id::parent() const {
  if (path.empty())
    return std::nullopt;
  task_id result{orchestration, path};
  result.path.pop_back();
  return result;
}

task_id task_id::child(uint64_t n) const {
  task_id result{orchestration, path};
  result.path.push_back(n);
  return result;
}

bool task_id::is_ancestor_of(const task_id& other) const noexcept {
  if (other.orchestration != orchestration || other.path.size() <= path.size())
    return false;
  for (size_t i = 0; i < path.size(); ++i)
    if (path[i] != other.path[i])
      return false;
  return true;
}

int compare(const task_id& lhs, const task_id& rhs) noexcept {
  if (lhs.orchestration != rhs.orchestration)
    return lhs.orchestration < rhs.orchestration ? -1 : 1;
  auto n = std::min(lhs.path.size(), rhs.path.size());
  for (size_t i = 0; i < n; ++i)
    if (lhs.path[i] != rhs.path[i])
      return lhs.path[i] < rhs.path[i] ? -1 : 1;
  if (lhs.path.size() == rhs.path.size())
    return 0;
  return lhs.path.size() < rhs.path.size() ? -1 : 1;
}

bool is_valid_task_id(std::string_view text) {
  return static_cast<bool>(task_id::parse(text));
}

} // namespace spindle
