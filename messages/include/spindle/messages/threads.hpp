#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/chat.hpp"

// Conversation threads: turns, history windows (D6), snapshots, the
// per-thread exchange lease (D9) and the registry that maps thread IDs to
// thread actors. Everything here is a value type or a pure function; the
// actors live in actors/thread.* and actors/thread_registry.*.

namespace spindle {

// -- turns --------------------------------------------------------------------

/// Who spoke a turn.
enum class turn_role : uint8_t { system, user, assistant, tool };

/// The OpenAI role name: "system", "user", "assistant", "tool".
/// This function is thread-safe.
const char* to_string(turn_role x) noexcept;

/// Parses a role name produced by `to_string(turn_role)`.
/// Errors: `invalid_argument` naming the field `role` and the value.
/// This function is thread-safe.
caf::expected<turn_role> parse_turn_role(std::string_view name);

/// Where an exchange's token usage came from (docs/usage.md): the
/// upstream's own figures, or counted by spindle with its tokenizer.
/// Never renumbered: a store keeps them.
enum class usage_source : uint8_t { none = 0, counted = 1, upstream = 2 };

/// "counted", "upstream" or "none". This function is thread-safe.
const char* to_string(usage_source x) noexcept;

/// What an exchange spent, kept with its assistant turn: the tokens of
/// its prompt and of its reply, and where the figures came from.
struct turn_usage {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  usage_source source = usage_source::none;
  /// The user the exchange acted for (qualified; empty for none): the
  /// usage counters' user. Not stored with the turn.
  std::string user_id;

  uint64_t total_tokens() const noexcept {
    return uint64_t{prompt_tokens} + completion_tokens;
  }
  bool known() const noexcept {
    return source != usage_source::none;
  }
  /// The figures and their source (`user_id` is not kept with a turn).
  friend bool operator==(const turn_usage& x, const turn_usage& y) {
    return x.prompt_tokens == y.prompt_tokens
           && x.completion_tokens == y.completion_tokens
           && x.source == y.source;
  }
  friend bool operator!=(const turn_usage& x, const turn_usage& y) {
    return !(x == y);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, turn_usage& x) {
  return f(caf::meta::type_name("turn_usage"), x.prompt_tokens,
           x.completion_tokens, x.source, x.user_id);
}

/// One turn of a conversation. A thread stores turns in the order they were
/// appended; it never sorts them (timestamps are informative only).
struct turn {
  turn_role role = turn_role::user;
  std::string content;
  /// Milliseconds since the Unix epoch. 0 on `add_turn` means "now": the
  /// thread stamps the turn with its clock when it appends it.
  int64_t timestamp_ms = 0;
  /// For tool turns: the ID of the tool call this result answers. Empty for
  /// every other role.
  std::string tool_call_id;
  /// True for an assistant turn whose generation stopped because the client
  /// went away: `content` holds what was generated until then.
  bool interrupted = false;
  /// For assistant turns: the tool calls the turn makes, in order. Empty
  /// for every other role.
  std::vector<tool_call> tool_calls;
  /// The turn's prompt tokens (messages/tokens.hpp), counted once by its
  /// thread when it is stored and kept with it; 0 with `token_encoding`
  /// 0 (`token_encoding_id::none`) when not counted yet. Derived from the
  /// fields above: left out of `==`.
  uint32_t tokens = 0;
  /// The `token_encoding_id` that `tokens` was counted with.
  uint8_t token_encoding = 0;
  /// For an assistant turn an exchange stored: what the exchange spent
  /// (source `none` for every other turn).
  turn_usage usage;

  friend bool operator==(const turn& x, const turn& y) {
    return x.role == y.role && x.content == y.content
           && x.timestamp_ms == y.timestamp_ms
           && x.tool_call_id == y.tool_call_id
           && x.interrupted == y.interrupted && x.tool_calls == y.tool_calls
           && x.usage == y.usage;
  }
  friend bool operator!=(const turn& x, const turn& y) {
    return !(x == y);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, turn& x) {
  return f(caf::meta::type_name("turn"), x.role, x.content, x.timestamp_ms,
           x.tool_call_id, x.interrupted, x.tool_calls, x.tokens,
           x.token_encoding, x.usage);
}

/// The largest turn content a thread accepts (1 MiB).
inline constexpr size_t max_turn_content = 1u << 20;

/// The longest tool call ID a thread accepts, in bytes (of UTF-8).
inline constexpr size_t max_tool_call_id = 256;

/// The most tool calls one assistant turn makes.
inline constexpr size_t max_tool_calls = 128;

/// The longest tool (function) name: OpenAI's limit.
inline constexpr size_t max_tool_name = 64;

/// Checks a turn before it is appended: a known role; content at most
/// `max_turn_content` bytes and non-empty for system and user turns; a
/// tool turn names its `tool_call_id` (1 to 256 bytes), other roles
/// leave it empty; only assistant turns may be `interrupted` or make
/// `tool_calls`: at most `max_tool_calls`, each with an ID of 1 to 256
/// characters unique in the turn, a name of 1 to 64 characters of
/// `[A-Za-z0-9_-]`, and arguments that, with the content, fit in
/// `max_turn_content` bytes.
/// Errors: `invalid_argument` or `too_large`, naming the field.
/// This function is thread-safe.
caf::error validate_turn(const turn& x);

/// Checks an assistant turn's tool calls (the rules of `validate_turn`);
/// `content_bytes`: the size of the turn's content, which the arguments
/// share `max_turn_content` with.
/// Errors: `invalid_argument` or `too_large`, naming the field.
caf::error validate_tool_calls(const std::vector<tool_call>& calls,
                               size_t content_bytes);

/// The most turns one batch appends (`POST /v1/threads/{id}/turns`).
inline constexpr size_t max_turn_batch = 1000;

/// The tool calls a thread has made and those its tool turns answered: what
/// a batch of appended turns is checked against.
struct tool_call_ledger {
  std::unordered_set<std::string> made;
  std::unordered_set<std::string> answered;

  /// Notes the calls `t` makes, or the call it answers.
  void add(const turn& t);
};

/// Checks turns to append after those noted in `ledger`, as one batch:
/// 1 to `max_turn_batch` turns, each valid (`validate_turn`); a call ID is
/// made once in the thread; a tool turn answers a call the thread (or an
/// earlier turn of the batch) made and no turn has answered yet.
/// Errors: `invalid_argument` or `too_large`, naming `turns[i]`.
/// This function is thread-safe.
caf::error validate_turn_batch(tool_call_ledger ledger,
                               const std::vector<turn>& batch);

/// What a batch decides alone, without its thread: 1 to `max_turn_batch`
/// turns, each valid (`validate_turn`). Errors as `validate_turn_batch`.
/// This function is thread-safe.
caf::error validate_turns_alone(const std::vector<turn>& batch);

/// Builds a user turn (timestamp 0: stamped on append).
turn make_user_turn(std::string content);
/// Builds an assistant turn (timestamp 0: stamped on append).
turn make_assistant_turn(std::string content, bool interrupted = false);
/// Builds a system turn (timestamp 0: stamped on append).
turn make_system_turn(std::string content);
/// Builds a tool turn answering `tool_call_id`.
turn make_tool_turn(std::string content, std::string tool_call_id);

/// The chat message of a turn (role name, content, tool call ID).
chat_message to_chat_message(const turn& x);

// -- history windows (D6) -----------------------------------------------------

/// The store's default window: `history(thread)` without `max_turns`.
inline constexpr uint64_t store_default_max_turns = 20;
/// The context builder's default window.
inline constexpr uint64_t builder_default_max_turns = 12;
/// The smallest window anyone may ask for (one user + assistant pair).
inline constexpr uint64_t min_max_turns = 2;

/// Errors: `invalid_argument` naming `max_turns` when it is below 2.
/// This function is thread-safe.
caf::error validate_max_turns(uint64_t max_turns);

/// The index of the first turn of the history window of `turns` (D6): the
/// longest suffix of at most `max_turns` turns that does not start with an
/// orphan, i.e. an assistant or tool turn whose preceding turns were cut
/// off (which also keeps every tool result with the call before it). When
/// the whole history fits, nothing is cut and nothing is an orphan. When
/// every candidate start is an orphan, the plain suffix of `max_turns`
/// turns is returned. Inspects at most `max_turns` turns: O(window), never
/// O(history). Precondition: `max_turns >= 2`. This function is
/// thread-safe.
size_t history_window_start(const std::vector<turn>& turns, size_t max_turns);

/// `history_window_start` over the first `n` turns of any container with
/// `turns[i].role`. This function is thread-safe.
template <class Turns>
size_t history_window_start_in(const Turns& turns, size_t n,
                               size_t max_turns) {
  if (n <= max_turns)
    return 0; // nothing cut off, so nothing is an orphan
  auto plain = n - max_turns;
  // An assistant or tool turn at the start lost what it answers; a tool
  // result also lost its call. Skip forward to the first turn that stands
  // on its own (user or system).
  for (auto i = plain; i < n; ++i) {
    auto role = turns[i].role;
    if (role != turn_role::assistant && role != turn_role::tool)
      return i;
  }
  return plain;
}

// -- summaries (compaction) ------------------------------------------------------

/// What a thread's turns before its prompts' window said: folded by
/// compaction into one text (docs/threads.md, "Compaction"). Covers turns
/// [0, upto); `upto` 0 is no summary.
struct thread_summary {
  std::string content;
  uint64_t upto = 0;
  /// The tokens of the summary's system message content
  /// (`summary_message_prefix` + content) in the encoding numbered
  /// `token_encoding` (0: not counted).
  uint32_t tokens = 0;
  uint8_t token_encoding = 0;
  /// When it was made, ms since the epoch.
  int64_t updated_ms = 0;

  friend bool operator==(const thread_summary& x, const thread_summary& y) {
    return x.content == y.content && x.upto == y.upto
           && x.tokens == y.tokens && x.token_encoding == y.token_encoding
           && x.updated_ms == y.updated_ms;
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, thread_summary& x) {
  return f(caf::meta::type_name("thread_summary"), x.content, x.upto,
           x.tokens, x.token_encoding, x.updated_ms);
}

/// The largest summary a thread keeps (16 KiB).
inline constexpr size_t max_summary_content = 16u << 10;

/// The start of the system message a prompt gives a summary.
inline constexpr std::string_view summary_message_prefix
  = "Summary of the earlier conversation:\n";

/// A history window as read from a thread.
struct history_window {
  /// The window, oldest first.
  std::vector<turn> turns;
  /// How many turns the thread held when the window was read.
  uint64_t total_turns = 0;
  /// How many times the thread has been cleared; a turn count may only go
  /// down when this goes up.
  uint64_t epoch = 0;
  /// False when read through the registry for a thread that does not exist.
  bool found = false;
  /// The thread actor's ID (0 if not found), for logs.
  uint64_t thread_actor_id = 0;
  /// The thread's summary when read (`upto` 0: none).
  thread_summary summary;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, history_window& x) {
  return f(caf::meta::type_name("history_window"), x.turns, x.total_turns,
           x.epoch, x.found, x.thread_actor_id, x.summary);
}

/// An immutable copy of a whole thread: the reader owns it, so nothing a
/// reader does with it can change the thread.
struct thread_snapshot {
  std::string thread_id;
  /// Every turn, oldest first.
  std::vector<turn> turns;
  /// How many times the thread has been cleared.
  uint64_t epoch = 0;
  /// The turns of completed exchanges: `turns.size()` when no exchange
  /// holds the thread, else the count when the running exchange began. A
  /// fork copies this prefix.
  uint64_t committed = 0;
  /// True while an exchange holds the thread (D9).
  bool in_exchange = false;
  /// Writes and exchanges waiting for the running exchange to end.
  uint64_t queued = 0;
  /// The thread's summary (`upto` 0: none).
  thread_summary summary;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, thread_snapshot& x) {
  return f(caf::meta::type_name("thread_snapshot"), x.thread_id, x.turns,
           x.epoch, x.committed, x.in_exchange, x.queued, x.summary);
}

// -- exchanges (D9) -----------------------------------------------------------

/// What a message does when another exchange holds its thread.
enum class conflict_policy : uint8_t {
  /// Wait until the running exchange stored its assistant turn (default).
  queue,
  /// Fail at once with `errc::conflict`.
  exit,
  /// Continue in a new thread that starts as a copy of this one.
  fork,
};

/// "queue", "exit" or "fork". This function is thread-safe.
const char* to_string(conflict_policy x) noexcept;

/// Parses a policy name. Errors: `invalid_argument` naming `on_conflict`.
/// This function is thread-safe.
caf::expected<conflict_policy> parse_conflict_policy(std::string_view name);

// -- threads as resources: metadata, listing ------------------------------------

/// A thread's metadata: string keys and values (docs/threads.md, "Threads
/// as resources").
using thread_metadata = std::map<std::string, std::string>;

/// Metadata limits: at most 16 keys, each 1 to 64 characters of
/// [A-Za-z0-9_.:-], each value at most 512 bytes.
inline constexpr size_t max_metadata_keys = 16;
inline constexpr size_t max_metadata_key = 64;
inline constexpr size_t max_metadata_value = 512;

/// A change of metadata: `set` adds or replaces keys, `remove` drops keys
/// (absent keys are ignored), as a JSON merge patch does.
struct thread_metadata_patch {
  thread_metadata set;
  std::vector<std::string> remove;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f,
                                        thread_metadata_patch& x) {
  return f(caf::meta::type_name("thread_metadata_patch"), x.set, x.remove);
}

/// Errors: `invalid_argument` naming the key for a key outside the limits
/// (`what` names the field, e.g. "metadata"). This function is thread-safe.
caf::error validate_metadata_key(const std::string& key,
                                 const std::string& what = "metadata");

/// Checks every key and value of `patch`. Errors: `invalid_argument`,
/// `too_large`. This function is thread-safe.
caf::error validate_metadata_patch(const thread_metadata_patch& patch);

/// `current` with `patch` applied. Errors: `too_large` when it would hold
/// more than `max_metadata_keys` keys. This function is thread-safe.
caf::expected<thread_metadata> apply_metadata_patch(
  thread_metadata current, const thread_metadata_patch& patch);

/// Metadata as a JSON object text, and back (an empty map for anything
/// that is not an object of strings). This function is thread-safe.
std::string metadata_to_json(const thread_metadata& x);
thread_metadata metadata_from_json(const std::string& text);

/// A thread as a resource: what `GET /v1/threads/{id}` shows.
struct thread_info {
  std::string thread_id;
  int64_t created_ms = 0;
  /// The thread's last change (a turn, a clear, its metadata) as its
  /// version: strictly increasing across every thread of the store,
  /// microseconds since the Unix epoch or a little above them.
  uint64_t version = 0;
  uint64_t turns = 0;
  thread_metadata metadata;

  int64_t updated_ms() const noexcept {
    return static_cast<int64_t>(version / 1000);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, thread_info& x) {
  return f(caf::meta::type_name("thread_info"), x.thread_id, x.created_ms,
           x.version, x.turns, x.metadata);
}

/// One page of a walk over every thread, newest change first. A walk sees
/// the threads as they were when its first page was read (`snapshot`):
/// each thread that existed then and still exists is listed exactly once,
/// at the place its last change before the snapshot gives it, however the
/// threads change meanwhile; threads created later are not listed.
struct thread_list_request {
  /// Threads per page, 1 to 1000.
  uint64_t limit = 20;
  /// 0: a new walk (the store takes its snapshot now); else the walk's.
  uint64_t snapshot = 0;
  /// Where the previous page ended (0: at the start).
  uint64_t after_version = 0;
  std::string after_id;
  /// Only threads whose metadata holds every one of these pairs.
  thread_metadata filters;
  /// Only threads changed after this time (milliseconds; 0: all).
  int64_t updated_after_ms = 0;
  /// When set, only the threads of one tenant: those qualified by
  /// `tenant_prefix` (`TENANT~`), or the unqualified ones (the default
  /// tenant's) when it is empty (ids.hpp, `tenant_separator`).
  bool scoped = false;
  std::string tenant_prefix;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f,
                                        thread_list_request& x) {
  return f(caf::meta::type_name("thread_list_request"), x.limit, x.snapshot,
           x.after_version, x.after_id, x.filters, x.updated_after_ms,
           x.scoped, x.tenant_prefix);
}

/// A page: its threads (current turn counts and metadata), the walk's
/// snapshot, the place of the last thread in the walk (its version as of
/// the snapshot) and whether more follow.
struct thread_page {
  std::vector<thread_info> threads;
  uint64_t snapshot = 0;
  uint64_t last_version = 0;
  bool more = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, thread_page& x) {
  return f(caf::meta::type_name("thread_page"), x.threads, x.snapshot,
           x.last_version, x.more);
}

/// The most threads one page holds.
inline constexpr uint64_t max_thread_page = 1000;

/// Errors: `invalid_argument` for a limit outside 1..1000, a cursor whose
/// place lies after its snapshot, more than 16 filters or a bad filter
/// key. This function is thread-safe.
caf::error validate_thread_list_request(const thread_list_request& x);

// -- thread actors ------------------------------------------------------------

/// One conversation: owns its turns, append-only between explicit clears.
///
/// - `(add, turn)` appends exactly one turn and replies with the new turn
///   count. While an exchange holds the thread it waits (in arrival order)
///   until the exchange ends, so it never lands inside an exchange.
/// - `(add, turn, lease)` appends for the exchange holding `lease`.
///   Errors: `conflict` if `lease` does not hold the thread.
/// - `(add, turns)` appends a batch in one write, all or nothing, and
///   replies with the new turn count; waits like `add`. The batch is
///   checked against the thread's turns (`validate_turn_batch`: tool calls
///   unique, tool turns answering open calls). Errors: `invalid_argument`,
///   `too_large` naming `turns[i]` (nothing is stored).
/// - `(get, history, max_turns)` replies with the D6 window. Never
///   mutates. Errors: `invalid_argument` for `max_turns < 2`.
/// - `(get, tsnapshot)` replies with a copy of every turn.
/// - `(reset)` clears every turn (the only way turns disappear) and replies
///   with how many were removed; waits for a running exchange like `add`.
/// - `(xbegin, policy)` starts an exchange and replies with its lease. If
///   another exchange holds the thread: `queue` waits in arrival order,
///   `exit` and `fork` fail at once with `conflict` (a fork is made by the
///   registry). A lease whose holder terminates is released.
/// - `(xend, lease)` ends the exchange and replies with the turn count.
/// - `(tmeta, patch)` applies a metadata patch and replies with the
///   thread's metadata. Errors: `too_large` past the key limit.
/// - `(delete)` removes the thread for good (turns, metadata, context
///   window rows) and replies with the turns it held; the actor then
///   stops. A running exchange is waited for (cancel it first); writes and
///   exchanges waiting behind it fail with `not_found`.
/// - `(summary, s, epoch)` keeps `s` as the thread's summary once it is
///   stored, and replies with `s.upto`; it does not wait for a running
///   exchange (turns are not touched). Errors: `conflict` when the thread
///   was cleared since `epoch` or the summary is not newer than the one it
///   has (`s.upto` not above it), `invalid_argument` for an `upto` past
///   the thread's turns, `too_large` past `max_summary_content`.
using thread_actor = caf::typed_actor<
  caf::replies_to<caf::add_atom, turn>::with<uint64_t>,
  caf::replies_to<caf::add_atom, std::vector<turn>>::with<uint64_t>,
  caf::replies_to<caf::add_atom, turn, uint64_t>::with<uint64_t>,
  caf::replies_to<caf::get_atom, history_atom, uint64_t>::with<history_window>,
  caf::replies_to<caf::get_atom, thread_snapshot_atom>::with<thread_snapshot>,
  caf::replies_to<caf::reset_atom>::with<uint64_t>,
  caf::replies_to<exchange_begin_atom, conflict_policy>::with<uint64_t>,
  caf::replies_to<exchange_end_atom, uint64_t>::with<uint64_t>,
  caf::replies_to<thread_metadata_atom, thread_metadata_patch>::with<
    thread_metadata>,
  caf::replies_to<caf::delete_atom>::with<uint64_t>,
  caf::replies_to<summary_atom, thread_summary, uint64_t>::with<uint64_t>,
  caf::replies_to<passivate_atom>::with<bool>>;

/// A registry lookup: the thread and how it was obtained.
struct thread_ref {
  std::string thread_id;
  /// Invalid when the thread was not found (and nothing was created).
  thread_actor handle;
  /// The thread existed before this request.
  bool found = false;
  /// This request created the thread (get_or_create, fork).
  bool created = false;
  /// For a fork: the thread it was copied from.
  std::string forked_from;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, thread_ref& x) {
  return f(caf::meta::type_name("thread_ref"), x.thread_id, x.handle, x.found,
           x.created, x.forked_from);
}

/// Where a thread is served (docs/cluster.md, "Forwarding"): here, or by
/// the node `node` at `url`.
struct thread_location {
  bool local = true;
  std::string node;
  std::string url;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, thread_location& x) {
  return f(caf::meta::type_name("thread_location"), x.local, x.node, x.url);
}

/// What the thread registry holds in memory, and what it did.
struct thread_registry_stats {
  /// Thread actors alive now.
  uint64_t resident = 0;
  /// Threads loaded from the store (activations) and stopped because they
  /// were idle or over the resident cap (passivations), since start.
  uint64_t activations = 0;
  uint64_t passivations = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f,
                                        thread_registry_stats& x) {
  return f(caf::meta::type_name("thread_registry_stats"), x.resident,
           x.activations, x.passivations);
}

/// The one map from thread ID to thread actor. Thread actors are created
/// only here and only by the write paths.
///
/// - `(get, thread_id)`: the read path. Replies with the thread if it
///   exists; never creates (`found == false`, invalid handle otherwise).
/// - `(put, thread_id)`: get_or_create, for write paths only. "new"
///   creates a thread with a fresh UUIDv4 ID.
/// - `(fork, thread_id)`: creates a thread with a fresh UUIDv4 ID whose
///   turns are a copy of the source's committed turns.
///   Errors: `not_found` for an unknown source.
/// - `(fork, thread_id, at_turn)`: a copy (POST .../copy): like a fork,
///   with the first `at_turn` committed turns (all of them with
///   `UINT64_MAX`) and the source's metadata. Errors: `not_found`,
///   `invalid_argument` for an `at_turn` past the committed turns.
/// - `(get, tlist)`: every thread ID, sorted.
/// - `(get, tcount)`: how many threads exist.
/// - `(add, thread_id, turn)`: get_or_create, then the thread's `add`
///   (one round trip for callers that do not keep the thread's handle).
/// - `(add, thread_id, turns)`: the existing thread's batch `add`
///   (nothing is created). Errors: `not_found`.
/// - `(get, history, thread_id, max_turns)`: the thread's `history`; an
///   empty window for an unknown thread (nothing is created).
/// - `(get, tsnapshot, thread_id)`, `(reset, thread_id)`: the thread's
///   `snapshot` and `reset`. Errors: `not_found` (nothing is created).
/// - `(tinfo, thread_id)`: the thread as a resource (`thread_info`).
///   Errors: `not_found`.
/// - `(tlist, request)`: one page of a walk over every thread
///   (`thread_list_request`). Errors: `invalid_argument`.
/// - `(put, "new", metadata)`: creates a thread with a fresh ID holding
///   `metadata`, in one write.
/// - `(tmeta, thread_id, patch)`: the thread's `tmeta`. Errors:
///   `not_found`, `invalid_argument`, `too_large`.
/// - `(delete, thread_id)`: the thread's `delete`; requests for the ID
///   arriving meanwhile wait, then find no thread (or create a new, empty
///   one). Errors: `not_found`.
/// - `(stats)`: resident threads and what activation did
///   (`thread_registry_stats`).
/// - `(locate, thread_id)`: in a cluster, where the thread is served: here
///   (it is resident, or this node just took its lease; an ID that is
///   not valid or names no thread is "here" too, for the route to refuse)
///   or by the node whose lease runs (`thread_location`). Outside a
///   cluster always here.
/// - `(tick)`: housekeeping (idle passivation; in a cluster, dropping every
///   thread once the node's own lease does not run); sent by the registry
///   itself.
/// Every ID is validated (D10); errors: `invalid_id`; in a cluster
/// `not_owner` when this node cannot serve the thread now.
using thread_registry_actor = caf::typed_actor<
  caf::replies_to<caf::get_atom, std::string>::with<thread_ref>,
  caf::replies_to<caf::put_atom, std::string>::with<thread_ref>,
  caf::replies_to<fork_atom, std::string>::with<thread_ref>,
  caf::replies_to<fork_atom, std::string, uint64_t>::with<thread_ref>,
  caf::replies_to<caf::add_atom, std::string, turn>::with<uint64_t>,
  caf::replies_to<caf::add_atom, std::string, std::vector<turn>>::with<
    uint64_t>,
  caf::replies_to<caf::get_atom, history_atom, std::string, uint64_t>::with<
    history_window>,
  caf::replies_to<caf::get_atom, thread_snapshot_atom, std::string>::with<
    thread_snapshot>,
  caf::replies_to<caf::reset_atom, std::string>::with<uint64_t>,
  caf::replies_to<caf::get_atom, thread_list_atom>::with<
    std::vector<std::string>>,
  caf::replies_to<caf::get_atom, thread_count_atom>::with<uint64_t>,
  caf::replies_to<thread_info_atom, std::string>::with<thread_info>,
  caf::replies_to<thread_list_atom, thread_list_request>::with<thread_page>,
  caf::replies_to<caf::put_atom, std::string, thread_metadata>::with<
    thread_ref>,
  caf::replies_to<thread_metadata_atom, std::string,
                  thread_metadata_patch>::with<thread_metadata>,
  caf::replies_to<caf::delete_atom, std::string>::with<uint64_t>,
  caf::replies_to<summary_atom, std::string, thread_summary,
                  uint64_t>::with<uint64_t>,
  caf::replies_to<stats_atom>::with<thread_registry_stats>,
  caf::replies_to<locate_atom, std::string>::with<thread_location>,
  caf::reacts_to<tick_atom>>;

/// A fresh random UUIDv4 in canonical lowercase form. Thread-safe.
std::string make_uuid_v4();

} // namespace spindle
