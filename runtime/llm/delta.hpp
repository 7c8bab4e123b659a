#pragma once

#include <string_view>

#include "spindle/runtime/llm.hpp"

namespace spindle {

/// Passes a piece of a reply to the caller's callback; a throwing callback
/// counts as a client that went away (docs/llm.md, "Decisions"). Returns
/// whether the caller wants more. No callback wants everything.
inline bool offer_delta(const delta_callback& on_delta, std::string_view piece) {
  if (!on_delta)
    return true;
  try {
    return on_delta(piece);
  } catch (...) {
    return false;
  }
}

} // namespace spindle
