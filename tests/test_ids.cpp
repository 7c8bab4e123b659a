// Pure ID functions of messages/: hybrid base36, the task ID grammar,
// context IDs and counter keys. No actor system involved.

#include <algorithm>
#include <random>

#include <catch2/catch.hpp>

#include "spindle/messages/error.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/task_id.hpp"

using namespace spindle;

namespace {

std::string inc(const std::string& x) {
  auto next = hybrid36::increment(x);
  REQUIRE(next);
  return *next;
}

} // namespace

TEST_CASE("hybrid36: every tier transition increments to the next tier") {
  CHECK(inc("0000") == "0001");
  CHECK(inc("0001") == "0002");
  CHECK(inc("0009") == "0010");
  CHECK(inc("9999") == "A000");
  CHECK(inc("A009") == "A010");
  CHECK(inc("A999") == "B000");
  CHECK(inc("Z999") == "AA00");
  CHECK(inc("AA99") == "AB00");
  CHECK(inc("AZ99") == "BA00");
  CHECK(inc("ZZ99") == "AAA0");
  CHECK(inc("AAZ9") == "ABA0");
  CHECK(inc("ZZZ9") == "AAAA");
  CHECK(inc("AAAZ") == "AABA");
  CHECK(inc("ZZZY") == "ZZZZ");
}

TEST_CASE("hybrid36: ZZZZ is the end - incrementing it is refused, never "
          "wrapped") {
  auto next = hybrid36::increment("ZZZZ");
  REQUIRE_FALSE(next);
  CHECK(classify(next.error()) == errc::exhausted);
  CHECK(hybrid36::parse("ZZZZ") == hybrid36::max_ordinal);
  CHECK_FALSE(hybrid36::format(hybrid36::max_ordinal + 1));
}

TEST_CASE("hybrid36: parse and format are inverse over the whole space") {
  uint64_t expected = 0;
  std::string text = "0000";
  while (true) {
    auto value = hybrid36::parse(text);
    REQUIRE(value);
    REQUIRE(*value == expected);
    REQUIRE(hybrid36::format(expected) == text);
    auto next = hybrid36::increment(text);
    if (!next)
      break;
    REQUIRE(hybrid36::compare(text, *next) < 0);
    text = *next;
    ++expected;
  }
  CHECK(text == "ZZZZ");
  CHECK(expected == hybrid36::max_ordinal);
}

TEST_CASE("hybrid36: ordering is by value across tiers, not by string") {
  CHECK(hybrid36::compare("9999", "A000") < 0);
  CHECK(hybrid36::compare("Z999", "AA00") < 0); // "AA00" < "Z999" as strings
  CHECK(hybrid36::compare("ZZ99", "AAA0") < 0);
  CHECK(hybrid36::compare("ZZZ9", "AAAA") < 0);
  CHECK(hybrid36::compare("B000", "A999") > 0);
  CHECK(hybrid36::compare("0042", "0042") == 0);
  std::vector<std::string> xs{"AAAA", "0001", "Z999", "AA00", "A000", "9999",
                              "ZZZ9", "AAA0"};
  std::sort(xs.begin(), xs.end(), [](auto& a, auto& b) {
    return hybrid36::compare(a, b) < 0;
  });
  CHECK(xs == std::vector<std::string>{"0001", "9999", "A000", "Z999", "AA00",
                                       "AAA0", "ZZZ9", "AAAA"});
}

TEST_CASE("hybrid36: malformed strings are refused") {
  for (auto bad : {"", "1", "001", "00001", "a000", "A0B0", "0A00", "AA0A",
                   "A00A", "00-1", " 001", "A 00", "ÄÄÄÄ"}) {
    INFO(bad);
    CHECK_FALSE(hybrid36::parse(bad));
    auto next = hybrid36::increment(bad);
    REQUIRE_FALSE(next);
    CHECK(classify(next.error()) == errc::invalid_id);
  }
}

TEST_CASE("task_id: parses orchestrations, tasks and subtasks") {
  auto orch = task_id::parse("0001");
  REQUIRE(orch);
  CHECK(orch->is_orchestration());
  CHECK(orch->depth() == 0);
  CHECK(orch->sequence() == 1);
  CHECK_FALSE(orch->parent());

  auto t = task_id::parse("0001_t12");
  REQUIRE(t);
  CHECK(t->depth() == 1);
  CHECK(t->sequence() == 12);
  CHECK(t->path == std::vector<uint64_t>{12});
  CHECK(t->parent()->to_string() == "0001");

  auto deep = task_id::parse("A000_t1.2.3");
  REQUIRE(deep);
  CHECK(deep->depth() == 3);
  CHECK(deep->sequence() == 3);
  CHECK(deep->path == std::vector<uint64_t>{1, 2, 3});
  CHECK(deep->orchestration == 10000);
  CHECK(deep->parent()->to_string() == "A000_t1.2");
  CHECK(deep->parent()->parent()->to_string() == "A000_t1");
  CHECK(deep->to_string() == "A000_t1.2.3");
}

TEST_CASE("task_id: children render as _tN below an orchestration and .N "
          "below a task") {
  auto orch = *task_id::parse("0001");
  CHECK(orch.child(1).to_string() == "0001_t1");
  CHECK(orch.child(1).child(2).to_string() == "0001_t1.2");
  CHECK(orch.child(1).child(2).child(3).to_string() == "0001_t1.2.3");
  CHECK(orch.is_ancestor_of(orch.child(1).child(2)));
  CHECK_FALSE(orch.child(1).is_ancestor_of(orch.child(2)));
  CHECK_FALSE(orch.is_ancestor_of(orch));
}

TEST_CASE("task_id: grammar rejections name the problem") {
  for (auto bad :
       {"", "0000", "000", "00001", "0001_", "0001_t", "0001_t0", "0001_t01",
        "0001_t1.", "0001_t1..2", "0001_t1.0", "0001.1", "0001_x1", "0001t1",
        "0001_t-1", "0001_t1_t2", "0001_t1.2a", "../x", "0001/../x",
        "0001_t736336", "0001_t99999999", "a001", "0001 _t1", "0001_T1"}) {
    INFO(bad);
    auto id = task_id::parse(bad);
    REQUIRE_FALSE(id);
    CHECK(classify(id.error()) == errc::invalid_id);
    CHECK(describe(id.error()).find("is not a task ID") != std::string::npos);
  }
  std::string too_deep = "0001_t1";
  for (size_t i = 0; i < task_id::max_depth; ++i)
    too_deep += ".1";
  CHECK_FALSE(task_id::parse(too_deep));
}

TEST_CASE("task_id: comparison is by value - t10 after t9, parents before "
          "children") {
  auto cmp = [](const char* a, const char* b) {
    return compare(*task_id::parse(a), *task_id::parse(b));
  };
  CHECK(cmp("0001_t9", "0001_t10") < 0);
  CHECK(cmp("0001_t1.9", "0001_t1.10") < 0);
  CHECK(cmp("0001", "0001_t1") < 0);
  CHECK(cmp("0001_t1", "0001_t1.1") < 0);
  CHECK(cmp("0001_t2", "0001_t1.5") > 0);
  CHECK(cmp("Z999_t5", "AA00_t1") < 0);
  CHECK(cmp("0002", "0001_t99") > 0);
  CHECK(cmp("0001_t3.4", "0001_t3.4") == 0);
}

TEST_CASE("task_id: random IDs round-trip through text") {
  std::mt19937_64 rng{42};
  for (int i = 0; i < 2000; ++i) {
    task_id id;
    id.orchestration = 1 + rng() % hybrid36::max_ordinal;
    auto depth = rng() % 6;
    for (size_t d = 0; d < depth; ++d)
      id.path.push_back(1 + rng() % hybrid36::max_ordinal);
    auto text = id.to_string();
    auto back = task_id::parse(text);
    REQUIRE(back);
    REQUIRE(*back == id);
    REQUIRE(back->to_string() == text);
  }
}

TEST_CASE("context IDs: ctx-N with N >= 1 in canonical form") {
  CHECK(format_context_id(1) == "ctx-1");
  CHECK(parse_context_id("ctx-42") == 42u);
  CHECK(parse_context_id("ctx-9223372036854775807")
        == 9223372036854775807ull);
  for (auto bad : {"ctx-", "ctx-0", "ctx-01", "ctx--1", "ctx-1a", "CTX-1",
                   "ctx1", "ctx-9223372036854775808", "ctx-99999999999999999999"})
    CHECK_FALSE(parse_context_id(bad));
}

TEST_CASE("counter keys: ctx, global or a task ID - IDs render per kind") {
  CHECK(classify_counter_key("ctx") == counter_kind::context);
  CHECK(classify_counter_key("global") == counter_kind::orchestration);
  CHECK(classify_counter_key("0001_t3") == counter_kind::task);
  for (auto bad : {"", "Global", "../x", "ctx-1", "0000", "0001_t0"}) {
    auto k = classify_counter_key(bad);
    REQUIRE_FALSE(k);
    CHECK(classify(k.error()) == errc::invalid_id);
  }
  CHECK(render_id("ctx", 7) == std::string{"ctx-7"});
  CHECK(render_id("global", 10000) == std::string{"A000"});
  CHECK(render_id("0001", 12) == std::string{"0001_t12"});
  CHECK(render_id("0001_t1", 7) == std::string{"0001_t1.7"});
  CHECK(classify(render_id("global", 736336).error()) == errc::exhausted);
  CHECK(classify(render_id("global", 0).error()) == errc::exhausted);
  auto ids = render_ids(id_range{"0001_t2", 9, 3});
  REQUIRE(ids);
  CHECK(*ids == std::vector<std::string>{"0001_t2.9", "0001_t2.10",
                                         "0001_t2.11"});
}

TEST_CASE("errors: every code has a stable name that parses back") {
  for (uint8_t c = 1; c <= static_cast<uint8_t>(errc::storage_unavailable);
       ++c) {
    auto code = static_cast<errc>(c);
    auto name = to_string(code);
    CHECK(name != "unknown_error");
    errc back{};
    REQUIRE(from_string(name, back));
    CHECK(back == code);
  }
  CHECK(describe(make_error(errc::invalid_id, "'x' is bad"))
        == "invalid_id: 'x' is bad");
}

TEST_CASE("thread IDs: 1-128 characters of [A-Za-z0-9._:-], never . or ..") {
  for (std::string good : {std::string{"a"}, std::string{"new"},
                           std::string{"user:42"}, std::string{"t-1_2.3"},
                           std::string(128, 'x')})
    CHECK_FALSE(validate_thread_id(good));
  for (auto bad : {"", ".", "..", "../x", "a/b", "a%2Fb", "a b", "a\\b", "ä",
                   "x\n"}) {
    INFO(bad);
    auto err = validate_thread_id(bad);
    REQUIRE(err);
    CHECK(classify(err) == errc::invalid_id);
    CHECK(describe(err).find("thread_id") != std::string::npos);
  }
  CHECK(validate_thread_id(std::string(129, 'x')));
  CHECK(validate_thread_id(std::string(10000, 'x')));
}

TEST_CASE("agent names: safe path components only") {
  for (auto good : {"claude", "agent_1", "a.b-c"})
    CHECK_FALSE(validate_agent_name(good));
  for (auto bad : {"", ".", "..", "../x", "a/b", "-rf", ".hidden", "a b",
                   "a:b"}) {
    INFO(bad);
    auto err = validate_agent_name(bad);
    REQUIRE(err);
    CHECK(classify(err) == errc::invalid_id);
  }
}
