#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"

// Long-term memory (D8): entries stored with container tags `user:{id}` and
// `thread:{id}`, retrieved by relevance within the requester's scope, and
// condensed into a snippet of at most 2000 characters. The actor lives in
// runtime/ (it blocks on SQLite); the rules are pure functions here.

namespace spindle {

/// The largest snippet a retrieval may ask for (D8).
inline constexpr size_t max_memory_snippet = 2000;

/// The largest memory entry `store` accepts (64 KiB).
inline constexpr size_t max_memory_content = 64u * 1024u;

/// Validates a user ID: 1 to 128 characters of [A-Za-z0-9._:@+-], never
/// "." or "..", optionally qualified by a tenant (`TENANT~ID`, ids.hpp).
/// Errors: `invalid_id` naming `user_id`. Thread-safe.
caf::error validate_user_id(std::string_view id);

/// Validates a user ID as a client sends it: without a tenant. Thread-safe.
caf::error validate_client_user_id(std::string_view id);

/// Where a memory entry belongs: at least one of the two is non-empty.
struct memory_scope {
  std::string user_id;
  std::string thread_id;
};

/// The container tags of a scope, in the one form both storage and
/// retrieval use: `user:{user_id}` (if any), then `thread:{thread_id}` (if
/// any). This function is thread-safe.
std::vector<std::string> memory_tags(const std::string& user_id,
                                     const std::string& thread_id);

/// Parses container tags: each is `user:{id}` or `thread:{id}`, each kind
/// at most once, at least one tag. Errors: `invalid_argument` naming the
/// tag, `invalid_id` for a malformed ID. This function is thread-safe.
caf::expected<memory_scope>
parse_memory_tags(const std::vector<std::string>& tags);

/// A retrieval: the requester (user and thread), the current message to
/// rank by, and the snippet budget.
struct memory_query {
  /// Empty for an anonymous request: it sees only memories stored without
  /// a user in its own thread.
  std::string user_id;
  std::string thread_id;
  std::string query;
  uint64_t max_chars = max_memory_snippet;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_query& x) {
  return f(caf::meta::type_name("memory_query"), x.user_id, x.thread_id,
           x.query, x.max_chars);
}

/// Errors: `invalid_id` for a bad user or thread ID, `invalid_argument` if
/// the thread ID is missing or `max_chars` exceeds 2000. Thread-safe.
caf::error validate_memory_query(const memory_query& q);

/// A retrieved snippet: bullet lines, best-ranked first.
struct memory_snippet {
  std::string text;
  /// Entries (whole or cut at a sentence end) in `text`.
  uint64_t entries = 0;
  /// Entries that matched the query within the requester's scope.
  uint64_t matched = 0;
  /// The IDs of the entries in `text`, in its order, when the reader knows
  /// them (a retrieval does; `build_memory_snippet` does not).
  std::vector<int64_t> ids;
  /// The tokens of `text` in the encoding numbered `token_encoding`
  /// (messages/tokens.hpp), when the reader counts them (0: not counted).
  uint64_t tokens = 0;
  uint8_t token_encoding = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_snippet& x) {
  return f(caf::meta::type_name("memory_snippet"), x.text, x.entries,
           x.matched, x.ids, x.tokens, x.token_encoding);
}

/// Builds a snippet one entry at a time, best-ranked first, by the rules
/// of `build_memory_snippet`, so a caller can stop reading entries once
/// none can be added. Not thread-safe: one owner.
class memory_snippet_builder {
public:
  explicit memory_snippet_builder(size_t max_chars) : max_chars_(max_chars) {
  }

  /// The most bytes the next entry may take (after its bullet); 0 once the
  /// snippet is full. An entry whose `memory_shortest_cut` exceeds it
  /// cannot be added.
  size_t room() const noexcept;

  /// Adds an entry: whole, cut after its last sentence end that fits, or
  /// not at all (empty, a duplicate, or no sentence fits).
  void add(std::string_view entry);

  /// As `add`, for an entry as `memory_normalized` returns it.
  void add_normalized(std::string_view entry);

  /// As `add_normalized`, with the entry's `std::hash<std::string_view>`
  /// (for callers that keep it with the entry) and its ID, listed in the
  /// snippet's `ids` when the entry is added. The bytes of the entry added
  /// (all of it, a cut, or 0: not added).
  size_t add_normalized(std::string_view entry, size_t hash, int64_t id);

  /// The snippet, with `matched` as its count of matching entries.
  memory_snippet finish(uint64_t matched) &&;

private:
  size_t max_chars_;
  memory_snippet out_;
  /// Hash and size of each entry tried, to drop duplicates.
  std::vector<std::pair<uint64_t, size_t>> seen_;
};

/// Builds a snippet from entries ranked best first: whitespace runs become
/// one space, duplicates are dropped, each entry becomes a line "- ...".
/// An entry that does not fit whole is cut after its last sentence end
/// (. ! or ? followed by a space) that fits; an entry with no such cut is
/// skipped and later (shorter) entries are still tried. The result never
/// exceeds `max_chars` bytes (so never more characters either).
/// This function is thread-safe.
memory_snippet build_memory_snippet(const std::vector<std::string>& ranked,
                                    size_t max_chars);

/// `entry` as a snippet shows it: every whitespace run one space, both
/// ends trimmed. This function is thread-safe.
std::string memory_normalized(std::string_view entry);

/// The fewest bytes of `entry` a snippet can show, whitespace normalised:
/// up to its first sentence end, or the whole entry if it has none; 0 for
/// an entry of whitespace only. This function is thread-safe.
size_t memory_shortest_cut(std::string_view entry);

/// The longest word the memory indexes; longer words are cut to it.
inline constexpr size_t max_memory_word = 64;

/// The most terms a retrieval looks up.
inline constexpr size_t max_memory_query_terms = 32;

/// The words long-term memory indexes an entry by and looks a message up
/// with: runs of ASCII letters and digits (lowercased) and of non-ASCII
/// bytes, minus ~90 common English stop words, each cut to at most
/// `max_memory_word` bytes (at a UTF-8 boundary); in text order, repeats
/// kept. This function is thread-safe.
std::vector<std::string> memory_words(std::string_view text);

/// The terms a retrieval looks up for `message`: its `memory_words`,
/// deduplicated, at most `max_memory_query_terms` (the first ones). Empty
/// when no word is left: such a message retrieves nothing.
/// This function is thread-safe.
std::vector<std::string> memory_query_terms(std::string_view message);

/// One stored entry, as a listing shows it.
struct memory_record {
  int64_t id = 0;
  std::string user_id;
  std::string thread_id;
  std::string content;
  /// Milliseconds since the Unix epoch.
  int64_t created_ms = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_record& x) {
  return f(caf::meta::type_name("memory_record"), x.id, x.user_id,
           x.thread_id, x.content, x.created_ms);
}

/// A page of a scope's entries, newest first: a user's (every thread), or
/// the anonymous entries of one thread (`user_id` empty).
struct memory_list_request {
  std::string user_id;
  std::string thread_id;
  /// At most this many (1 to 1000).
  uint64_t limit = 100;
  /// Only entries with an ID below this one; 0: from the newest.
  int64_t before = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f,
                                        memory_list_request& x) {
  return f(caf::meta::type_name("memory_list_request"), x.user_id,
           x.thread_id, x.limit, x.before);
}

/// The most entries one listing returns.
inline constexpr uint64_t max_memory_listing = 1000;

/// Errors: `invalid_id` for a bad user or thread ID, `invalid_argument`
/// for neither (or, for a user's listing, a thread too), a limit outside
/// 1 to 1000 or a negative `before`. Thread-safe.
caf::error validate_memory_list_request(const memory_list_request& r);

struct memory_listing {
  std::vector<memory_record> entries;
  /// `before` for the next page; 0 when this page is the last.
  int64_t next_before = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_listing& x) {
  return f(caf::meta::type_name("memory_listing"), x.entries, x.next_before);
}

/// The long-term memory.
///
/// - `(put, memory, content, tags)` stores an entry and replies with its
///   ID. Errors: `invalid_argument` (empty content or bad tags),
///   `invalid_id`, `too_large`, `storage_failure`.
/// - `(get, memory, query)` replies with the snippet for the requester's
///   scope (D8): a request with user U sees only entries tagged `user:U`
///   (from any of U's threads); a request without user sees only entries
///   of its own thread stored without user. Errors as
///   `validate_memory_query`, `storage_failure`.
/// - `(get, memory, list_request)` replies with a page of a scope's
///   entries, newest first. Errors as `validate_memory_list_request`.
/// - `(delete, memory, user_id, thread_id)` deletes every entry of a
///   scope (a user's, or a thread's anonymous ones when `user_id` is
///   empty) and replies with how many went.
/// - `(delete, memory, id, tenant)` deletes one entry of `tenant` ("*":
///   of any tenant; "": of the default tenant, whose IDs are unqualified;
///   else a tenant's ID prefix, "TENANT~"); replies 1, or 0 when there is
///   none with that ID (of that tenant).
/// - `(delete, memory, prefix, dry_run)` deletes every entry of the tenant
///   whose IDs start with `prefix` ("TENANT~") and replies with how many
///   went; with `dry_run` it deletes nothing and replies with how many
///   scopes hold its entries. Reads every entry: for deleting a tenant.
/// Deletions are committed before the reply, after every store sent
/// before them; a retrieval sent after the reply never shows what went.
using memory_actor = caf::typed_actor<
  caf::replies_to<caf::put_atom, memory_atom, std::string,
                  std::vector<std::string>>::with<int64_t>,
  caf::replies_to<caf::get_atom, memory_atom, memory_query>::with<
    memory_snippet>,
  caf::replies_to<caf::get_atom, memory_atom, memory_list_request>::with<
    memory_listing>,
  caf::replies_to<caf::delete_atom, memory_atom, std::string,
                  std::string>::with<uint64_t>,
  caf::replies_to<caf::delete_atom, memory_atom, int64_t,
                  std::string>::with<uint64_t>,
  caf::replies_to<caf::delete_atom, memory_atom, std::string,
                  bool>::with<uint64_t>>;

/// A retrieval answered on the caller's own thread, without a message and
/// without waiting: from what a memory reader already keeps, when it keeps
/// all the retrieval needs and is free (docs/memory.md, "Retrieval on the
/// caller's thread"). None: ask the memory actor. Thread-safe; never
/// blocks.
using kept_memory_retrieval = std::function<
  std::optional<caf::expected<memory_snippet>>(const memory_query&)>;

} // namespace spindle
