#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <caf/expected.hpp>

/// Hybrid base36: the 4-character sequence of seed 003 and decision D2.
///
///   tier 0  0000..9999   digits only
///   tier 1  A000..Z999   one letter, three digits
///   tier 2  AA00..ZZ99   two letters, two digits
///   tier 3  AAA0..ZZZ9   three letters, one digit
///   tier 4  AAAA..ZZZZ   four letters
///
/// Every valid string maps to its ordinal, the number of values before it:
/// "0000" is 0, "9999" is 9999, "A000" is 10000, "ZZZZ" is `max_ordinal`.
/// Ordinals order the strings by value ("AA00" after "Z999"), and task
/// levels render them as decimals (D2: "0012" -> t12, "A000" -> t10000).
/// All functions are pure and thread-safe.
namespace spindle::hybrid36 {

/// The ordinal of "ZZZZ", the last value there is.
inline constexpr uint64_t max_ordinal = 736335;

/// Parses exactly four characters of the grammar above (upper-case letters
/// only). Returns nullopt for anything else.
std::optional<uint64_t> parse(std::string_view text);

/// Formats an ordinal; nullopt when it is above `max_ordinal`.
std::optional<std::string> format(uint64_t ordinal);

/// The value after `text`: "9999" -> "A000", "AZ99" -> "BA00".
/// Errors: `invalid_id` when `text` is not hybrid base36, `exhausted` for
/// "ZZZZ" (the sequence never wraps).
caf::expected<std::string> increment(std::string_view text);

/// Three-way comparison by value; both arguments must be valid.
/// Returns <0, 0 or >0. Invalid input compares below valid input.
int compare(std::string_view lhs, std::string_view rhs);

/// The tier (0..4) of a valid string: how many leading letters it has.
std::optional<int> tier(std::string_view text);

} // namespace spindle::hybrid36
