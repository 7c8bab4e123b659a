#include "llm/signal.hpp"

#include <cmath>
#include <cstring>
#include <string>

namespace spindle {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// A decimal number at the front of `s` ("12", "1.5"), consumed; false
// when there is none.
bool take_number(std::string_view& s, double& out) {
  size_t i = 0;
  double whole = 0;
  bool digits = false;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    whole = whole * 10 + (s[i] - '0');
    digits = true;
    ++i;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    double scale = 0.1;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      whole += (s[i] - '0') * scale;
      scale /= 10;
      digits = true;
      ++i;
    }
  }
  if (!digits || whole > 1e12)
    return false;
  out = whole;
  s.remove_prefix(i);
  return true;
}

} // namespace

int64_t parse_count(std::string_view value) {
  value = trim(value);
  if (value.empty() || value.size() > 18)
    return -1;
  int64_t out = 0;
  for (char c : value) {
    if (c < '0' || c > '9')
      return -1;
    out = out * 10 + (c - '0');
  }
  return out;
}

int64_t parse_duration_ms(std::string_view value) {
  value = trim(value);
  if (value.empty())
    return -1;
  double total = 0;
  bool any = false;
  while (!value.empty()) {
    double n = 0;
    if (!take_number(value, n))
      return -1;
    double unit = 1000; // a bare number is seconds
    if (value.substr(0, 2) == "ms") {
      unit = 1;
      value.remove_prefix(2);
    } else if (!value.empty() && value.front() == 'h') {
      unit = 3600000;
      value.remove_prefix(1);
    } else if (!value.empty() && value.front() == 'm') {
      unit = 60000;
      value.remove_prefix(1);
    } else if (!value.empty() && value.front() == 's') {
      value.remove_prefix(1);
    } else if (!value.empty() || any) {
      return -1; // an unknown unit, or a bare number after units
    }
    total += n * unit;
    any = true;
  }
  return static_cast<int64_t>(std::ceil(total));
}

int64_t parse_retry_after(std::string_view value, std::time_t now) {
  value = trim(value);
  if (value.empty())
    return -1;
  if (value.front() >= '0' && value.front() <= '9') {
    double n = 0;
    auto rest = value;
    if (!take_number(rest, n) || !trim(rest).empty())
      return -1;
    return static_cast<int64_t>(std::ceil(n * 1000));
  }
  // An HTTP date: "Sun, 06 Nov 1994 08:49:37 GMT".
  std::string text{value};
  std::tm tm{};
  const char* end = strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end || *end != '\0')
    return -1;
  auto at = timegm(&tm);
  if (at == static_cast<std::time_t>(-1))
    return -1;
  return at <= now ? 0 : static_cast<int64_t>(at - now) * 1000;
}

} // namespace spindle
