#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "spindle/runtime/llm.hpp"

namespace spindle {

/// Where and how to reach an OpenAI-compatible chat completions endpoint
/// (OpenAI, llama.cpp's server, Ollama, vLLM, ...).
struct openai_options {
  /// Base URL: scheme, host, port and any path prefix, without the
  /// trailing "/v1" (which is accepted and dropped), e.g.
  /// "http://127.0.0.1:8081". Requests go to {base}/v1/chat/completions.
  std::string base_url;
  /// The "model" field of each request.
  std::string model;
  /// Sent as "Authorization: Bearer ..." when set (SPINDLE_LLM_API_KEY).
  std::string api_key;
  /// Giving up on establishing the connection.
  std::chrono::milliseconds connect_timeout{10000};
  /// Giving up when no byte arrives for this long.
  std::chrono::milliseconds read_timeout{60000};
};

/// Streams chat completions over SSE (`"stream": true`), passing each
/// `choices[0].delta.content` to the delta callback as it arrives; a server
/// that answers with a plain JSON completion instead is read as one delta.
/// Errors: `upstream_failure` carrying the upstream's status and message
/// (or the transport error), `timeout` when the call's overall timeout or
/// the read timeout passes. Thread-safe: each call uses its own connection.
class openai_provider : public llm_provider {
public:
  explicit openai_provider(openai_options options);

  std::string name() const override;

  caf::expected<completion> complete(const std::vector<chat_message>& messages,
                                     const completion_options& options,
                                     const delta_callback& on_delta) override;

  const openai_options& options() const noexcept {
    return options_;
  }

private:
  openai_options options_;
  std::string path_prefix_;
  std::string origin_;
};

/// Validates options and makes a provider. Errors: `invalid_argument` for a
/// URL without http:// or https:// or an empty model.
caf::expected<std::shared_ptr<llm_provider>>
make_openai_provider(openai_options options);

} // namespace spindle
