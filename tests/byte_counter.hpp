#pragma once

// A token counter that counts one token per byte, so that budgets in tests
// are easy to compute by hand. Defined in support.cpp.

#include <cstddef>
#include <string_view>

#include "spindle/messages/tokens.hpp"

namespace spindle::test {

class byte_counter final : public token_counter {
public:
  token_encoding_id id() const noexcept override;
  std::string_view name() const noexcept override;
  size_t count_text(std::string_view text) const override;
};

} // namespace spindle::test
