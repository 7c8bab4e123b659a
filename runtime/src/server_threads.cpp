// Conversation routes: threads, messages (plain and streamed), history,
// clear, and the context builder's output.

#include <condition_variable>
#include <deque>
#include <mutex>

#include <spdlog/spdlog.h>

#include "http_metrics.hpp"
#include "http_router.hpp"
#include "spindle/runtime/logging.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

constexpr int64_t max_max_turns = 100000;

// The thread ID of a path, validated (D10); "new" only where allowed.
std::string path_thread(const httplib::Request& req, bool allow_new) {
  auto id = req.matches[1].str();
  if (id == "new" && !allow_new)
    throw api_error{400, "invalid_id",
                    "thread_id 'new' names no thread; it is only accepted "
                    "when sending a message"};
  if (auto err = validate_thread_id(id))
    fail(err);
  return id;
}

uint64_t max_turns_of(std::optional<int64_t> value, uint64_t fallback) {
  if (!value)
    return fallback;
  if (*value < 2 || *value > max_max_turns)
    throw api_error{400, "invalid_argument",
                    "max_turns must be between 2 and "
                      + std::to_string(max_max_turns) + ", not "
                      + std::to_string(*value)};
  return static_cast<uint64_t>(*value);
}

json turn_json(const turn& t) {
  json out{{"role", to_string(t.role)},
           {"content", t.content},
           {"timestamp", t.timestamp_ms}};
  if (!t.tool_call_id.empty())
    out["tool_call_id"] = t.tool_call_id;
  if (t.interrupted)
    out["interrupted"] = true;
  return out;
}

json turns_json(const std::vector<turn>& turns) {
  json out = json::array();
  for (auto& t : turns)
    out.push_back(turn_json(t));
  return out;
}

json messages_json(const std::vector<chat_message>& messages) {
  json out = json::array();
  for (auto& m : messages) {
    json msg{{"role", m.role}, {"content", m.content}};
    if (!m.tool_call_id.empty())
      msg["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(msg));
  }
  return out;
}

// Parses the body of both message routes into an exchange request.
exchange_request message_request(const httplib::Request& req,
                                 const std::string& thread_id) {
  auto body = parse_body(req, {"content", "user_id", "on_conflict",
                               "max_turns"});
  exchange_request x;
  x.thread_id = thread_id;
  x.content = required_string(body, "content");
  x.user_id = optional_string(body, "user_id").value_or("");
  if (auto policy = optional_string(body, "on_conflict")) {
    auto parsed = parse_conflict_policy(*policy);
    if (!parsed)
      fail(parsed.error());
    x.on_conflict = *parsed;
  }
  x.build.max_turns = max_turns_of(optional_int(body, "max_turns"),
                                   builder_default_max_turns);
  return x;
}

void log_exchange(request_context& ctx, const exchange_result& r) {
  ctx.log["thread_id"] = r.thread_id;
  ctx.log["turns_loaded"] = r.history_turns;
  ctx.log["found_or_created"] = r.created ? "created" : "found";
  ctx.log["thread_actor"] = r.thread_actor_id;
  ctx.log["turns"] = r.turns;
  if (!r.forked_from.empty())
    ctx.log["forked_from"] = r.forked_from;
}

json result_json(const exchange_result& r) {
  json out{{"thread_id", r.thread_id}, {"reply", r.reply}, {"turns", r.turns}};
  if (r.created)
    out["created"] = true;
  if (!r.forked_from.empty())
    out["forked_from"] = r.forked_from;
  return out;
}

std::string sse(const char* event, const json& data) {
  return std::string{"event: "} + event + "\ndata: " + dump(data) + "\n\n";
}

// Events of one streamed exchange, passed from the exchange's thread to the
// HTTP connection's thread. Shared, so it outlives whichever side ends
// first.
struct stream_state {
  std::mutex mx;
  std::condition_variable cv;
  std::deque<std::string> events;
  bool finished = false;        // the exchange ended (done or error queued)
  bool started = false;         // the first delta or the end arrived
  caf::error early_error;       // an error before anything was streamed
  std::atomic<bool> gone{false}; // the client went away

  void push(std::string event, bool last = false) {
    std::lock_guard<std::mutex> guard{mx};
    events.push_back(std::move(event));
    started = true;
    finished = finished || last;
    cv.notify_all();
  }
};

} // namespace

void add_thread_routes(router& r) {
  auto timeout = [&r] { return r.rt().options().default_timeout; };

  r.post(R"(/v1/threads)", "POST /v1/threads",
         [&r, timeout](const httplib::Request& req, httplib::Response& res,
                       request_context& ctx) {
           parse_body(req, {}, /*allow_empty=*/true);
           auto ref = r.rt().call<thread_ref>(r.rt().thread_registry(),
                                              timeout(), caf::put_atom::value,
                                              make_uuid_v4());
           if (!ref)
             fail(ref.error());
           ctx.log["thread_id"] = ref->thread_id;
           ctx.log["found_or_created"] = "created";
           reply(res, 201, {{"thread_id", ref->thread_id}});
         });

  r.post(R"(/v1/threads/([^/]+)/messages)",
         "POST /v1/threads/{id}/messages",
         [&r](const httplib::Request& req, httplib::Response& res,
              request_context& ctx) {
           auto x = message_request(req, path_thread(req, true));
           ctx.log["thread_id"] = x.thread_id;
           auto result = r.rt().send_message(std::move(x));
           if (!result)
             fail(result.error());
           log_exchange(ctx, *result);
           r.metrics().count("turns", 2);
           reply(res, 200, result_json(*result));
         });

  r.post(
    R"(/v1/threads/([^/]+)/messages/stream)",
    "POST /v1/threads/{id}/messages/stream",
    [&r](const httplib::Request& req, httplib::Response& res,
         request_context& ctx) {
      auto x = message_request(req, path_thread(req, true));
      // A new thread gets its ID here, so the first event can carry it.
      if (x.thread_id == "new")
        x.thread_id = make_uuid_v4();
      ctx.log["thread_id"] = x.thread_id;
      auto state = std::make_shared<stream_state>();
      auto requested = x.thread_id;
      auto on_delta = [state](std::string_view delta) {
        if (state->gone)
          return false; // stop generating: nobody is listening
        state->push(sse("delta", {{"content", std::string{delta}}}));
        return true;
      };
      auto* metrics = &r.metrics();
      r.rt().send_message_async(
        std::move(x), on_delta,
        [state, metrics](caf::expected<exchange_result> result) {
          if (!result) {
            std::lock_guard<std::mutex> guard{state->mx};
            if (!state->started) {
              state->early_error = result.error();
              state->finished = true;
              state->started = true;
              state->cv.notify_all();
              return;
            }
          }
          if (result) {
            // The request line is logged when streaming starts; the
            // exchange's own line follows when it ends.
            request_context tmp;
            log_exchange(tmp, *result);
            tmp.log["interrupted"] = result->interrupted;
            metrics->count("turns", 2);
            spdlog::info(log_fields("stream_exchange", tmp.log));
            auto done = result_json(*result);
            done.erase("reply");
            if (result->interrupted)
              done["interrupted"] = true;
            state->push(sse("done", done), true);
          } else {
            auto e = to_api_error(result.error());
            state->push(sse("error", {{"error", {{"code", e.code},
                                                 {"message", e.message}}}}),
                        true);
          }
        });
      // Wait for the first event: an error before any delta (a busy thread
      // with on_conflict=exit, a bad user ID, a provider that fails at
      // once) is a plain JSON error with its status.
      {
        std::unique_lock<std::mutex> lock{state->mx};
        state->cv.wait(lock, [&] { return state->started; });
        if (state->early_error)
          fail(state->early_error);
      }
      res.status = 200;
      res.set_header("Cache-Control", "no-cache");
      auto first = sse("thread", {{"thread_id", requested}});
      res.set_chunked_content_provider(
        "text/event-stream",
        [state, first, sent_first = false](size_t,
                                           httplib::DataSink& sink) mutable {
          if (!sent_first) {
            sent_first = true;
            if (!sink.write(first.data(), first.size())) {
              state->gone = true;
              return false;
            }
          }
          std::unique_lock<std::mutex> lock{state->mx};
          state->cv.wait(lock, [&] {
            return !state->events.empty() || state->finished;
          });
          while (!state->events.empty()) {
            auto event = std::move(state->events.front());
            state->events.pop_front();
            lock.unlock();
            if (!sink.is_writable() || !sink.write(event.data(), event.size())) {
              state->gone = true;
              return false;
            }
            lock.lock();
          }
          if (state->finished) {
            lock.unlock();
            sink.done();
          }
          return true;
        },
        [state](bool success) {
          if (!success)
            state->gone = true;
        });
      ctx.log["streamed"] = true;
    });

  r.get(R"(/v1/threads/([^/]+)/history)", "GET /v1/threads/{id}/history",
        [&r, timeout](const httplib::Request& req, httplib::Response& res,
                      request_context& ctx) {
          auto id = path_thread(req, false);
          auto max_turns = max_turns_of(query_int(req, "max_turns"),
                                        store_default_max_turns);
          ctx.log["thread_id"] = id;
          auto ref = r.rt().call<thread_ref>(r.rt().thread_registry(),
                                             timeout(), caf::get_atom::value,
                                             id);
          if (!ref)
            fail(ref.error());
          if (!ref->found)
            throw api_error{404, "not_found",
                            "thread '" + id + "' does not exist"};
          auto window = r.rt().read_history(id, max_turns);
          if (!window)
            fail(window.error());
          ctx.log["turns_loaded"] = window->turns.size();
          ctx.log["found_or_created"] = "found";
          reply(res, 200, {{"thread_id", id},
                           {"turns", turns_json(window->turns)},
                           {"total_turns", window->total_turns}});
        });

  r.del(R"(/v1/threads/([^/]+)/turns)", "DELETE /v1/threads/{id}/turns",
        [&r](const httplib::Request& req, httplib::Response& res,
             request_context& ctx) {
          auto id = path_thread(req, false);
          ctx.log["thread_id"] = id;
          auto cleared = r.rt().clear_thread(id);
          if (!cleared)
            fail(cleared.error());
          reply(res, 200, {{"thread_id", id}, {"cleared", *cleared}});
        });

  r.post(R"(/v1/threads/([^/]+)/context)", "POST /v1/threads/{id}/context",
         [&r](const httplib::Request& req, httplib::Response& res,
              request_context& ctx) {
           auto id = path_thread(req, false);
           auto body = parse_body(req, {"content", "user_id", "max_turns"});
           auto content = required_string(body, "content");
           auto user = optional_string(body, "user_id").value_or("");
           build_options opts;
           opts.max_turns = max_turns_of(optional_int(body, "max_turns"),
                                         builder_default_max_turns);
           ctx.log["thread_id"] = id;
           auto built = r.rt().build_context(id, user, content, opts);
           if (!built)
             fail(built.error());
           ctx.log["turns_loaded"] = built->short_term_history.size();
           ctx.log["found_or_created"] = built->thread_found ? "found"
                                                             : "not_found";
           reply(res, 200,
                 {{"thread_id", id},
                  {"messages", messages_json(built->messages)},
                  {"short_term_history", turns_json(built->short_term_history)},
                  {"memory_snippet", built->memory_snippet},
                  {"rewritten_query", built->rewritten_query},
                  {"thread_found", built->thread_found}});
         });
}

} // namespace spindle::http
