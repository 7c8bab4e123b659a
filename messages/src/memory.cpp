#include "spindle/messages/memory.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <unordered_set>
#include <utility>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

namespace {

std::string shorten(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 48))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > 48)
    out += "...";
  return out;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'
         || c == '\v';
}

// Common English words that carry no topic; matching on them would rank
// unrelated memories.
constexpr std::array<std::string_view, 96> stop_words{{
  "a",     "about", "after", "again", "all",   "also",  "am",    "an",
  "and",   "any",   "are",   "as",    "at",    "be",    "been",  "before",
  "but",   "by",    "can",   "could", "did",   "do",    "does",  "for",
  "from",  "had",   "has",   "have",  "he",    "her",   "here",  "hers",
  "him",   "his",   "how",   "i",     "if",    "in",    "into",  "is",
  "it",    "its",   "just",  "me",    "more",  "my",    "no",    "not",
  "now",   "of",    "on",    "or",    "our",   "out",   "she",   "so",
  "some",  "than",  "that",  "the",   "their", "them",  "then",  "there",
  "these", "they",  "this",  "those", "to",    "too",   "up",    "us",
  "very",  "was",   "we",    "were",  "what",  "when",  "where", "which",
  "who",   "whom",  "why",   "will",  "with",  "would", "you",   "your",
  "yours", "s",     "t",     "tell",  "please", "let",  "get",   "got",
}};

bool is_stop_word(std::string_view w) {
  // Every stored entry and every retrieval asks, word by word; no stop
  // word is longer than 6 bytes.
  static const std::unordered_set<std::string_view> set{stop_words.begin(),
                                                        stop_words.end()};
  return w.size() <= 6 && set.count(w) > 0;
}

// Collapses every whitespace run to one space and trims both ends. Copies
// the runs between whitespace whole: snippets are built per retrieval.
std::string normalize_space(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i]))
      ++i;
    auto start = i;
    while (i < text.size() && !is_space(text[i]))
      ++i;
    if (i == start)
      break;
    if (!out.empty())
      out += ' ';
    out.append(text.data() + start, i - start);
  }
  return out;
}

// True if `text` is as normalize_space leaves it: no whitespace but single
// spaces between words.
bool is_normalized(std::string_view text) {
  if (!text.empty() && (text.front() == ' ' || text.back() == ' '))
    return false;
  for (size_t i = 0; i < text.size(); ++i)
    if (is_space(text[i])
        && (text[i] != ' ' || (i + 1 < text.size() && text[i + 1] == ' ')))
      return false;
  return true;
}

// The longest prefix of `entry` ending at a sentence end (. ! ?, followed by
// a space or the end) with at most `budget` bytes; 0 if none.
size_t sentence_cut(std::string_view entry, size_t budget) {
  size_t best = 0;
  auto limit = std::min(entry.size(), budget);
  for (size_t i = 0; i < limit; ++i) {
    auto c = entry[i];
    if ((c == '.' || c == '!' || c == '?')
        && (i + 1 == entry.size() || entry[i + 1] == ' '))
      best = i + 1;
  }
  return best;
}

} // namespace

caf::error validate_user_id(std::string_view whole) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_id,
                      "user_id '" + shorten(whole) + "' is invalid: " + why);
  };
  auto id = whole;
  if (auto sep = whole.find(tenant_separator); sep != std::string_view::npos) {
    if (!valid_tenant_id(whole.substr(0, sep)))
      return bad("its tenant must have 1 to 32 characters of a-z 0-9");
    id = whole.substr(sep + 1);
  }
  if (id.empty() || id.size() > 128)
    return bad("it must have 1 to 128 characters");
  if (id == "." || id == "..")
    return bad("'.' and '..' are reserved");
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':'
              || c == '-' || c == '@' || c == '+';
    if (!ok)
      return bad("only A-Z a-z 0-9 . _ : @ + - are allowed");
  }
  return caf::none;
}

caf::error validate_client_user_id(std::string_view id) {
  if (id.find(tenant_separator) != std::string_view::npos)
    return make_error(errc::invalid_id,
                      "user_id '" + shorten(id)
                        + "' is invalid: only A-Z a-z 0-9 . _ : @ + - are "
                          "allowed");
  return validate_user_id(id);
}

std::vector<std::string> memory_tags(const std::string& user_id,
                                     const std::string& thread_id) {
  std::vector<std::string> tags;
  if (!user_id.empty())
    tags.push_back("user:" + user_id);
  if (!thread_id.empty())
    tags.push_back("thread:" + thread_id);
  return tags;
}

caf::expected<memory_scope>
parse_memory_tags(const std::vector<std::string>& tags) {
  memory_scope scope;
  if (tags.empty())
    return make_error(errc::invalid_argument,
                      "tags must hold user:{user_id} and/or "
                      "thread:{thread_id}");
  for (auto& tag : tags) {
    std::string_view t{tag};
    if (t.substr(0, 5) == "user:") {
      if (!scope.user_id.empty())
        return make_error(errc::invalid_argument,
                          "tags hold more than one user: tag");
      auto id = t.substr(5);
      if (auto err = validate_user_id(id))
        return err;
      scope.user_id = std::string{id};
    } else if (t.substr(0, 7) == "thread:") {
      if (!scope.thread_id.empty())
        return make_error(errc::invalid_argument,
                          "tags hold more than one thread: tag");
      auto id = t.substr(7);
      if (auto err = validate_thread_id(id))
        return err;
      scope.thread_id = std::string{id};
    } else {
      return make_error(errc::invalid_argument,
                        "tag '" + shorten(t)
                          + "' is unknown: use user:{user_id} or "
                            "thread:{thread_id}");
    }
  }
  return scope;
}

caf::error validate_memory_query(const memory_query& q) {
  if (!q.user_id.empty())
    if (auto err = validate_user_id(q.user_id))
      return err;
  if (q.thread_id.empty())
    return make_error(errc::invalid_argument,
                      "thread_id is required to retrieve memory");
  if (auto err = validate_thread_id(q.thread_id))
    return err;
  if (q.max_chars > max_memory_snippet)
    return make_error(errc::invalid_argument,
                      "max_chars must be at most "
                        + std::to_string(max_memory_snippet) + ", got "
                        + std::to_string(q.max_chars));
  return caf::none;
}

caf::error validate_memory_list_request(const memory_list_request& r) {
  if (r.user_id.empty() && r.thread_id.empty())
    return make_error(errc::invalid_argument,
                      "user_id or thread_id is required: a user's entries, "
                      "or a thread's entries stored without a user");
  if (!r.user_id.empty() && !r.thread_id.empty())
    return make_error(errc::invalid_argument,
                      "give user_id or thread_id, not both: a user's "
                      "entries are listed from every thread");
  if (!r.user_id.empty())
    if (auto err = validate_user_id(r.user_id))
      return err;
  if (!r.thread_id.empty())
    if (auto err = validate_thread_id(r.thread_id))
      return err;
  if (r.limit < 1 || r.limit > max_memory_listing)
    return make_error(errc::invalid_argument,
                      "limit must be between 1 and "
                        + std::to_string(max_memory_listing));
  if (r.before < 0)
    return make_error(errc::invalid_argument,
                      "cursor must not be negative");
  return caf::none;
}

size_t memory_snippet_builder::room() const noexcept {
  constexpr size_t bullet = 2; // "- "
  auto used = out_.text.size() + (out_.text.empty() ? 0 : 1) + bullet;
  return used >= max_chars_ ? 0 : max_chars_ - used;
}

void memory_snippet_builder::add(std::string_view raw) {
  if (room() == 0)
    return;
  if (is_normalized(raw))
    add_normalized(raw);
  else
    add_normalized(normalize_space(raw));
}

void memory_snippet_builder::add_normalized(std::string_view entry) {
  if (add_normalized(entry, std::hash<std::string_view>{}(entry), 0) > 0)
    out_.ids.pop_back(); // an entry without an ID
}

size_t memory_snippet_builder::add_normalized(std::string_view entry,
                                              size_t hash, int64_t id) {
  auto budget = room();
  if (budget == 0 || entry.empty())
    return 0;
  if (out_.text.empty())
    out_.text.reserve(max_chars_);
  // Equal 64-bit hashes of equal-sized entries count as equal entries.
  std::pair<uint64_t, size_t> key{hash, entry.size()};
  if (std::find(seen_.begin(), seen_.end(), key) != seen_.end())
    return 0;
  seen_.push_back(key);
  size_t take = entry.size() <= budget ? entry.size()
                                       : sentence_cut(entry, budget);
  if (take == 0)
    return 0; // no sentence of this entry fits; a later one may
  if (!out_.text.empty())
    out_.text += '\n';
  out_.text += "- ";
  out_.text.append(entry.data(), take);
  ++out_.entries;
  out_.ids.push_back(id);
  return take;
}

memory_snippet memory_snippet_builder::finish(uint64_t matched) && {
  out_.matched = matched;
  return std::move(out_);
}

memory_snippet build_memory_snippet(const std::vector<std::string>& ranked,
                                    size_t max_chars) {
  memory_snippet_builder builder{max_chars};
  for (auto& entry : ranked) {
    if (builder.room() == 0)
      break; // not even a cut entry fits any more
    builder.add(entry);
  }
  return std::move(builder).finish(ranked.size());
}

std::string memory_normalized(std::string_view entry) {
  return normalize_space(entry);
}

size_t memory_shortest_cut(std::string_view entry) {
  auto text = normalize_space(entry);
  for (size_t i = 0; i < text.size(); ++i) {
    auto c = text[i];
    if ((c == '.' || c == '!' || c == '?')
        && (i + 1 == text.size() || text[i + 1] == ' '))
      return i + 1;
  }
  return text.size();
}

std::vector<std::string> memory_words(std::string_view text) {
  auto in_word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || static_cast<unsigned char>(c) >= 0x80;
  };
  std::vector<std::string> words;
  std::string word;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && !in_word(text[i]))
      ++i;
    auto start = i;
    while (i < text.size() && in_word(text[i]))
      ++i;
    auto size = i - start;
    if (size == 0)
      break;
    if (size > max_memory_word) {
      size = max_memory_word;
      // Never keep half of a UTF-8 sequence: back off its continuation
      // bytes and its lead byte.
      while (size > 0
             && (static_cast<unsigned char>(text[start + size]) & 0xc0)
                  == 0x80)
        --size;
    }
    word.assign(text.data() + start, size);
    for (auto& c : word)
      if (c >= 'A' && c <= 'Z')
        c = static_cast<char>(c - 'A' + 'a');
    if (!word.empty() && !is_stop_word(word))
      words.push_back(word);
  }
  return words;
}

std::vector<std::string> memory_query_terms(std::string_view message) {
  std::vector<std::string> terms;
  for (auto& w : memory_words(message)) {
    if (terms.size() == max_memory_query_terms)
      break;
    // At most 32 terms: a linear search is the cheapest set.
    if (std::find(terms.begin(), terms.end(), w) == terms.end())
      terms.push_back(std::move(w));
  }
  return terms;
}

} // namespace spindle
