#include "core/logging.hpp"

#include <atomic>
#include <chrono>
#include <ctime>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

std::atomic<bool> json_format{false};

// A JSON object per line. A message that is itself a JSON object (see
// log_fields) contributes its fields; any other message becomes "msg".
class json_formatter final : public spdlog::formatter {
public:
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override {
    nlohmann::json line;
    auto secs = std::chrono::system_clock::to_time_t(msg.time);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                msg.time.time_since_epoch())
                .count()
              % 1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    char full[48];
    std::snprintf(full, sizeof(full), "%s.%03dZ", stamp, static_cast<int>(ms));
    line["time"] = full;
    auto level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string{level.data(), level.size()};
    std::string_view payload{msg.payload.data(), msg.payload.size()};
    auto parsed = payload.size() > 1 && payload.front() == '{'
                    ? nlohmann::json::parse(payload, nullptr, false)
                    : nlohmann::json{};
    if (parsed.is_object())
      for (auto& [k, v] : parsed.items())
        line[k] = v;
    else
      line["msg"] = std::string{payload};
    auto text = line.dump(-1, ' ', false,
                          nlohmann::json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<json_formatter>();
  }
};

std::string text_value(const nlohmann::json& v) {
  if (v.is_string()) {
    auto s = v.get<std::string>();
    if (s.empty() || s.find_first_of(" \"=") != std::string::npos)
      return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return s;
  }
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace

caf::error setup_logging(std::string_view level, std::string_view format) {
  auto lvl = spdlog::level::from_str(std::string{level});
  if (lvl == spdlog::level::off && level != "off")
    return make_error(errc::invalid_argument,
                      "log level '" + std::string{level}
                        + "' is not one of trace, debug, info, warn, error, "
                          "off");
  if (format != "text" && format != "json")
    return make_error(errc::invalid_argument,
                      "log format '" + std::string{format}
                        + "' is not one of text, json");
  // Built directly, not through the registry, so setup may run again (the
  // CLI sets a default, `serve` its own).
  auto logger = std::make_shared<spdlog::logger>(
    "spindle", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_level(lvl);
  if (format == "json") {
    logger->set_formatter(std::make_unique<json_formatter>());
    json_format = true;
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %l %v", spdlog::pattern_time_type::utc);
    json_format = false;
  }
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  return caf::none;
}

std::string log_fields(std::string_view event, const nlohmann::json& fields) {
  if (json_format) {
    nlohmann::json obj = fields.is_object() ? fields : nlohmann::json::object();
    obj["event"] = std::string{event};
    return obj.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string out{event};
  if (fields.is_object())
    for (auto& [k, v] : fields.items())
      out += " " + k + "=" + text_value(v);
  return out;
}

} // namespace spindle
