#pragma once

// A fake OpenAI-compatible chat completions server on 127.0.0.1 for tests:
// it records every request's messages array and answers with a scripted
// reply, streamed over SSE (or as plain JSON, or as an error). A scripted
// reply may call tools: streamed, each call's arguments come in pieces.

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/runtime/openai_provider.hpp"

namespace spindle::test {

class fake_openai {
public:
  enum class mode { stream, plain, error, slow, hang_up };

  fake_openai() {
    svr_.Post("/v1/chat/completions", [this](const httplib::Request& req,
                                             httplib::Response& res) {
      auto body = nlohmann::json::parse(req.body, nullptr, false);
      auto now = std::chrono::steady_clock::now();
      bool refuse = false;
      {
        std::lock_guard<std::mutex> guard{mx_};
        requests_.push_back(body);
        auth_.push_back(req.get_header_value("Authorization"));
        refuse = now < refuse_until_;
        std::string last;
        if (body.is_object() && body.contains("messages")
            && body["messages"].is_array() && !body["messages"].empty()
            && body["messages"].back().is_object())
          last = body["messages"].back().value("content", std::string{});
        arrivals_.push_back({now, refuse ? refuse_status_ : 200, last});
        if (!refuse)
          for (auto& [k, v] : headers_)
            res.set_header(k, v);
        else if (!retry_after_.empty())
          res.set_header("Retry-After", retry_after_);
      }
      if (refuse) {
        res.status = refuse_status_;
        res.set_content(R"({"error":{"message":"Rate limit reached",)"
                        R"("type":"requests","code":"rate_limit_exceeded"}})",
                        "application/json");
        return;
      }
      auto message = next_message();
      auto reply = message.value("content", std::string{});
      switch (mode_.load()) {
        case mode::error:
          res.status = 500;
          res.set_content(R"({"error":{"message":"model is overloaded"}})",
                          "application/json");
          return;
        case mode::plain:
          message["role"] = "assistant";
          if (!message.contains("content"))
            message["content"] = nullptr;
          {
            nlohmann::json answer{{"choices", {{{"message", message}}}}};
            if (auto u = usage(); !u.is_null())
              answer["usage"] = u;
            res.set_content(answer.dump(), "application/json");
          }
          return;
        case mode::hang_up:
          res.status = 200;
          res.set_chunked_content_provider(
            "text/event-stream",
            [](size_t, httplib::DataSink&) { return false; });
          return;
        default:
          break;
      }
      auto slow = mode_ == mode::slow;
      // OpenAI's last chunk, when the request asked for it.
      nlohmann::json usage_chunk;
      auto asked = body.is_object() && body.contains("stream_options")
                   && body["stream_options"].is_object()
                   && body["stream_options"].value("include_usage", false);
      if (auto u = usage(); !u.is_null() && asked)
        usage_chunk = {{"choices", nlohmann::json::array()}, {"usage", u}};
      res.set_chunked_content_provider(
        "text/event-stream",
        [reply, message, slow, usage_chunk,
         this](size_t, httplib::DataSink& sink) {
          auto send = [&sink](const nlohmann::json& delta,
                              const char* finish = nullptr) {
            nlohmann::json choice{{"delta", delta}};
            if (finish)
              choice["finish_reason"] = finish;
            nlohmann::json event{
              {"choices", nlohmann::json::array({choice})}};
            auto line = "data: " + event.dump() + "\n\n";
            return sink.write(line.data(), line.size());
          };
          for (size_t i = 0; i < reply.size(); i += chunk_) {
            if (slow)
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
            if (!send({{"content", reply.substr(i, chunk_)}}))
              return false;
          }
          auto calls = message.find("tool_calls");
          if (calls != message.end()) {
            for (size_t c = 0; c < calls->size(); ++c) {
              auto& call = (*calls)[c];
              auto args = call["function"].value("arguments", std::string{});
              if (!send({{"tool_calls",
                          {{{"index", c},
                            {"id", call["id"]},
                            {"type", "function"},
                            {"function",
                             {{"name", call["function"]["name"]},
                              {"arguments", ""}}}}}}}))
                return false;
              for (size_t i = 0; i < args.size(); i += chunk_)
                if (!send({{"tool_calls",
                            {{{"index", c},
                              {"function",
                               {{"arguments", args.substr(i, chunk_)}}}}}}}))
                  return false;
            }
            if (!send(nlohmann::json::object(), "tool_calls"))
              return false;
          }
          if (!usage_chunk.is_null()) {
            auto line = "data: " + usage_chunk.dump() + "\n\n";
            if (!sink.write(line.data(), line.size()))
              return false;
          }
          std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        });
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread{[this] { svr_.listen_after_bind(); }};
    while (!svr_.is_running())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  ~fake_openai() {
    svr_.stop();
    thread_.join();
  }

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }

  /// An OpenAI provider's options for this server, model "test-model".
  openai_options options() const {
    openai_options o;
    o.base_url = url() + "/v1";
    o.model = "test-model";
    return o;
  }

  void set_mode(mode m) {
    mode_ = m;
  }

  /// Replies are taken in order; the last one repeats.
  void set_replies(std::vector<std::string> replies) {
    std::lock_guard<std::mutex> guard{mx_};
    replies_ = std::move(replies);
  }

  /// As `set_replies`, with whole assistant messages in OpenAI's form
  /// (`content`, `tool_calls`); they take the place of the text replies.
  void set_messages(std::vector<nlohmann::json> messages) {
    std::lock_guard<std::mutex> guard{mx_};
    messages_ = std::move(messages);
  }

  /// The `usage` every answer reports (plain, or streamed when the
  /// request sets `stream_options.include_usage`); none by default.
  void set_usage(uint64_t prompt_tokens, uint64_t completion_tokens) {
    std::lock_guard<std::mutex> guard{mx_};
    usage_ = {{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
  }

  /// Answers `status` (429, 503) with `Retry-After: retry_after` (none
  /// when empty) to every request until `until`.
  void refuse_until(std::chrono::steady_clock::time_point until,
                    int status = 429, std::string retry_after = "2") {
    std::lock_guard<std::mutex> guard{mx_};
    refuse_until_ = until;
    refuse_status_ = status;
    retry_after_ = std::move(retry_after);
  }

  /// Headers every answer that is not refused carries (x-ratelimit-*).
  void set_headers(std::vector<std::pair<std::string, std::string>> h) {
    std::lock_guard<std::mutex> guard{mx_};
    headers_ = std::move(h);
  }

  /// A request as it arrived: when, the status it was answered with, and
  /// its last message's content.
  struct arrival {
    std::chrono::steady_clock::time_point at;
    int status;
    std::string last;
  };
  std::vector<arrival> arrivals() const {
    std::lock_guard<std::mutex> guard{mx_};
    return arrivals_;
  }

  std::vector<nlohmann::json> requests() const {
    std::lock_guard<std::mutex> guard{mx_};
    return requests_;
  }

  std::vector<std::string> auth_headers() const {
    std::lock_guard<std::mutex> guard{mx_};
    return auth_;
  }

private:
  nlohmann::json usage() const {
    std::lock_guard<std::mutex> guard{mx_};
    return usage_;
  }

  nlohmann::json next_message() {
    std::lock_guard<std::mutex> guard{mx_};
    auto at = served_++;
    if (!messages_.empty())
      return messages_[std::min(at, messages_.size() - 1)];
    if (replies_.empty())
      return {{"content", "fake reply"}};
    return {{"content", replies_[std::min(at, replies_.size() - 1)]}};
  }

  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<mode> mode_{mode::stream};
  size_t chunk_ = 7;
  mutable std::mutex mx_;
  std::vector<nlohmann::json> requests_;
  std::vector<std::string> auth_;
  std::vector<std::string> replies_;
  std::vector<nlohmann::json> messages_;
  nlohmann::json usage_;
  size_t served_ = 0;
  std::chrono::steady_clock::time_point refuse_until_{};
  int refuse_status_ = 429;
  std::string retry_after_;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::vector<arrival> arrivals_;
};

} // namespace spindle::test
