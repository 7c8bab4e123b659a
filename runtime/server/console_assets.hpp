#pragma once

// The console's files (runtime/console/), compiled into the binary by
// cmake/embed_console.cmake: `spindle serve` serves them with no file
// beside it (docs/console.md).

#include <cstddef>
#include <string_view>

namespace spindle::http {

/// One file of the console.
struct console_asset {
  /// Its name under runtime/console/ ("index.html", "app.js").
  std::string_view name;
  std::string_view content_type;
  /// A strong ETag (quoted) from the file's SHA-256.
  std::string_view etag;
  std::string_view body;
};

/// The file named `name`, or null. Thread-safe (static data).
const console_asset* find_console_asset(std::string_view name);

/// How many files there are. Thread-safe.
size_t console_asset_count() noexcept;

} // namespace spindle::http
