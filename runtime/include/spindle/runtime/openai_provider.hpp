#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "spindle/runtime/llm.hpp"

namespace spindle {

namespace detail {
/// What the calls of one provider share: the parsed URL, the request's
/// fixed headers, the TLS context (runtime/llm/openai_provider.cpp).
struct openai_endpoint;
} // namespace detail

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
  /// Giving up on establishing the connection: name resolution, TCP
  /// connect and, for https, the TLS handshake.
  std::chrono::milliseconds connect_timeout{10000};
  /// Giving up when no byte moves for this long, once connected: while
  /// sending the request, waiting for the answer, and between two reads of
  /// the stream.
  std::chrono::milliseconds read_timeout{60000};
  /// For https: a PEM file of CA certificates trusted besides the
  /// system's default ones (a private CA, a test's self-signed
  /// certificate). Empty: the system's only.
  std::string ca_file;
  /// The event loops the calls run on, shared with other users of the
  /// pool (the HTTP server). Null: the provider makes a 1-thread pool of
  /// its own, stopped when the provider is destroyed.
  std::shared_ptr<net::io_pool> loops;
};

/// Streams chat completions over SSE (`"stream": true`), passing each
/// `choices[0].delta.content` to the delta callback as it arrives; a server
/// that answers with a plain JSON completion instead is read as one delta.
/// Every call runs on an event loop of `openai_options::loops` with a
/// connection of its own, and no thread waits on the network: timeouts are
/// timers of the loop.
/// Errors: `upstream_failure` carrying the upstream's status and message
/// (or the transport error, naming the origin), `timeout` when the call's
/// overall timeout or the read timeout passes, `unavailable` when the
/// loops were stopped and destroyed before the call ended.
class openai_provider : public llm_provider {
public:
  /// Prefer `make_openai_provider`, which refuses bad options up front;
  /// with bad options this provider fails every call.
  explicit openai_provider(openai_options options);

  /// Calls still in flight keep what they need and go on when the loops
  /// are shared; with a pool of its own, they end with `unavailable`.
  ~openai_provider() override;

  std::string name() const override;

  /// The blocking form: `start` and a wait for its end. Thread-safe, but
  /// never to be called on a thread of the provider's loops, where it
  /// would wait for itself: there it fails at once with `unavailable`.
  caf::expected<completion> complete(const prompt& messages,
                                     const completion_options& options,
                                     const delta_callback& on_delta) override;

  /// Starts the call on the next loop of the pool and returns at once;
  /// `on_delta` and then `done` run on that loop's thread (`done` runs on
  /// the destroying thread instead when the pool is destroyed first, with
  /// `unavailable`). `on_delta` returning false (or throwing) closes the
  /// connection and ends the call with the partial text, `interrupted`.
  /// Always returns true. Thread-safe.
  bool start(prompt messages, completion_options options,
             delta_callback on_delta, completion_done done) override;

  /// The options, with `loops` set to the pool in use. Thread-safe.
  const openai_options& options() const noexcept {
    return options_;
  }

private:
  openai_provider(openai_options options,
                  std::shared_ptr<const detail::openai_endpoint> ep);

  void launch(const prompt& messages,
              const completion_options& options, delta_callback on_delta,
              completion_done done);

  friend caf::expected<std::shared_ptr<llm_provider>>
  make_openai_provider(openai_options options);

  openai_options options_;
  std::shared_ptr<const detail::openai_endpoint> endpoint_;
};

/// Validates options and makes a provider. Errors: `invalid_argument` for a
/// URL without http:// or https:// (or without a host, or with a bad
/// port), an empty model, or a CA file that cannot be loaded.
caf::expected<std::shared_ptr<llm_provider>>
make_openai_provider(openai_options options);

} // namespace spindle
