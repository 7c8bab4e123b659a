#pragma once

// The API's contract, docs/openapi.yaml, compiled into the binary as JSON
// (cmake/embed_openapi.py): served at GET /v1/openapi.json with the version
// spindle runs, and read by the route-table check (test_openapi).

#include <string>
#include <string_view>

namespace spindle::http {

/// The document as built, compact JSON, `info.version` as written.
std::string_view openapi_source() noexcept;

/// The document as served: `info.version` is `version`.
std::string openapi_document(std::string_view version);

} // namespace spindle::http
