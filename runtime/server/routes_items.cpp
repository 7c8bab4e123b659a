// Context item routes: add (with evictions), list, render.

#include "metrics.hpp"
#include "auth.hpp"
#include "router.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

uint64_t limit_of(const request& req) {
  auto limit = query_int(req, "limit");
  if (!limit)
    return runtime::all_items;
  if (*limit < 1)
    throw api_error{400, "invalid_argument",
                    "limit must be at least 1, not " + std::to_string(*limit)};
  return static_cast<uint64_t>(*limit);
}

} // namespace

void add_item_routes(router& r) {
  r.post(R"(/v1/threads/([^/]+)/items)", "POST /v1/threads/{id}/items",
         [&r](const request& req, response& res,
              request_context& ctx) {
           auto id = path_thread(req, true);
           auto body = parse_body(req, {"type", "content", "metadata"});
           auto draft = context_draft_from_json(body);
           if (!draft)
             fail(draft.error());
           ctx.log["thread_id"] = id;
           auto added = r.rt().add_context(id, std::move(*draft));
           if (!added)
             fail(added.error());
           ctx.log["item"] = added->item.id();
           ctx.log["evicted"] = added->evicted.size();
           r.metrics().count("evictions",
                             static_cast<double>(added->evicted.size()));
           reply(res, 201, {{"item", context_item_to_json(added->item)},
                            {"evicted", added->evicted}});
         });

  r.get(R"(/v1/threads/([^/]+)/items)", "GET /v1/threads/{id}/items",
        [&r](const request& req, response& res,
             request_context& ctx) {
          auto id = path_thread(req, true);
          auto limit = limit_of(req);
          ctx.log["thread_id"] = id;
          auto items = r.rt().context_items(id, limit);
          if (!items)
            fail(items.error());
          json list = json::array();
          for (auto& item : *items)
            list.push_back(context_item_to_json(item));
          reply(res, 200, {{"thread_id", local(req, id)}, {"items", list}});
        });

  r.get(R"(/v1/threads/([^/]+)/items/render)",
        "GET /v1/threads/{id}/items/render",
        [&r](const request& req, response& res,
             request_context& ctx) {
          auto id = path_thread(req, true);
          auto limit = limit_of(req);
          ctx.log["thread_id"] = id;
          auto text = r.rt().render_context(id, limit);
          if (!text)
            fail(text.error());
          res.status = 200;
          res.set_content(*text, "text/markdown; charset=utf-8");
        });
}

} // namespace spindle::http
