#pragma once

// spindle's one type-ID block. Every struct that travels in a message is
// listed here (its inspect() lives beside its definition) so the actor
// system can name, print and serialize it. The runtime's config registers
// the block: `cfg.add_message_types<caf::id_block::spindle>()`.
//
// Keep one section per area and append at the end of yours.

#include <caf/type_id.hpp>

#include "spindle/messages/atoms.hpp"
#include "spindle/messages/context_manager.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/chat.hpp"
#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/threads.hpp"
#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/storage.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(spindle, caf::first_custom_type_id)

  // -- IDs and counters --------------------------------------------------------
  CAF_ADD_TYPE_ID(spindle, (spindle::id_range))
  CAF_ADD_TYPE_ID(spindle, (spindle::id_stats))

  // -- context items -------------------------------------------------------------
  CAF_ADD_TYPE_ID(spindle, (spindle::context_item))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::context_item>))
  CAF_ADD_TYPE_ID(spindle, (spindle::context_draft))
  CAF_ADD_TYPE_ID(spindle, (spindle::window_options))
  CAF_ADD_TYPE_ID(spindle, (spindle::context_add_result))
  CAF_ADD_TYPE_ID(spindle, (spindle::context_evicted))
  CAF_ADD_TYPE_ID(spindle, (spindle::context_released))
  CAF_ADD_TYPE_ID(spindle, (spindle::context_stats))
  CAF_ADD_TYPE_ID(spindle, (spindle::context_directory_stats))
  CAF_ADD_TYPE_ID(spindle, (spindle::context_manager_actor))

  // -- threads, memory, rewriter, builder ------------------------------------------
  CAF_ADD_TYPE_ID(spindle, (spindle::turn_role))
  CAF_ADD_TYPE_ID(spindle, (spindle::turn))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::turn>))
  CAF_ADD_TYPE_ID(spindle, (spindle::chat_message))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::chat_message>))
  CAF_ADD_TYPE_ID(spindle, (spindle::history_window))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_snapshot))
  CAF_ADD_TYPE_ID(spindle, (spindle::conflict_policy))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_ref))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_registry_stats))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_metadata))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_metadata_patch))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_info))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::thread_info>))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_list_request))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_page))
  CAF_ADD_TYPE_ID(spindle, (spindle::memory_query))
  CAF_ADD_TYPE_ID(spindle, (spindle::memory_snippet))
  CAF_ADD_TYPE_ID(spindle, (spindle::memory_record))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::memory_record>))
  CAF_ADD_TYPE_ID(spindle, (spindle::memory_list_request))
  CAF_ADD_TYPE_ID(spindle, (spindle::memory_listing))
  CAF_ADD_TYPE_ID(spindle, (spindle::rewrite_request))
  CAF_ADD_TYPE_ID(spindle, (spindle::rewrite_result))
  CAF_ADD_TYPE_ID(spindle, (spindle::build_options))
  CAF_ADD_TYPE_ID(spindle, (spindle::build_request))
  CAF_ADD_TYPE_ID(spindle, (spindle::built_context))
  CAF_ADD_TYPE_ID(spindle, (spindle::tool_call))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::tool_call>))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_summary))
  CAF_ADD_TYPE_ID(spindle, (spindle::thread_location))

  // -- orchestration ------------------------------------------------------------------
  CAF_ADD_TYPE_ID(spindle, (spindle::task_id))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::task_id>))
  CAF_ADD_TYPE_ID(spindle, (spindle::task_info))
  CAF_ADD_TYPE_ID(spindle, (spindle::task_tree))
  CAF_ADD_TYPE_ID(spindle, (spindle::task_claim))
  CAF_ADD_TYPE_ID(spindle, (spindle::process_worker))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::task_info>))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::process_worker>))
  CAF_ADD_TYPE_ID(spindle, (spindle::task_counts))
  CAF_ADD_TYPE_ID(spindle, (spindle::task_retry))
  // -- storage --------------------------------------------------------------------------
  CAF_ADD_TYPE_ID(spindle, (spindle::sql_value))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::sql_value>))
  CAF_ADD_TYPE_ID(spindle, (spindle::sql_statement))
  CAF_ADD_TYPE_ID(spindle, (std::vector<spindle::sql_statement>))
  CAF_ADD_TYPE_ID(spindle, (std::vector<std::vector<spindle::sql_value>>))
  // Shared by several areas; listed once, here.
  CAF_ADD_TYPE_ID(spindle, (std::vector<std::string>))

CAF_END_TYPE_ID_BLOCK(spindle)
