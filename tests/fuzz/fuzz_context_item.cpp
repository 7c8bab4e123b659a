// The context item codec (docs/context.md): JSON text from a client or a
// file decodes to an item or a draft, or is refused; never a crash.
//
// Invariants: an accepted item encodes back to JSON that decodes to the
// same item; its content is valid UTF-8 and its ID is `ctx-N`; a decoded
// draft makes an item; rendering an accepted item never fails.

#include <nlohmann/json.hpp>

#include "fuzz.hpp"
#include "spindle/messages/context_item.hpp"
#include "spindle/messages/ids.hpp"

using namespace spindle;
using spindle::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto input = fuzz::text(data, size);
  if (auto item = parse_context_item(input)) {
    check(is_valid_utf8(item->content()), "accepted content is UTF-8");
    check(parse_context_id(item->id()).has_value(), "accepted ID is ctx-N");
    auto again = context_item_from_json(context_item_to_json(*item));
    check(static_cast<bool>(again), "an encoded item decodes");
    check(*again == *item, "an item round-trips through JSON");
    check(!render_markdown(*item).empty(), "an item renders");
  }
  auto j = nlohmann::json::parse(input, nullptr, false);
  if (j.is_discarded())
    return 0;
  if (auto draft = context_draft_from_json(j)) {
    auto item = make_context_item(*draft, "ctx-1", 0);
    check(static_cast<bool>(item), "a decoded draft makes an item");
    check(item->content() == draft->content, "the item keeps the content");
  }
  if (j.is_object() && j.contains("metadata"))
    if (auto meta = normalize_context_metadata(j["metadata"]))
      check(static_cast<bool>(normalize_context_metadata(*meta))
              && *normalize_context_metadata(*meta) == *meta,
            "normalized metadata is a fixed point");
  return 0;
}
