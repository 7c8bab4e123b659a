#pragma once

// spindle's one type-ID block. Every struct that travels in a message is
// listed here (its inspect() lives beside its definition) so the actor
// system can name, print and serialize it. The runtime's config registers
// the block: `cfg.add_message_types<caf::id_block::spindle>()`.
//
// Keep one section per area and append at the end of yours.

#include <caf/type_id.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/ids.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(spindle, caf::first_custom_type_id)

  // -- IDs and counters --------------------------------------------------------
  CAF_ADD_TYPE_ID(spindle, (spindle::id_range))
  CAF_ADD_TYPE_ID(spindle, (spindle::id_stats))

  // -- context items -------------------------------------------------------------

  // -- threads, memory, rewriter, builder ------------------------------------------

  // -- orchestration ------------------------------------------------------------------

CAF_END_TYPE_ID_BLOCK(spindle)
