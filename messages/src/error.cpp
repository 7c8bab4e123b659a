#include "spindle/messages/error.hpp"

#include <array>
#include <utility>

#include <caf/atom.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

namespace spindle {

namespace {

constexpr std::array<std::pair<errc, const char*>, 20> names{{
  {errc::invalid_argument, "invalid_argument"},
  {errc::invalid_id, "invalid_id"},
  {errc::exhausted, "exhausted"},
  {errc::not_found, "not_found"},
  {errc::already_exists, "already_exists"},
  {errc::conflict, "conflict"},
  {errc::capacity_exceeded, "capacity_exceeded"},
  {errc::timeout, "timeout"},
  {errc::storage_failure, "storage_failure"},
  {errc::io_failure, "io_failure"},
  {errc::unavailable, "unavailable"},
  {errc::upstream_failure, "upstream_failure"},
  {errc::too_large, "too_large"},
  {errc::malformed, "malformed"},
  {errc::lease_lost, "lease_lost"},
  {errc::storage_full, "storage_full"},
  {errc::storage_unavailable, "storage_unavailable"},
  {errc::not_owner, "not_owner"},
  {errc::rate_limited, "rate_limited"},
  {errc::upstream_busy, "upstream_busy"},
}};

} // namespace

std::string to_string(errc x) {
  for (auto& [code, name] : names)
    if (code == x)
      return name;
  return "unknown_error";
}

bool from_string(const std::string& name, errc& out) {
  for (auto& [code, str] : names)
    if (name == str) {
      out = code;
      return true;
    }
  return false;
}

caf::error make_error(errc code, std::string context) {
  return caf::make_error(code, std::move(context));
}

caf::error make_storage_error(const caf::error& cause, std::string context) {
  auto code = classify(cause);
  return make_error(code == errc::storage_full
                        || code == errc::storage_unavailable
                        || code == errc::invalid_argument
                        || code == errc::not_owner
                      ? code
                      : errc::storage_failure,
                    std::move(context));
}

bool is_storage_error(const caf::error& err) {
  auto code = classify(err);
  return code == errc::storage_failure || code == errc::storage_full
         || code == errc::storage_unavailable;
}

errc classify(const caf::error& err) {
  if (err.category() == error_category)
    return static_cast<errc>(err.code());
  if (err.category() == caf::atom("system")
      && static_cast<caf::sec>(err.code()) == caf::sec::request_timeout)
    return errc::timeout;
  return errc::unavailable;
}

std::string describe(const caf::error& err) {
  if (!err)
    return "none";
  std::string context;
  if (err.context().match_elements<std::string>())
    context = err.context().get_as<std::string>(0);
  std::string name;
  if (err.category() == error_category) {
    name = to_string(static_cast<errc>(err.code()));
  } else if (err.category() == caf::atom("system")) {
    auto code = static_cast<caf::sec>(err.code());
    name = to_string(classify(err));
    if (context.empty() && code != caf::sec::request_timeout)
      context = caf::to_string(code);
  } else {
    name = caf::to_string(err);
  }
  return context.empty() ? name : name + ": " + context;
}

} // namespace spindle
