#pragma once

// What a call to the model spent (docs/usage.md), from its completion.

#include <cstdint>

#include "spindle/messages/threads.hpp"
#include "spindle/runtime/llm.hpp"

namespace spindle {

class token_counter;

/// The upstream's figures when `reply` carries them (`usage_reported`);
/// else `prompt_tokens` and the reply counted with `counter` (its text,
/// and each tool call's name and arguments), source `counted`; source
/// `none` without a counter. Counts past 2^32 - 1 are held at it.
/// Thread-safe.
turn_usage call_usage(const completion& reply, const token_counter* counter,
                      uint64_t prompt_tokens);

} // namespace spindle
