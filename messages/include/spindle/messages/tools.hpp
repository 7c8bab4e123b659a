#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <caf/error.hpp>

// The tools a chat request offers its model, in OpenAI's request format
// (docs/api.md, "Tools"): checked here once, then passed upstream as
// they came.

namespace spindle {

/// The most tools one request declares.
inline constexpr size_t max_tools = 128;

/// The largest `tools` array, as JSON text.
inline constexpr size_t max_tools_bytes = 256 * 1024;

/// Whether `name` is a tool (function) name OpenAI accepts: 1 to 64
/// characters of `[A-Za-z0-9_-]`. This function is thread-safe.
bool is_tool_name(std::string_view name);

/// Checks OpenAI's `tools` (a JSON array of `{"type": "function",
/// "function": {"name", "description"?, "parameters"?, "strict"?}}`) and
/// `tool_choice` ("none", "auto", "required" or `{"type": "function",
/// "function": {"name"}}` naming a declared tool), both as JSON texts;
/// empty for absent. A `tool_choice` needs `tools`.
/// Errors: `invalid_argument` naming the field, `too_large`.
/// This function is thread-safe.
caf::error validate_tools(std::string_view tools, std::string_view tool_choice);

} // namespace spindle
