#pragma once

// Test doubles of the LLM provider: scripted replies, failures, slowness
// and a gate that holds a reply until the test opens it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "spindle/messages/error.hpp"
#include "spindle/runtime/llm.hpp"

namespace spindle::test {

/// Replies with a fixed text (streamed in `parts` deltas) and records every
/// prompt it receives.
class scripted_provider : public llm_provider {
public:
  explicit scripted_provider(std::string reply, size_t parts = 3)
    : reply_(std::move(reply)), parts_(parts) {
  }

  std::string name() const override {
    return "scripted";
  }

  caf::expected<completion> complete(const prompt& messages,
                                     const completion_options& options,
                                     const delta_callback& on_delta) override {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      prompts_.push_back(messages.to_messages());
      timeouts_.push_back(options.timeout);
    }
    completion out;
    for (auto& piece : split_deltas(reply_, parts_)) {
      out.text += piece;
      if (on_delta && !on_delta(piece)) {
        out.interrupted = true;
        break;
      }
    }
    return out;
  }

  std::vector<std::vector<chat_message>> prompts() const {
    std::lock_guard<std::mutex> guard{mtx_};
    return prompts_;
  }

  std::vector<std::chrono::milliseconds> timeouts() const {
    std::lock_guard<std::mutex> guard{mtx_};
    return timeouts_;
  }

private:
  std::string reply_;
  size_t parts_;
  mutable std::mutex mtx_;
  std::vector<std::vector<chat_message>> prompts_;
  std::vector<std::chrono::milliseconds> timeouts_;
};

/// A scripted provider whose asynchronous form answers before `start`
/// returns: the whole reply is generated before the exchange's user turn
/// can have been stored, so every piece waits for that commit.
class instant_provider : public scripted_provider {
public:
  using scripted_provider::scripted_provider;

  bool start(prompt messages, completion_options options,
             delta_callback on_delta, completion_done done) override {
    done(complete(messages, options, on_delta));
    return true;
  }
};

/// Fails every call with `code`.
class failing_provider : public llm_provider {
public:
  explicit failing_provider(errc code = errc::upstream_failure) : code_(code) {
  }
  std::string name() const override {
    return "failing";
  }
  caf::expected<completion> complete(const prompt&,
                                     const completion_options&,
                                     const delta_callback&) override {
    ++calls;
    return make_error(code_, "the test double refuses");
  }
  std::atomic<int> calls{0};

private:
  errc code_;
};

/// Answers `reply` after sleeping `delay`, ignoring the timeout it is given
/// (a backend that hangs).
class slow_provider : public llm_provider {
public:
  slow_provider(std::chrono::milliseconds delay, std::string reply)
    : delay_(delay), reply_(std::move(reply)) {
  }
  std::string name() const override {
    return "slow";
  }
  caf::expected<completion> complete(const prompt&,
                                     const completion_options&,
                                     const delta_callback&) override {
    std::this_thread::sleep_for(delay_);
    return completion{reply_, false};
  }

private:
  std::chrono::milliseconds delay_;
  std::string reply_;
};

/// Replies "echo: {original message}" in 3 deltas, sleeping `delay` before
/// each, so concurrent exchanges overlap and each reply names its message.
class echo_provider : public llm_provider {
public:
  explicit echo_provider(std::chrono::milliseconds delay = {})
    : delay_(delay) {
  }
  std::string name() const override {
    return "echo";
  }
  caf::expected<completion> complete(const prompt& messages,
                                     const completion_options&,
                                     const delta_callback& on_delta) override {
    auto text = "echo: " + summarize_prompt(messages).original;
    completion out;
    for (auto& piece : split_deltas(text, 3)) {
      if (delay_.count() > 0)
        std::this_thread::sleep_for(delay_);
      out.text += piece;
      if (on_delta && !on_delta(piece)) {
        out.interrupted = true;
        break;
      }
    }
    return out;
  }

private:
  std::chrono::milliseconds delay_;
};

/// Holds each reply until the test opens the gate; reports how many calls
/// are waiting. The reply echoes the last message's content.
class gated_provider : public llm_provider {
public:
  std::string name() const override {
    return "gated";
  }

  caf::expected<completion> complete(const prompt& messages,
                                     const completion_options&,
                                     const delta_callback& on_delta) override {
    std::unique_lock<std::mutex> lock{mtx_};
    ++waiting_;
    cv_.notify_all();
    // Bounded, so a test that fails before opening cannot hang forever.
    cv_.wait_for(lock, std::chrono::seconds{20}, [this] { return open_; });
    --waiting_;
    lock.unlock();
    std::string text = "reply to: " + std::string{messages.back().content};
    completion out{text, false};
    if (on_delta && !on_delta(text))
      out.interrupted = true;
    return out;
  }

  /// Waits until `n` calls are held at the gate (or 10 s pass).
  bool wait_for_waiting(int n) {
    std::unique_lock<std::mutex> lock{mtx_};
    return cv_.wait_for(lock, std::chrono::seconds{10},
                        [&] { return waiting_ >= n; });
  }

  void open() {
    std::lock_guard<std::mutex> guard{mtx_};
    open_ = true;
    cv_.notify_all();
  }

  /// Opens the gate when it goes out of scope, so a failing test never
  /// leaves an exchange (and the future joining it) waiting forever.
  struct opener {
    gated_provider& gate;
    ~opener() {
      gate.open();
    }
  };

private:
  std::mutex mtx_;
  std::condition_variable cv_;
  int waiting_ = 0;
  bool open_ = false;
};

} // namespace spindle::test
