#pragma once

#include <caf/atom.hpp>
#include <caf/type_id.hpp>

// Every atom spindle's actors speak. Atom text is at most 10 characters of
// [0-9A-Za-z_] (CAF 0.17.6). Each area keeps its atoms in its own section;
// reuse CAF's predefined atoms (caf::get_atom, caf::put_atom, caf::add_atom,
// caf::delete_atom, caf::ok_atom, caf::reset_atom) where they fit.

// -- IDs and counters ----------------------------------------------------------
CAF_ADD_ATOM(spindle, spindle, next_atom, "next")
CAF_ADD_ATOM(spindle, spindle, advance_atom, "advance")
CAF_ADD_ATOM(spindle, spindle, peek_atom, "peek")
CAF_ADD_ATOM(spindle, spindle, counter_atom, "counter")
CAF_ADD_ATOM(spindle, spindle, load_atom, "load")
CAF_ADD_ATOM(spindle, spindle, store_atom, "store")
CAF_ADD_ATOM(spindle, spindle, stats_atom, "stats")

// -- context items (issue: context manager) -------------------------------------
CAF_ADD_ATOM(spindle, spindle, ctx_items_atom, "ctx_items")
CAF_ADD_ATOM(spindle, spindle, ctx_render_atom, "ctx_render")
CAF_ADD_ATOM(spindle, spindle, ctx_stats_atom, "ctx_stats")
CAF_ADD_ATOM(spindle, spindle, ctx_open_atom, "ctx_open")
CAF_ADD_ATOM(spindle, spindle, ctx_claim_atom, "ctx_claim")
CAF_ADD_ATOM(spindle, spindle, ctx_release_atom, "ctx_free")

// -- threads, memory, rewriter, builder -----------------------------------------
CAF_ADD_ATOM(spindle, spindle, history_atom, "history")
CAF_ADD_ATOM(spindle, spindle, thread_snapshot_atom, "tsnapshot")
CAF_ADD_ATOM(spindle, spindle, thread_list_atom, "tlist")
CAF_ADD_ATOM(spindle, spindle, thread_count_atom, "tcount")
CAF_ADD_ATOM(spindle, spindle, thread_info_atom, "tinfo")
CAF_ADD_ATOM(spindle, spindle, thread_metadata_atom, "tmeta")
CAF_ADD_ATOM(spindle, spindle, exchange_begin_atom, "xbegin")
CAF_ADD_ATOM(spindle, spindle, exchange_end_atom, "xend")
CAF_ADD_ATOM(spindle, spindle, exchange_reply_atom, "xreply")
CAF_ADD_ATOM(spindle, spindle, exchange_admit_atom, "xadmit")
CAF_ADD_ATOM(spindle, spindle, exchange_upstream_atom, "xupstream")
CAF_ADD_ATOM(spindle, spindle, fork_atom, "fork")
CAF_ADD_ATOM(spindle, spindle, build_context_atom, "buildctx")
CAF_ADD_ATOM(spindle, spindle, rewrite_atom, "rewrite")
CAF_ADD_ATOM(spindle, spindle, memory_atom, "memory")
CAF_ADD_ATOM(spindle, spindle, summary_atom, "summary")

// -- orchestration ----------------------------------------------------------------
CAF_ADD_ATOM(spindle, spindle, orchestrate_atom, "orchestr")
CAF_ADD_ATOM(spindle, spindle, claim_atom, "claim")
CAF_ADD_ATOM(spindle, spindle, complete_atom, "complete")
CAF_ADD_ATOM(spindle, spindle, fail_atom, "fail")
CAF_ADD_ATOM(spindle, spindle, requeue_atom, "requeue")
CAF_ADD_ATOM(spindle, spindle, task_atom, "task")
CAF_ADD_ATOM(spindle, spindle, executable_atom, "executable")
CAF_ADD_ATOM(spindle, spindle, attach_atom, "attach")
CAF_ADD_ATOM(spindle, spindle, workers_atom, "workers")
CAF_ADD_ATOM(spindle, spindle, stale_atom, "stale")
CAF_ADD_ATOM(spindle, spindle, heartbeat_atom, "heartbeat")
CAF_ADD_ATOM(spindle, spindle, lease_atom, "lease")
CAF_ADD_ATOM(spindle, spindle, claim_wait_atom, "claimwait")
CAF_ADD_ATOM(spindle, spindle, retry_atom, "retry")
CAF_ADD_ATOM(spindle, spindle, ready_atom, "ready")
CAF_ADD_ATOM(spindle, spindle, unready_atom, "unready")
CAF_ADD_ATOM(spindle, spindle, orch_idle_atom, "orch_idle")
CAF_ADD_ATOM(spindle, spindle, retire_atom, "retire")
CAF_ADD_ATOM(spindle, spindle, retired_atom, "retired")

// -- storage and server -------------------------------------------------------------
CAF_ADD_ATOM(spindle, spindle, flush_atom, "flush")
CAF_ADD_ATOM(spindle, spindle, passivate_atom, "passivate")
CAF_ADD_ATOM(spindle, spindle, tick_atom, "tick")

// -- cluster ----------------------------------------------------------------------
CAF_ADD_ATOM(spindle, spindle, locate_atom, "locate")
