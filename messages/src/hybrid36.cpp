#include "spindle/messages/hybrid36.hpp"

#include <array>

#include "spindle/messages/error.hpp"

namespace spindle::hybrid36 {

namespace {

// Tier t has t letters followed by 4 - t digits. first[t] is the ordinal of
// its first value.
constexpr std::array<uint64_t, 5> first{0, 10000, 36000, 103600, 279360};
constexpr std::array<uint64_t, 5> pow10{1, 10, 100, 1000, 10000};

bool is_upper(char c) {
  return c >= 'A' && c <= 'Z';
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

} // namespace

std::optional<int> tier(std::string_view text) {
  if (text.size() != 4)
    return std::nullopt;
  int letters = 0;
  while (letters < 4 && is_upper(text[letters]))
    ++letters;
  for (size_t i = letters; i < 4; ++i)
    if (!is_digit(text[i]))
      return std::nullopt;
  return letters;
}

std::optional<uint64_t> parse(std::string_view text) {
  auto t = tier(text);
  if (!t)
    return std::nullopt;
  uint64_t letters = 0;
  for (int i = 0; i < *t; ++i)
    letters = letters * 26 + static_cast<uint64_t>(text[i] - 'A');
  uint64_t digits = 0;
  for (size_t i = *t; i < 4; ++i)
    digits = digits * 10 + static_cast<uint64_t>(text[i] - '0');
  return first[*t] + letters * pow10[4 - *t] + digits;
}

std::optional<std::string> format(uint64_t ordinal) {
  if (ordinal > max_ordinal)
    return std::nullopt;
  int t = 4;
  while (t > 0 && ordinal < first[t])
    --t;
  auto offset = ordinal - first[t];
  auto digit_count = 4 - t;
  auto digits = offset % pow10[digit_count];
  auto letters = offset / pow10[digit_count];
  std::string out(4, '0');
  for (int i = 3; i >= t; --i) {
    out[i] = static_cast<char>('0' + digits % 10);
    digits /= 10;
  }
  for (int i = t - 1; i >= 0; --i) {
    out[i] = static_cast<char>('A' + letters % 26);
    letters /= 26;
  }
  return out;
}

caf::expected<std::string> increment(std::string_view text) {
  auto value = parse(text);
  if (!value)
    return make_error(errc::invalid_id,
                      "'" + std::string{text} + "' is not hybrid base36");
  if (*value == max_ordinal)
    return make_error(errc::exhausted,
                      "the sequence ends at ZZZZ; it never wraps");
  return *format(*value + 1);
}

int compare(std::string_view lhs, std::string_view rhs) {
  auto x = parse(lhs);
  auto y = parse(rhs);
  if (!x || !y)
    return (x ? 1 : 0) - (y ? 1 : 0);
  return *x < *y ? -1 : (*x > *y ? 1 : 0);
}

} // namespace spindle::hybrid36
