#pragma once

#include <string>
#include <string_view>

#include <caf/error.hpp>
#include <nlohmann/json.hpp>

namespace spindle {

/// Configures spdlog's default logger for a spindle process: `level` is one
/// of trace, debug, info, warn, error, off; `format` is "text" (one line of
/// `time level message`) or "json" (one JSON object per line). Messages
/// built with `log_fields` become fields of the JSON object; plain messages
/// become its "msg". Errors: `invalid_argument` naming the bad value.
caf::error setup_logging(std::string_view level, std::string_view format);

/// Renders structured fields as one log message: `key=value ...` in text
/// format, or a JSON object whose fields the JSON formatter merges into
/// the line. Values are JSON; strings are quoted in text form only when
/// they contain spaces or quotes. This function is thread-safe.
std::string log_fields(std::string_view event, const nlohmann::json& fields);

} // namespace spindle
