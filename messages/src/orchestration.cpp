#include "spindle/messages/orchestration.hpp"

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

constexpr std::string_view state_names[] = {"pending", "running", "completed",
                                            "failed", "stale"};

} // namespace

std::string to_string(task_state x) {
  auto index = static_cast<size_t>(x);
  if (index < std::size(state_names))
    return std::string{state_names[index]};
  return "unknown";
}

bool from_string(std::string_view name, task_state& out) {
  for (size_t i = 0; i < std::size(state_names); ++i) {
    if (state_names[i] == name) {
      out = static_cast<task_state>(i);
      return true;
    }
  }
  return false;
}

caf::error validate_worker_name(std::string_view name) {
  auto shown = std::string{name.substr(0, 64)};
  if (name.size() > 64)
    shown += "...";
  if (name.empty() || name.size() > 128)
    return make_error(errc::invalid_argument,
                      "worker '" + shown + "' must have 1 to 128 characters");
  for (char c : name)
    if (c <= ' ' || c > '~')
      return make_error(errc::invalid_argument,
                        "worker '" + shown
                          + "' may hold only printable ASCII without spaces");
  return caf::none;
}

caf::error validate_lease_ms(uint64_t ms) {
  if (ms < min_lease_ms || ms > max_lease_ms)
    return make_error(errc::invalid_argument,
                      "a lease lasts 1 to 3600 seconds, not "
                        + std::to_string(ms / 1000.0).substr(0, 12) + " s");
  return caf::none;
}

caf::error validate_retry(const task_retry& x) {
  if (x.max_attempts < 1 || x.max_attempts > max_task_attempts)
    return make_error(errc::invalid_argument,
                      "max_attempts must be between 1 and 100, not "
                        + std::to_string(x.max_attempts));
  if (x.backoff_ms > max_backoff_ms)
    return make_error(errc::invalid_argument,
                      "backoff_s must be between 0 and 3600 seconds");
  return caf::none;
}

} // namespace spindle
