// POST /v1/ids: IDs from the allocator over HTTP.

#include "auth.hpp"
#include "router.hpp"
#include "spindle/messages/task_id.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

void add_id_routes(router& r) {
  r.post(R"(/v1/ids)", "POST /v1/ids",
         [&r](const request& req, response& res,
              request_context&) {
           auto body = parse_body(req, {"kind", "parent"});
           auto kind = required_string(body, "kind");
           auto parent = optional_string(body, "parent");
           caf::expected<std::string> id{caf::error{}};
           if (kind == "task") {
             if (!parent)
               throw api_error{400, "malformed",
                               "field 'parent' is required for kind 'task'"};
             // With tenants, only under a task of the request's tenant: a
             // parent of another answers as a missing one.
             if (who(req).who != tenancy::principal::kind::open) {
               if (auto parsed = task_id::parse(*parent); !parsed)
                 fail(parsed.error());
               if (auto found = r.rt().task(who(req).qualify(*parent));
                   !found)
                 fail(found.error());
             }
             id = r.rt().next_task_id(*parent);
           } else if (parent) {
             throw api_error{400, "malformed",
                             "field 'parent' is only allowed with kind "
                             "'task'"};
           } else if (kind == "context") {
             id = r.rt().next_context_id();
           } else if (kind == "orchestration") {
             id = r.rt().next_orchestration_id();
           } else {
             throw api_error{400, "invalid_argument",
                             "field 'kind' must be one of context, "
                             "orchestration, task; not '"
                               + kind.substr(0, 32) + "'"};
           }
           if (!id)
             fail(id.error());
           reply(res, 200, {{"id", *id}});
         });
}

} // namespace spindle::http
