#include "recorder.hpp"

#include <filesystem>

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace spindle::http {

namespace {

class recording_responder final : public responder {
public:
  recording_responder(std::shared_ptr<response_recorder> rec,
                      const request& req, responder_ptr inner)
    : rec_(std::move(rec)), inner_(std::move(inner)) {
    entry_.method = req.method;
    entry_.target = req.target;
  }

  ~recording_responder() override {
    // A stream that ended without end_stream (the client went away, or
    // the route dropped it) is recorded as it was, marked incomplete.
    if (begun_ && !ended_) {
      entry_.complete = false;
      rec_->write(entry_);
    }
  }

  // Recorded as the connection sends it: a plain answer, or a stream
  // from its head; what a route does after that (an error it sends once
  // streaming, stream steps after a plain answer) the connection ignores,
  // and so does the record.
  void send(response res) override {
    {
      std::lock_guard<std::mutex> guard{mx_};
      if (!begun_ && !sent_) {
        sent_ = true;
        entry_.status = res.status;
        entry_.content_type = res.content_type;
        entry_.headers = res.headers;
        entry_.body = res.body;
        rec_->write(entry_);
      }
    }
    inner_->send(std::move(res));
  }

  void begin_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers)
    override {
    {
      std::lock_guard<std::mutex> guard{mx_};
      if (!sent_ && !begun_) {
        begun_ = true;
        entry_.streamed = true;
        entry_.status = status;
        entry_.content_type = content_type;
        entry_.headers = headers;
      }
    }
    inner_->begin_stream(status, std::move(content_type), std::move(headers));
  }

  bool write(std::string chunk) override {
    {
      std::lock_guard<std::mutex> guard{mx_};
      if (begun_ && !ended_) {
        if (entry_.body.size() + chunk.size() <= response_recorder::max_body)
          entry_.body += chunk;
        else
          entry_.truncated = true;
      }
    }
    return inner_->write(std::move(chunk));
  }

  std::shared_ptr<flow_control> flow() override {
    return inner_->flow();
  }

  void end_stream() override {
    {
      std::lock_guard<std::mutex> guard{mx_};
      if (begun_ && !ended_) {
        ended_ = true;
        rec_->write(entry_);
      }
    }
    inner_->end_stream();
  }

  bool gone() const noexcept override {
    return inner_->gone();
  }

  void on_gone(std::function<void()> f) override {
    inner_->on_gone(std::move(f));
  }

private:
  std::shared_ptr<response_recorder> rec_;
  responder_ptr inner_;
  std::mutex mx_;
  response_recorder::entry entry_;
  bool sent_ = false;
  bool begun_ = false;
  bool ended_ = false;
};

} // namespace

std::shared_ptr<response_recorder>
response_recorder::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto path = std::filesystem::path{dir}
              / ("responses-" + std::to_string(::getpid()) + ".jsonl");
  auto* file = std::fopen(path.c_str(), "a");
  if (!file) {
    spdlog::warn("responses are not recorded: cannot open {}", path.string());
    return nullptr;
  }
  return std::shared_ptr<response_recorder>(new response_recorder(file));
}

response_recorder::~response_recorder() {
  std::fclose(file_);
}

responder_ptr response_recorder::wrap(const request& req,
                                      responder_ptr inner) {
  return std::make_shared<recording_responder>(shared_from_this(), req,
                                               std::move(inner));
}

void response_recorder::record(const request& req, const response& res) {
  entry e;
  e.method = req.method;
  e.target = req.target;
  e.status = res.status;
  e.content_type = res.content_type;
  e.headers = res.headers;
  e.body = res.body;
  write(e);
}

void response_recorder::write(const entry& e) {
  nlohmann::json headers = nlohmann::json::array();
  for (auto& [name, value] : e.headers)
    headers.push_back({name, value});
  nlohmann::json line{{"method", e.method},
                      {"target", e.target},
                      {"status", e.status},
                      {"content_type", e.content_type},
                      {"headers", std::move(headers)},
                      {"body", e.body},
                      {"streamed", e.streamed},
                      {"complete", e.complete},
                      {"truncated", e.truncated}};
  auto text = line.dump(-1, ' ', false,
                        nlohmann::json::error_handler_t::replace)
              + "\n";
  std::lock_guard<std::mutex> guard{mx_};
  std::fwrite(text.data(), 1, text.size(), file_);
  std::fflush(file_);
}

} // namespace spindle::http
