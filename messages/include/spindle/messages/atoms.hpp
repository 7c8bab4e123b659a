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

// -- threads, memory, rewriter, builder -----------------------------------------

// -- orchestration ----------------------------------------------------------------

// -- storage and server -------------------------------------------------------------
