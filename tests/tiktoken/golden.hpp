#pragma once

// The tokenizer against the reference (tests/tiktoken/reference.mjs): reads
// a corpus written by corpus.mjs and the reference's tokens, and describes
// the first difference with its context. Shared by tests/test_tokenizer.cpp
// and bench/bench_tokens.cpp.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "spindle/runtime/tokenizer.hpp"

namespace spindle::golden {

struct record {
  std::string label;
  std::string text;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

inline uint32_t read_u32(const std::string& data, size_t& at) {
  if (at + 4 > data.size())
    throw std::runtime_error("truncated file");
  uint32_t v;
  std::memcpy(&v, data.data() + at, 4);
  at += 4;
  return v;
}

/// The records of a corpus file (corpus.mjs).
inline std::vector<record> read_corpus(const std::string& path) {
  auto data = slurp(path);
  size_t at = 0;
  std::vector<record> out(read_u32(data, at));
  for (auto& r : out) {
    auto n = read_u32(data, at);
    r.label = data.substr(at, n);
    at += n;
    n = read_u32(data, at);
    r.text = data.substr(at, n);
    at += n;
  }
  return out;
}

/// The reference's tokens of each record (reference.mjs).
inline std::vector<std::vector<uint32_t>>
read_reference(const std::string& path, size_t records) {
  auto data = slurp(path);
  size_t at = 0;
  std::vector<std::vector<uint32_t>> out(records);
  for (auto& tokens : out) {
    tokens.resize(read_u32(data, at));
    for (auto& t : tokens)
      t = read_u32(data, at);
  }
  if (at != data.size())
    throw std::runtime_error(path + ": not the corpus's record count");
  return out;
}

/// Printable text: control characters and invalid bytes escaped.
inline std::string printable(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += static_cast<char>(c);
  }
  return out;
}

/// Differences of `enc` from the reference over a corpus: their count,
/// and the first one described.
struct comparison {
  size_t records = 0;
  size_t tokens = 0;
  size_t differing_records = 0;
  std::string first;
};

/// Compares `enc.encode` with `expected` record by record.
inline comparison compare(const tokens::encoding& enc,
                          const std::vector<record>& corpus,
                          const std::vector<std::vector<uint32_t>>& expected) {
  comparison out;
  for (size_t i = 0; i < corpus.size(); ++i) {
    auto got = enc.encode(corpus[i].text);
    ++out.records;
    out.tokens += got.size();
    if (got == expected[i])
      continue;
    ++out.differing_records;
    if (!out.first.empty())
      continue;
    size_t k = 0;
    while (k < got.size() && k < expected[i].size() && got[k] == expected[i][k])
      ++k;
    auto from = k > 8 ? k - 8 : 0;
    auto tokens_of = [&](const std::vector<uint32_t>& v) {
      std::ostringstream s;
      for (auto j = from; j < v.size() && j < k + 8; ++j) {
        s << (j == k ? " [" : " ") << v[j];
        try {
          s << ":'" << printable(enc.decode({v[j]})) << "'";
        } catch (const std::out_of_range&) {
          s << ":?";
        }
        if (j == k)
          s << "]";
      }
      return s.str();
    };
    std::vector<uint32_t> same(got.begin(), got.begin() + k);
    auto before = enc.decode(same);
    std::ostringstream s;
    s << enc.name() << ": record " << i << " (" << corpus[i].label
      << ", " << corpus[i].text.size() << " bytes) differs at token " << k
      << " of " << expected[i].size() << " (byte " << before.size()
      << ")\n  text there: '"
      << printable(before.substr(before.size() > 40 ? before.size() - 40 : 0))
      << "' | '" << printable(corpus[i].text.substr(
             std::min(before.size(), corpus[i].text.size()), 60))
      << "'\n  expected:" << tokens_of(expected[i])
      << "\n  got:     " << tokens_of(got) << "\n";
    out.first = s.str();
  }
  return out;
}

} // namespace spindle::golden
