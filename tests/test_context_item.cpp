// Context items without an actor system: the value type, its JSON codec
// (checked against the seed's schema by an independent validator), the
// token estimate, markdown rendering (golden files) and the sliding-window
// data structure.

#include <ctime>
#include <fstream>
#include <random>
#include <sstream>

#include <catch2/catch.hpp>

#include "spindle/messages/context_item.hpp"
#include "spindle/messages/context_window.hpp"
#include "spindle/messages/error.hpp"
#include "support.hpp"

using namespace spindle;
using json = nlohmann::json;

namespace {

context_item item(uint64_t n, std::string content = "x",
                  context_type type = context_type::code,
                  json metadata = nullptr, int64_t timestamp = 3910982400) {
  auto made = context_item::make("ctx-" + std::to_string(n), type,
                                 std::move(content), std::move(metadata),
                                 timestamp);
  REQUIRE(made);
  return *made;
}

std::string read_file(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  REQUIRE(in.good());
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string golden(const std::string& name) {
  return read_file(std::string{SPINDLE_SOURCE_DIR} + "/tests/golden/" + name);
}

std::string schema_path() {
  return std::string{SPINDLE_SOURCE_DIR}
         + "/docs/schemas/context-item.schema.json";
}

// Validates each document against docs/schemas/context-item.schema.json
// with Debian's python3-jsonschema (Draft 7); one "valid" or
// "invalid: <reason>" per document.
std::vector<std::string> jsonschema_verdicts(const std::vector<json>& docs) {
  static const char* script = R"PY(
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft7Validator.check_schema(schema)
validator = jsonschema.Draft7Validator(schema)
for doc in json.load(sys.stdin):
    errors = sorted(e.message for e in validator.iter_errors(doc))
    print("valid" if not errors else "invalid: " + errors[0].replace("\n", " "))
)PY";
  auto result = test::run({"/usr/bin/python3", "-c", script, schema_path()},
                          json(docs).dump());
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  auto verdicts = test::lines(result.out);
  REQUIRE(verdicts.size() == docs.size());
  return verdicts;
}

// A document the codec must refuse, with the code and the words the error
// must contain.
struct refusal {
  const char* doc;
  errc code;
  const char* names;
};

const json valid_doc = json::parse(R"json({"id": "ctx-7", "type": "code",
  "content": "(+ 1 2)", "metadata": {"filename": "a.lisp", "start_line": 1,
  "end_line": 2, "package": "cl-user"}, "timestamp": 3910982400})json");

// Every refusal case of the codec that the schema can express too.
const std::vector<refusal> schema_refusals = {
  {R"({"id":"ctx-1","type":"snippet","content":"x","timestamp":1})",
   errc::invalid_argument, "type 'snippet'"},
  {R"({"id":"ctx-1","type":7,"content":"x","timestamp":1})", errc::malformed,
   "type must be a string"},
  {R"({"id":"ctx-1","type":"code","content":42,"timestamp":1})",
   errc::malformed, "content must be a string"},
  {R"({"id":"ctx-1","type":"code","content":null,"timestamp":1})",
   errc::malformed, "content must be a string"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":[1],"timestamp":1})",
   errc::malformed, "metadata must be an object or null"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":"a.lisp","timestamp":1})",
   errc::malformed, "metadata must be an object or null"},
  {R"({"id":"item-1","type":"code","content":"x","timestamp":1})",
   errc::invalid_id, "id 'item-1'"},
  {R"({"id":"ctx-x","type":"code","content":"x","timestamp":1})",
   errc::invalid_id, "id 'ctx-x'"},
  {R"({"id":"../x","type":"code","content":"x","timestamp":1})",
   errc::invalid_id, "id '../x'"},
  {R"({"id":1,"type":"code","content":"x","timestamp":1})", errc::malformed,
   "id must be a string"},
  {R"({"id":"ctx-1","type":"code","content":"x","timestamp":-1})",
   errc::invalid_argument, "timestamp must be at least 0, got -1"},
  {R"({"id":"ctx-1","type":"code","content":"x","timestamp":"now"})",
   errc::malformed, "timestamp must be an integer"},
  {R"({"id":"ctx-1","type":"code","content":"x","timestamp":1.5})",
   errc::malformed, "timestamp must be an integer"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":{"filename":3},"timestamp":1})",
   errc::malformed, "metadata.filename must be a string"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":{"package":true},"timestamp":1})",
   errc::malformed, "metadata.package must be a string"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":{"start_line":"5"},"timestamp":1})",
   errc::malformed, "metadata.start_line must be an integer"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":{"end_line":2.5},"timestamp":1})",
   errc::malformed, "metadata.end_line must be an integer"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":{"start_line":0},"timestamp":1})",
   errc::invalid_argument, "metadata.start_line must be at least 1, got 0"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":{"end_line":-3},"timestamp":1})",
   errc::invalid_argument, "metadata.end_line must be at least 1, got -3"},
  {R"({"id":"ctx-1","type":"code","content":"x","timestamp":1,"extra":1})",
   errc::malformed, "unknown property 'extra'"},
  {R"({"type":"code","content":"x","timestamp":1})", errc::malformed,
   "missing required property 'id'"},
  {R"({"id":"ctx-1","content":"x","timestamp":1})", errc::malformed,
   "missing required property 'type'"},
  {R"({"id":"ctx-1","type":"code","timestamp":1})", errc::malformed,
   "missing required property 'content'"},
  {R"({"id":"ctx-1","type":"code","content":"x"})", errc::malformed,
   "missing required property 'timestamp'"},
  {R"(["ctx-1"])", errc::malformed, "must be a JSON object, got array"},
};

// Refused by the codec although the schema cannot say so: the schema's
// pattern admits ctx-0 and leading zeros, and it cannot compare two lines.
const std::vector<refusal> codec_only_refusals = {
  {R"({"id":"ctx-0","type":"code","content":"x","timestamp":1})",
   errc::invalid_id, "id 'ctx-0'"},
  {R"({"id":"ctx-007","type":"code","content":"x","timestamp":1})",
   errc::invalid_id, "id 'ctx-007'"},
  {R"({"id":"ctx-1","type":"code","content":"x","metadata":{"start_line":9,"end_line":3},"timestamp":1})",
   errc::invalid_argument, "metadata.start_line (9) is after metadata.end_line (3)"},
};

void check_refused(const refusal& r) {
  INFO(r.doc);
  auto decoded = parse_context_item(r.doc);
  REQUIRE_FALSE(decoded);
  CHECK(classify(decoded.error()) == r.code);
  CHECK_THAT(describe(decoded.error()), Catch::Contains(r.names));
}

} // namespace

// -- the value type ---------------------------------------------------------------

TEST_CASE("context item: make keeps every field and exposes them read-only") {
  auto made = context_item::make("ctx-42", context_type::repl_history,
                                 "CL-USER> 1", {{"package", "cl-user"}},
                                 3910982400);
  REQUIRE(made);
  CHECK(made->id() == "ctx-42");
  CHECK(made->sequence() == 42);
  CHECK(made->type() == context_type::repl_history);
  CHECK(made->content() == "CL-USER> 1");
  CHECK(made->metadata() == json{{"package", "cl-user"}});
  CHECK(made->metadata_text() == R"({"package":"cl-user"})");
  CHECK(made->timestamp() == 3910982400);
  auto bare = context_item::make("ctx-1", context_type::text, "", nullptr, 0);
  REQUIRE(bare);
  CHECK(bare->metadata().is_null());
  CHECK(bare->metadata_text().empty());
}

TEST_CASE("context item: make refuses a bad ID, bad UTF-8, bad metadata and "
          "a negative timestamp, naming the field") {
  auto check = [](caf::expected<context_item> made, errc code,
                  const std::string& words) {
    REQUIRE_FALSE(made);
    CHECK(classify(made.error()) == code);
    CHECK_THAT(describe(made.error()), Catch::Contains(words));
  };
  check(context_item::make("ctx-", context_type::code, "x", nullptr, 1),
        errc::invalid_id, "id 'ctx-'");
  check(context_item::make("ctx-1", context_type::code, "bad \xC3\x28 byte",
                           nullptr, 1),
        errc::malformed, "content is not valid UTF-8");
  check(context_item::make("ctx-1", context_type::code, "\xED\xA0\x80",
                           nullptr, 1),
        errc::malformed, "content is not valid UTF-8"); // a surrogate
  check(context_item::make("ctx-1", context_type::code, "x",
                           {{"note", "\xFF"}}, 1),
        errc::malformed, "metadata contains invalid UTF-8");
  check(context_item::make("ctx-1", static_cast<context_type>(9), "x",
                           nullptr, 1),
        errc::invalid_argument, "type 9");
  check(context_item::make("ctx-1", context_type::code, "x", nullptr, -5),
        errc::invalid_argument, "timestamp must be at least 0, got -5");
  CHECK(context_item::make("ctx-1", context_type::code,
                           "\xE2\x82\xAC \xF0\x9F\x98\x80 ok", nullptr, 1));
}

TEST_CASE("context item: timestamps are Universal Time, seconds since 1900") {
  auto before = static_cast<int64_t>(std::time(nullptr));
  auto now = universal_time_now();
  auto after = static_cast<int64_t>(std::time(nullptr));
  CHECK(now >= before + 2208988800);
  CHECK(now <= after + 2208988800);
}

TEST_CASE("context item: the token estimate is ceil(UTF-8 bytes / 4)") {
  CHECK(estimate_tokens("") == 0);
  CHECK(estimate_tokens("a") == 1);
  CHECK(estimate_tokens("abcd") == 1);
  CHECK(estimate_tokens("abcde") == 2);
  CHECK(estimate_tokens("\xC3\xA9\xC3\xA9\xC3\xA9") == 2); // 3 chars, 6 bytes
  CHECK(item(1, std::string(400, 'x')).tokens() == 100);
}

// -- JSON codec --------------------------------------------------------------------

TEST_CASE("context item JSON: every type round-trips, with and without "
          "metadata") {
  for (auto type : all_context_types) {
    for (auto metadata : {json(nullptr), valid_doc["metadata"]}) {
      auto original = item(9, "line 1\nline 2 \xE2\x9C\x93 `tick`", type,
                           metadata);
      auto j = context_item_to_json(original);
      auto decoded = parse_context_item(j.dump());
      REQUIRE(decoded);
      CHECK(*decoded == original);
      CHECK(j["type"] == to_string(type));
    }
  }
}

TEST_CASE("context item JSON: written with exactly the schema's five keys") {
  auto j = context_item_to_json(item(3));
  std::vector<std::string> keys;
  for (auto& [key, value] : j.items())
    keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"content", "id", "metadata",
                                         "timestamp", "type"});
  CHECK(j["metadata"].is_null());
  CHECK(j["timestamp"].is_number_integer());
}

TEST_CASE("context item JSON: the type names are the seed's") {
  std::vector<std::string> names;
  for (auto type : all_context_types)
    names.push_back(to_string(type));
  CHECK(names == std::vector<std::string>{"code", "text", "file",
                                          "repl-history", "error", "custom"});
  for (auto& name : names)
    CHECK(to_string(*parse_context_type(name)) == name);
  CHECK_FALSE(parse_context_type("repl_history"));
  CHECK_FALSE(parse_context_type("Code"));
}

TEST_CASE("context item JSON: each malformed document is refused with an "
          "error naming the field") {
  for (auto& r : schema_refusals)
    check_refused(r);
  for (auto& r : codec_only_refusals)
    check_refused(r);
  auto syntax = parse_context_item("{\"id\": ");
  REQUIRE_FALSE(syntax);
  CHECK(classify(syntax.error()) == errc::malformed);
}

TEST_CASE("context item JSON: metadata is optional, other metadata keys pass "
          "through, integral floats become integers") {
  auto bare = parse_context_item(
    R"({"id":"ctx-5","type":"text","content":"","timestamp":0})");
  REQUIRE(bare);
  CHECK(bare->metadata().is_null());
  auto extra = parse_context_item(
    R"({"id":"ctx-5","type":"text","content":"","timestamp":0,
        "metadata":{"start_line":5.0,"end_line":5,"tags":["a",{"b":1}]}})");
  REQUIRE(extra);
  CHECK(extra->metadata()["start_line"].is_number_integer());
  CHECK(extra->metadata()["start_line"] == 5);
  CHECK(extra->metadata()["tags"] == json::parse(R"(["a",{"b":1}])"));
}

TEST_CASE("context item JSON: drafts take type, content and metadata only") {
  auto draft = context_draft_from_json(
    json::parse(R"({"content":"x","metadata":{"filename":"a.py"}})"));
  REQUIRE(draft);
  CHECK(draft->type == context_type::code);
  CHECK(draft->metadata == R"({"filename":"a.py"})");
  for (auto doc : {R"({"content":"x","id":"ctx-1"})",
                   R"({"content":"x","timestamp":1})", R"({"type":"code"})",
                   R"({"content":1})", R"({"content":"x","type":"nope"})",
                   R"({"content":"x","metadata":{"start_line":0}})"}) {
    INFO(doc);
    CHECK_FALSE(context_draft_from_json(json::parse(doc)));
  }
}

TEST_CASE("context item JSON: produced items validate against the seed's "
          "schema (python3-jsonschema)") {
  std::vector<json> docs{valid_doc};
  for (auto type : all_context_types) {
    docs.push_back(context_item_to_json(item(1, "x", type)));
    docs.push_back(context_item_to_json(
      item(123456789, "a\n```\nb", type,
           {{"filename", "src/x.cpp"}, {"start_line", 1}, {"end_line", 1},
            {"package", "p"}, {"other", {1, 2}}},
           0)));
  }
  for (auto& verdict : jsonschema_verdicts(docs))
    CHECK(verdict == "valid");
}

TEST_CASE("context item JSON: invalid documents are refused by the schema "
          "validator and by the codec alike") {
  std::vector<json> docs;
  for (auto& r : schema_refusals)
    docs.push_back(json::parse(r.doc));
  auto verdicts = jsonschema_verdicts(docs);
  for (size_t i = 0; i < docs.size(); ++i) {
    INFO(schema_refusals[i].doc);
    CHECK_THAT(verdicts[i], Catch::StartsWith("invalid: "));
    check_refused(schema_refusals[i]);
  }
}

TEST_CASE("context item JSON: the codec is stricter than the schema where "
          "the schema cannot express a rule") {
  std::vector<json> docs;
  for (auto& r : codec_only_refusals)
    docs.push_back(json::parse(r.doc));
  auto verdicts = jsonschema_verdicts(docs);
  for (size_t i = 0; i < docs.size(); ++i) {
    INFO(codec_only_refusals[i].doc);
    CHECK(verdicts[i] == "valid");
    check_refused(codec_only_refusals[i]);
  }
}

// -- markdown ------------------------------------------------------------------------

TEST_CASE("context markdown: the seed's example renders as the seed shows") {
  auto x = item(1, "(defun add (a b) (+ a b))", context_type::code,
                {{"filename", "math.lisp"}, {"start_line", 5}, {"end_line", 7}});
  CHECK(render_markdown(x) == golden("context_seed_example.md"));
}

TEST_CASE("context markdown: content with backtick fences stays inside a "
          "longer fence") {
  auto x = item(1, "Run it like this:\n```sh\nmake ````quad```` test\n```\ndone",
                context_type::code,
                {{"filename", "README.md"}, {"start_line", 1}, {"end_line", 9}});
  auto text = render_markdown(x);
  CHECK(text == golden("context_backticks.md"));
  // No content line can close the fence: each backtick run is shorter.
  auto lines = test::lines(text);
  REQUIRE(lines.size() >= 2);
  CHECK(lines[2].rfind("`````", 0) == 0);
  CHECK(lines.back() == "`````");
}

TEST_CASE("context markdown: an unknown extension gets a fence without a "
          "language") {
  auto x = item(1, "alpha\nbeta\n", context_type::file,
                {{"filename", "notes.xyz"}});
  CHECK(render_markdown(x) == golden("context_unknown_extension.md"));
}

TEST_CASE("context markdown: a window renders oldest first, one blank line "
          "between items") {
  std::vector<context_item> window{
    item(1, "Remember: the cache is per thread.", context_type::text),
    item(2, "CL-USER> (+ 1 2)\n3", context_type::repl_history,
         {{"package", "agent-q"}}),
    item(3, "The function FOO is undefined.", context_type::error,
         {{"filename", "src/agent.lisp"}, {"start_line", 42}}),
    item(4, "", context_type::custom),
    item(5, "int main() { return 0; }", context_type::code,
         {{"filename", "src/main.cpp"}, {"start_line", 3}, {"end_line", 3}}),
  };
  CHECK(render_markdown(window) == golden("context_window.md"));
  CHECK(render_markdown(std::vector<context_item>{}).empty());
}

TEST_CASE("context markdown: fence length and languages") {
  CHECK(fence_for("") == "```");
  CHECK(fence_for("``") == "```");
  CHECK(fence_for("a ``` b") == "````");
  CHECK(fence_for("``````") == "```````");
  CHECK(language_for("x.lisp") == "lisp");
  CHECK(language_for("/a/b/X.LISP") == "lisp");
  CHECK(language_for("a.hpp") == "cpp");
  CHECK(language_for("a.cc") == "cpp");
  CHECK(language_for("tool.py") == "python");
  CHECK(language_for("init.el") == "elisp");
  CHECK(language_for("CMakeLists.txt") == "cmake");
  CHECK(language_for("notes.txt").empty());
  CHECK(language_for("archive.tar.xyz").empty());
  CHECK(language_for(".bashrc").empty());
  CHECK(language_for("Makefile") == "makefile");
  CHECK(language_for("").empty());
}

TEST_CASE("context markdown: a line break in a file name cannot start a new "
          "block") {
  auto x = item(1, "x", context_type::code,
                {{"filename", "a.py\n### Injected"}});
  auto lines = test::lines(render_markdown(x));
  REQUIRE(lines.size() == 5);
  CHECK(lines[1] == "#### a.py ### Injected");
}

// -- the window data structure ----------------------------------------------------

TEST_CASE("context window: 50 items evict nothing, the 51st evicts the "
          "first") {
  context_window window;
  CHECK(window.options().capacity == 50);
  std::vector<context_item> evicted;
  for (uint64_t n = 1; n <= 50; ++n)
    REQUIRE_FALSE(window.push(item(n), &evicted));
  CHECK(evicted.empty());
  CHECK(window.size() == 50);
  REQUIRE_FALSE(window.push(item(51), &evicted));
  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].id() == "ctx-1");
  auto all = window.newest(UINT64_MAX);
  REQUIRE(all.size() == 50);
  CHECK(all.front().id() == "ctx-2");
  CHECK(all.back().id() == "ctx-51");
}

TEST_CASE("context window: capacity 100 holds 100") {
  context_window window{{100, 0}};
  std::vector<context_item> evicted;
  for (uint64_t n = 1; n <= 100; ++n)
    REQUIRE_FALSE(window.push(item(n), &evicted));
  CHECK(evicted.empty());
  CHECK(window.size() == 100);
  REQUIRE_FALSE(window.push(item(101), &evicted));
  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].id() == "ctx-1");
}

TEST_CASE("context window: capacity 0 or negative and a negative token "
          "budget are refused") {
  for (int64_t capacity : {0, -1, -50}) {
    auto err = validate(window_options{capacity, 0});
    REQUIRE(err);
    CHECK(classify(err) == errc::invalid_argument);
    CHECK_THAT(describe(err), Catch::Contains("capacity must be at least 1"));
  }
  CHECK(classify(validate(window_options{1, -1})) == errc::invalid_argument);
  CHECK_FALSE(validate(window_options{1, 0}));
  context_window window{{5, 0}};
  REQUIRE_FALSE(window.push(item(1), nullptr));
  CHECK(classify(window.configure({0, 0}, nullptr)) == errc::invalid_argument);
  CHECK(window.options().capacity == 5);
  CHECK(window.size() == 1);
}

TEST_CASE("context window: the token budget evicts oldest first") {
  context_window window{{50, 10}};
  std::vector<context_item> evicted;
  REQUIRE_FALSE(window.push(item(1, std::string(16, 'a')), &evicted)); // 4
  REQUIRE_FALSE(window.push(item(2, std::string(16, 'b')), &evicted)); // 8
  CHECK(evicted.empty());
  CHECK(window.tokens() == 8);
  REQUIRE_FALSE(window.push(item(3, std::string(12, 'c')), &evicted)); // 3
  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].id() == "ctx-1");
  CHECK(window.tokens() == 7);
  evicted.clear();
  REQUIRE_FALSE(window.push(item(4, std::string(40, 'd')), &evicted)); // 10
  REQUIRE(evicted.size() == 2);
  CHECK(evicted[0].id() == "ctx-2");
  CHECK(evicted[1].id() == "ctx-3");
  CHECK(window.size() == 1);
  CHECK(window.tokens() == 10);
}

TEST_CASE("context window: an item larger than the whole budget is refused "
          "and the window is unchanged") {
  context_window window{{50, 10}};
  REQUIRE_FALSE(window.push(item(1, "abcd"), nullptr));
  REQUIRE_FALSE(window.push(item(2, "efgh"), nullptr));
  auto before = window.newest(UINT64_MAX);
  std::vector<context_item> evicted;
  auto err = window.push(item(3, std::string(41, 'x')), &evicted); // 11
  REQUIRE(err);
  CHECK(classify(err) == errc::capacity_exceeded);
  CHECK_THAT(describe(err), Catch::Contains("token_budget of 10"));
  CHECK(evicted.empty());
  CHECK(window.newest(UINT64_MAX) == before);
  CHECK(window.tokens() == 2);
}

TEST_CASE("context window: find, erase, newest(limit), clear and duplicate "
          "IDs") {
  context_window window{{10, 0}};
  for (uint64_t n = 1; n <= 6; ++n)
    REQUIRE_FALSE(window.push(item(n), nullptr));
  CHECK(classify(window.push(item(3), nullptr)) == errc::already_exists);
  REQUIRE(window.find("ctx-4") != nullptr);
  CHECK(window.find("ctx-4")->id() == "ctx-4");
  CHECK(window.find("ctx-9") == nullptr);
  CHECK(window.find("../x") == nullptr);
  auto gone = window.erase("ctx-4");
  REQUIRE(gone);
  CHECK(gone->id() == "ctx-4");
  CHECK_FALSE(window.erase("ctx-4"));
  CHECK(window.find("ctx-4") == nullptr);
  auto newest = window.newest(3);
  REQUIRE(newest.size() == 3);
  CHECK(newest[0].id() == "ctx-3");
  CHECK(newest[1].id() == "ctx-5");
  CHECK(newest[2].id() == "ctx-6");
  CHECK(window.newest(0).empty());
  CHECK(window.size() == 5);
  auto cleared = window.clear();
  CHECK(cleared.size() == 5);
  CHECK(window.empty());
  CHECK(window.tokens() == 0);
  REQUIRE_FALSE(window.push(item(3), nullptr)); // the ID left with clear
}

TEST_CASE("context window: shrinking the bounds evicts oldest first") {
  context_window window{{10, 0}};
  for (uint64_t n = 1; n <= 10; ++n)
    REQUIRE_FALSE(window.push(item(n, "abcdefgh"), nullptr)); // 2 tokens
  std::vector<context_item> evicted;
  REQUIRE_FALSE(window.configure({7, 0}, &evicted));
  REQUIRE(evicted.size() == 3);
  CHECK(evicted.back().id() == "ctx-3");
  evicted.clear();
  REQUIRE_FALSE(window.configure({7, 9}, &evicted));
  CHECK(evicted.size() == 3); // 7 items, 14 tokens -> 4 items, 8 tokens
  CHECK(window.size() == 4);
  CHECK(window.newest(1)[0].id() == "ctx-10");
}

TEST_CASE("context window: random pushes, erases and re-bounds agree with a "
          "naive list") {
  std::mt19937_64 rng{20260117};
  for (int round = 0; round < 20; ++round) {
    window_options opts{static_cast<int64_t>(1 + rng() % 12),
                        static_cast<int64_t>(rng() % 3 == 0 ? 0 : rng() % 40)};
    context_window window{opts};
    std::vector<context_item> model;
    uint64_t next = 1;
    auto model_tokens = [&] {
      uint64_t sum = 0;
      for (auto& x : model)
        sum += x.tokens();
      return sum;
    };
    for (int step = 0; step < 3000; ++step) {
      auto op = rng() % 10;
      if (op < 6) {
        auto x = item(next++, std::string(rng() % 48, 'x'));
        std::vector<context_item> evicted, expected;
        auto err = window.push(x, &evicted);
        bool too_big = opts.token_budget > 0
                       && x.tokens() > static_cast<uint64_t>(opts.token_budget);
        REQUIRE(static_cast<bool>(err) == too_big);
        if (!too_big) {
          while (!model.empty()
                 && (model.size() + 1 > static_cast<size_t>(opts.capacity)
                     || (opts.token_budget > 0
                         && model_tokens() + x.tokens()
                              > static_cast<uint64_t>(opts.token_budget)))) {
            expected.push_back(model.front());
            model.erase(model.begin());
          }
          model.push_back(x);
        }
        REQUIRE(evicted == expected);
      } else if (op < 9 && !model.empty()) {
        auto victim = model[rng() % model.size()].id();
        auto gone = window.erase(victim);
        REQUIRE(gone);
        REQUIRE(gone->id() == victim);
        model.erase(std::find_if(model.begin(), model.end(),
                                 [&](auto& x) { return x.id() == victim; }));
      } else {
        opts = {static_cast<int64_t>(1 + rng() % 12),
                static_cast<int64_t>(rng() % 3 == 0 ? 0 : rng() % 40)};
        REQUIRE_FALSE(window.configure(opts, nullptr));
        while (!model.empty()
               && (model.size() > static_cast<size_t>(opts.capacity)
                   || (opts.token_budget > 0
                       && model_tokens()
                            > static_cast<uint64_t>(opts.token_budget))))
          model.erase(model.begin());
      }
      REQUIRE(window.size() == model.size());
      REQUIRE(window.tokens() == model_tokens());
      REQUIRE(window.newest(UINT64_MAX) == model);
      for (auto& x : model)
        REQUIRE(window.find(x.id()) != nullptr);
    }
  }
}

TEST_CASE("context window: many erases from the middle keep order and "
          "lookups intact") {
  context_window window{{5000, 0}};
  REQUIRE_FALSE(window.push(item(1), nullptr));
  uint64_t next = 2;
  for (int i = 0; i < 5000; ++i) {
    // Push two, erase the older: it sits between ctx-1 and the newer one.
    auto a = next++, b = next++;
    REQUIRE_FALSE(window.push(item(a), nullptr));
    REQUIRE_FALSE(window.push(item(b), nullptr));
    REQUIRE(window.erase("ctx-" + std::to_string(a)));
    if (i % 2 == 1)
      REQUIRE(window.erase("ctx-" + std::to_string(b)));
  }
  auto all = window.newest(UINT64_MAX);
  REQUIRE(all.size() == 2501);
  CHECK(all.front().id() == "ctx-1");
  for (size_t i = 1; i < all.size(); ++i)
    REQUIRE(all[i - 1].sequence() < all[i].sequence());
  for (auto& x : all)
    REQUIRE(window.find(x.id()) != nullptr);
}
