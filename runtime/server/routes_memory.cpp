// Long-term memory routes (D8).

#include "router.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

void add_memory_routes(router& r) {
  r.post(R"(/v1/memories)", "POST /v1/memories",
         [&r](const request& req, response& res,
              request_context& ctx) {
           auto body = parse_body(req, {"content", "user_id", "thread_id"});
           auto content = required_string(body, "content");
           auto user = optional_string(body, "user_id").value_or("");
           auto thread = optional_string(body, "thread_id").value_or("");
           if (user.empty() && thread.empty())
             throw api_error{400, "malformed",
                             "at least one of 'user_id' and 'thread_id' is "
                             "required: a memory belongs to a user or a "
                             "thread"};
           auto stored = r.rt().store_memory(content,
                                             memory_tags(user, thread));
           if (!stored)
             fail(stored.error());
           ctx.log["memory_id"] = *stored;
           reply(res, 201, {{"id", *stored}, {"tags", memory_tags(user, thread)}});
         });

  r.get(R"(/v1/memories)", "GET /v1/memories",
        [&r](const request& req, response& res,
             request_context&) {
          for (auto& [key, value] : req.params)
            if (key != "user_id" && key != "thread_id" && key != "q"
                && key != "max_chars")
              throw api_error{400, "unknown_field",
                              "unknown query parameter '" + key.substr(0, 64)
                                + "'; this route accepts: user_id, "
                                  "thread_id, q, max_chars"};
          auto user = req.get_param_value("user_id");
          auto thread = req.get_param_value("thread_id");
          auto query = req.get_param_value("q");
          auto max_chars = query_int(req, "max_chars");
          if (max_chars && (*max_chars < 1
                            || *max_chars > int64_t{max_memory_snippet}))
            throw api_error{400, "invalid_argument",
                            "max_chars must be between 1 and 2000"};
          auto snippet = r.rt().retrieve_memory(
            user, thread, query,
            max_chars ? static_cast<uint64_t>(*max_chars)
                      : max_memory_snippet);
          if (!snippet)
            fail(snippet.error());
          reply(res, 200, {{"snippet", snippet->text},
                           {"entries", snippet->entries},
                           {"matched", snippet->matched}});
        });
}

} // namespace spindle::http
