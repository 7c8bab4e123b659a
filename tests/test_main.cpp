#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

namespace {

// spdlog's registry is a function-local static of libspdlog, which is not
// built with TSan: TSan cannot see its guard, and reports the first log
// calls of two threads as a race. Made here, before any test's threads.
const bool spdlog_ready = [] {
  return spdlog::default_logger_raw() != nullptr;
}();

} // namespace
