// Long-term memory's matching (docs/memory.md): the words an entry is
// indexed by and a message is looked up with, the snippet built from
// ranked entries, and the container tags of a scope.
//
// Invariants: a word is at most `max_memory_word` bytes and never empty;
// at most `max_memory_query_terms` distinct terms; normalising is
// idempotent; a snippet never exceeds its budget; tags made from a scope
// parse back to it.

#include <set>
#include <string>
#include <vector>

#include "fuzz.hpp"
#include "spindle/messages/memory.hpp"

using namespace spindle;
using spindle::fuzz::check;

namespace {

std::vector<std::string> lines(std::string_view input) {
  std::vector<std::string> out;
  while (!input.empty()) {
    auto nl = input.find('\n');
    out.emplace_back(input.substr(0, nl));
    input = nl == std::string_view::npos ? std::string_view{}
                                         : input.substr(nl + 1);
  }
  return out;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto input = fuzz::text(data, size);
  for (auto& w : memory_words(input))
    check(!w.empty() && w.size() <= max_memory_word,
          "a word has 1 to max_memory_word bytes");
  auto terms = memory_query_terms(input);
  check(terms.size() <= max_memory_query_terms, "at most 32 terms");
  check(std::set<std::string>(terms.begin(), terms.end()).size()
          == terms.size(),
        "terms are distinct");
  auto normal = memory_normalized(input);
  check(memory_normalized(normal) == normal, "normalising is idempotent");
  check(memory_shortest_cut(input) <= normal.size(),
        "the shortest cut fits in the entry");
  auto entries = lines(input);
  for (size_t budget : {size_t{0}, size_t{40}, max_memory_snippet}) {
    auto snippet = build_memory_snippet(entries, budget);
    check(snippet.text.size() <= budget, "a snippet keeps its budget");
  }
  if (auto scope = parse_memory_tags(entries)) {
    check(!scope->user_id.empty() || !scope->thread_id.empty(),
          "a scope names a user or a thread");
    auto again = parse_memory_tags(memory_tags(scope->user_id,
                                               scope->thread_id));
    check(again && again->user_id == scope->user_id
            && again->thread_id == scope->thread_id,
          "tags round-trip");
  }
  return 0;
}
