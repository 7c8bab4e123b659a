// GET /v1/events: the changes of tasks and threads as a text/event-stream,
// after their commit, resumable with Last-Event-ID from a bounded backlog
// (docs/api.md, "Events").

#include <algorithm>
#include <chrono>
#include <mutex>

#include "auth.hpp"
#include "router.hpp"
#include "spindle/actors/event_log.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/task_id.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

// Every event type there is; a filter may also name a family ("task",
// "thread").
const char* const event_types[] = {
  "task.created",   "task.claimed",        "task.completed",
  "task.failed",    "task.lease_expired",  "task.stale",
  "task.retried",   "task.requeued",       "thread.created",
  "thread.forked",  "thread.turn_appended", "thread.cleared",
  "thread.deleted",
};

struct event_filter {
  /// Exact types and families; empty: every event.
  std::vector<std::string> types;
  std::string orchestration;
  std::string thread;
  /// The subscriber's tenant ("" the default tenant): nothing of another
  /// tenant passes.
  std::string tenant;

  bool matches(const event& e) const {
    if (e.tenant != tenant)
      return false;
    if (!orchestration.empty() && e.orchestration != orchestration)
      return false;
    if (!thread.empty() && e.thread != thread)
      return false;
    if (types.empty())
      return true;
    for (auto& t : types)
      if (e.type == t
          || (e.type.size() > t.size() && e.type.compare(0, t.size(), t) == 0
              && e.type[t.size()] == '.'))
        return true;
    return false;
  }
};

event_filter filter_of(const request& req) {
  event_filter out;
  if (auto types = req.get_param_value("types"); !types.empty()) {
    size_t start = 0;
    while (start <= types.size()) {
      auto end = std::min(types.find(',', start), types.size());
      auto name = types.substr(start, end - start);
      auto known = name == "task" || name == "thread"
                   || std::any_of(std::begin(event_types),
                                  std::end(event_types),
                                  [&](const char* t) { return name == t; });
      if (!known) {
        std::string all = "task, thread";
        for (auto t : event_types)
          all += std::string{", "} + t;
        throw api_error{400, "invalid_argument",
                        "types: '" + name.substr(0, 64)
                          + "' is not an event type; the types are " + all,
                        "types"};
      }
      out.types.push_back(std::move(name));
      start = end + 1;
    }
  }
  out.orchestration = req.get_param_value("orchestration");
  if (req.has_param("orchestration")) {
    auto id = task_id::parse(out.orchestration);
    if (!id || !id->is_orchestration())
      throw api_error{400, "invalid_id",
                      "orchestration: '" + out.orchestration.substr(0, 64)
                        + "' is not an orchestration ID",
                      "orchestration"};
  }
  out.thread = req.get_param_value("thread");
  if (req.has_param("thread")) {
    auto scoped = try_scoped_thread(req, out.thread);
    if (!scoped || out.thread == "new")
      throw api_error{400, "invalid_id",
                      "thread: '" + out.thread.substr(0, 64)
                        + "' is not a thread ID",
                      "thread"};
    out.thread = std::move(*scoped);
  }
  out.tenant = std::string{tenant_of_id(who(req).prefix)};
  return out;
}

// Where a resuming client left off: the sequence number after which it
// reads, or nullopt when the ID is not of this process (a reset).
struct resume_point {
  bool given = false;
  std::optional<uint64_t> after;
  std::string text;
};

resume_point resume_of(const request& req, const event_log& log) {
  resume_point out;
  out.text = req.get_header_value("Last-Event-ID");
  if (out.text.empty())
    out.text = req.get_param_value("last_event_id");
  if (out.text.empty())
    return out;
  out.given = true;
  auto dash = out.text.find('-');
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 19
           && std::all_of(s.begin(), s.end(),
                          [](char c) { return c >= '0' && c <= '9'; });
  };
  auto epoch = dash == std::string::npos ? "" : out.text.substr(0, dash);
  auto seq = dash == std::string::npos ? "" : out.text.substr(dash + 1);
  if (!digits(epoch) || !digits(seq))
    throw api_error{400, "invalid_argument",
                    "Last-Event-ID: '" + out.text.substr(0, 64)
                      + "' is not an event ID (EPOCH-SEQ, as sent in 'id:')",
                    "last_event_id"};
  if (std::stoull(epoch) == log.epoch())
    out.after = std::stoull(seq);
  return out;
}

// One subscriber's stream. Pumped by the log's dispatcher (and once by the
// route): reads what it has not sent from the backlog, keeps what matches,
// and writes it in one chunk; a slow client pauses it (flow control), and
// one that falls out of the backlog gets `reset` and goes on live.
class event_stream : public std::enable_shared_from_this<event_stream> {
public:
  event_stream(std::shared_ptr<async_call> call, std::shared_ptr<event_log> log,
               event_filter filter, uint64_t after)
    : call_(std::move(call)),
      log_(std::move(log)),
      filter_(std::move(filter)),
      after_(after),
      flow_(call_->flow()) {
  }

  void start(std::optional<std::string> reset_reason,
             const std::string& missed) {
    std::weak_ptr<event_stream> weak = shared_from_this();
    {
      std::lock_guard<std::recursive_mutex> guard{mx_};
      sub_ = log_->subscribe(
        [weak](const event_log::round& r) {
          if (auto self = weak.lock())
            self->pump(&r);
        },
        filter_.orchestration, filter_.thread);
    }
    // The connection keeps the stream until the client goes away.
    call_->on_gone([self = shared_from_this()] { self->stop(); });
    std::string first = "retry: 2000\n\n";
    if (reset_reason)
      first += reset_frame(*reset_reason, missed);
    write(std::move(first));
    pump();
  }

private:
  std::string reset_frame(const std::string& reason,
                          const std::string& missed) {
    return "id: " + std::to_string(log_->epoch()) + "-"
           + std::to_string(after_) + "\nevent: reset\ndata: {\"reason\":"
           + json_quote(reason) + ",\"last_event_id\":"
           + (missed.empty() ? std::string{"null"} : json_quote(missed))
           + "}\n\n";
  }

  bool write(std::string chunk) {
    if (!call_->write(std::move(chunk))) {
      sub_.reset();
      return false;
    }
    last_write_ = std::chrono::steady_clock::now();
    return true;
  }

  void stop() {
    std::lock_guard<std::recursive_mutex> guard{mx_};
    sub_.reset();
  }

  // `r`: the dispatcher's round, whose frames a subscriber to every event
  // takes whole when it stands where the round begins.
  void pump(const event_log::round* r = nullptr) {
    std::lock_guard<std::recursive_mutex> guard{mx_};
    if (!sub_)
      return;
    if (call_->gone()) {
      sub_.reset();
      return;
    }
    // A client that reads slowly: not woken until it caught up.
    std::weak_ptr<event_stream> weak = shared_from_this();
    if (flow_->hold([weak] {
          if (auto self = weak.lock()) {
            std::lock_guard<std::recursive_mutex> hold{self->mx_};
            if (self->sub_)
              self->sub_->resume();
          }
        })) {
      sub_->pause();
      return;
    }
    constexpr size_t page_size = 4096;
    std::string chunk;
    if (r && r->frames && after_ == r->from && filter_.types.empty()
        && filter_.orchestration.empty() && filter_.thread.empty()) {
      chunk = *r->frames;
      after_ = r->to;
    }
    for (int round = 0; round < 4; ++round) {
      auto page = log_->scan(after_, page_size, [this, &chunk](const event_ptr& e) {
        if (filter_.matches(*e))
          chunk += e->frame;
      });
      if (page.reset) {
        // Fallen out of the backlog: say so, and go on from now.
        auto missed = std::to_string(log_->epoch()) + "-"
                      + std::to_string(after_);
        after_ = log_->last();
        // What the scan gathered past the gap is dropped: the client
        // starts again from the reset.
        chunk = reset_frame("the client fell behind the backlog of "
                              + std::to_string(log_->capacity())
                              + " events",
                            missed);
        break;
      }
      after_ = page.next_after;
      if (page.seen < page_size)
        break;
    }
    if (!chunk.empty()) {
      write(std::move(chunk));
      return;
    }
    if (std::chrono::steady_clock::now() - last_write_
        >= std::chrono::seconds{14})
      write(": keep-alive\n\n");
  }

  std::shared_ptr<async_call> call_;
  std::shared_ptr<event_log> log_;
  event_filter filter_;
  uint64_t after_;
  std::shared_ptr<flow_control> flow_;
  std::recursive_mutex mx_;
  std::shared_ptr<event_log::subscription> sub_;
  std::chrono::steady_clock::time_point last_write_{};
};

} // namespace

void add_event_routes(router& r) {
  r.get_async(
    R"(/v1/events)", "GET /v1/events",
    [&r](std::shared_ptr<async_call> call) {
      auto& req = call->req();
      only_params(req, {"types", "orchestration", "thread", "last_event_id"});
      no_empty_params(req, {"last_event_id"});
      auto filter = filter_of(req);
      auto log = r.rt().events();
      auto resume = resume_of(req, *log);
      std::optional<std::string> reset;
      uint64_t after = log->last();
      if (resume.given) {
        if (!resume.after)
          reset = "the event ID is from before the server restarted";
        else if (*resume.after > log->last())
          reset = "the event ID was never sent";
        else if (*resume.after + 1 < log->oldest())
          reset = "events after it are no longer in the backlog of "
                  + std::to_string(log->capacity()) + " events";
        else
          after = *resume.after;
      }
      call->begin_stream(200, "text/event-stream",
                         {{"Cache-Control", "no-cache"},
                          {"X-Accel-Buffering", "no"}});
      auto stream = std::make_shared<event_stream>(call, std::move(log),
                                                   std::move(filter), after);
      stream->start(std::move(reset), resume.text);
    });
}

} // namespace spindle::http
