// The ID grammars (docs/ids.md): hybrid base36, task IDs, context item IDs,
// counter keys, and the names that become paths or keys: thread, user,
// agent, session and worker names.
//
// Invariants: every accepted ID prints back as the same text; hybrid
// values increment to their successor and compare antisymmetrically; a
// task ID is its parent's child; an accepted name never leaves a
// directory ("/", "." and ".." refused) and keeps its length limit; a
// qualified one is at most TENANT~USER~ID, each part such a name.

#include <string>

#include "fuzz.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/task_id.hpp"
#include "files/session_lock.hpp"

using namespace spindle;
using spindle::fuzz::check;

namespace {

int sign(int x) {
  return (x > 0) - (x < 0);
}

// A name safe as one path component of at most `max` bytes.
bool path_safe(std::string_view name, size_t max) {
  return !name.empty() && name.size() <= max && name != "." && name != ".."
         && name.find('/') == std::string_view::npos
         && name.find('\0') == std::string_view::npos;
}

// A qualified ID (docs/tenants.md, "Inside spindle"): at most `parts`
// parts joined by '~', the first (when there are several) a tenant ID of
// at most 32 characters, each a path-safe name of at most 128.
bool qualified_safe(std::string_view id, size_t parts) {
  size_t n = 0;
  for (;;) {
    auto sep = id.find('~');
    auto part = id.substr(0, sep);
    if (++n > parts || !path_safe(part, n == 1 && sep != id.npos ? 32 : 128))
      return false;
    if (sep == id.npos)
      return true;
    id.remove_prefix(sep + 1);
  }
}

void hybrid(std::string_view input) {
  auto value = hybrid36::parse(input);
  check(value.has_value() == hybrid36::tier(input).has_value(),
        "tier and parse agree");
  if (!value)
    return;
  check(*value <= hybrid36::max_ordinal, "an ordinal is at most ZZZZ");
  check(hybrid36::format(*value) == std::string{input},
        "a hybrid value prints as parsed");
  check(hybrid36::compare(input, input) == 0, "a value equals itself");
  auto next = hybrid36::increment(input);
  if (*value == hybrid36::max_ordinal) {
    check(!next, "ZZZZ has no successor");
  } else {
    check(next && hybrid36::parse(*next) == *value + 1,
          "increment gives the successor");
    check(hybrid36::compare(input, *next) < 0, "a value precedes its successor");
  }
}

void task(std::string_view input) {
  auto id = task_id::parse(input);
  check(static_cast<bool>(id) == is_valid_task_id(input), "parse and is_valid agree");
  if (!id)
    return;
  check(id->to_string() == input, "a task ID prints as parsed");
  check(id->depth() <= task_id::max_depth, "depth is bounded");
  check(id->orchestration >= 1, "an orchestration is not 0000");
  if (auto parent = id->parent()) {
    check(parent->child(id->sequence()) == *id, "an ID is its parent's child");
    check(parent->is_ancestor_of(*id), "a parent is an ancestor");
    check(*parent < *id, "a parent sorts first");
  } else {
    check(id->is_orchestration(), "only an orchestration has no parent");
  }
  check(static_cast<bool>(classify_counter_key(input)),
        "a task ID is a counter key");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto input = fuzz::text(data, size);
  hybrid(input);
  task(input);
  if (auto n = parse_context_id(input))
    check(format_context_id(*n) == input, "a context ID prints as parsed");
  if (auto kind = classify_counter_key(input))
    check(static_cast<bool>(render_id(input, 1)), "a counter key renders its first ID");
  if (!validate_client_thread_id(input))
    check(path_safe(input, 128) && input.find('~') == std::string_view::npos,
          "a client's thread ID is one path component");
  if (!validate_thread_id(input))
    check(qualified_safe(input, 3), "a thread ID is TENANT~USER~ID at most");
  if (!validate_client_user_id(input))
    check(path_safe(input, 128) && input.find('~') == std::string_view::npos,
          "a client's user ID is one path component");
  if (!validate_user_id(input))
    check(qualified_safe(input, 2), "a user ID is TENANT~ID at most");
  if (!validate_agent_name(input))
    check(path_safe(input, 64) && input[0] != '.' && input[0] != '-',
          "an agent name is one path component");
  if (!validate_session_name(input))
    check(path_safe(input, 64), "a session name is one path component");
  (void) validate_worker_name(input);
  // Two values at once: comparison is antisymmetric, by value.
  auto cut = input.find('\n');
  if (cut != std::string_view::npos) {
    auto a = input.substr(0, cut);
    auto b = input.substr(cut + 1);
    check(sign(hybrid36::compare(a, b)) == -sign(hybrid36::compare(b, a)),
          "hybrid comparison is antisymmetric");
    auto x = task_id::parse(a);
    auto y = task_id::parse(b);
    if (x && y)
      check(sign(compare(*x, *y)) == -sign(compare(*y, *x))
              && (compare(*x, *y) == 0) == (a == b),
            "task comparison is antisymmetric and by value");
  }
  return 0;
}
