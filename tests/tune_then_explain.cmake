# Runs `rpa tune` on a tiny head configuration over a table that already holds
# another CPU's section, then `rpa explain --table` on the same configuration,
# which must report this CPU's section of the tuned table as its source.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/tiny.json
  "{\"configs\": [{\"name\": \"tiny\", \"num_q_heads\": 2, \"num_kv_heads\": 1, \"head_dim\": 32}]}")
# The section tune must keep (read-modify-write).
file(WRITE ${WORK}/table.json [[
{"format": "rpa-tuned-block-sizes", "version": 2, "sections": [
  {"cpu": {"vendor": "OtherVendor", "model_name": "Other CPU", "family": 1, "model": 2,
           "features": "none"},
   "measured": "2026-01-02", "kernels": ["decode: other"],
   "entries": [{"q_dtype": "float32", "kv_dtype": "float32", "num_q_heads": 4,
                "num_kv_heads": 2, "head_dim": 64, "page_size": 16,
                "max_num_batched_tokens": 64, "max_model_len": 1024,
                "num_kv_pages_per_block": 3, "num_queries_per_block": 24}]}]}
]])
execute_process(
  COMMAND ${RPA} tune --config ${WORK}/tiny.json --quick --max-model-len 1024 --output ${WORK}/table.json
  RESULT_VARIABLE tune_status)
if(NOT tune_status EQUAL 0)
  message(FATAL_ERROR "rpa tune failed: ${tune_status}")
endif()
file(READ ${WORK}/table.json table)
string(JSON version GET "${table}" version)
string(JSON sections LENGTH "${table}" sections)
string(JSON kept GET "${table}" sections 0 cpu model_name)
string(JSON new_entries LENGTH "${table}" sections 1 entries)
string(JSON measured GET "${table}" sections 1 measured)
string(JSON kernels LENGTH "${table}" sections 1 kernels)
if(NOT version EQUAL 2 OR NOT sections EQUAL 2 OR NOT kept STREQUAL "Other CPU" OR
   NOT new_entries EQUAL 3 OR NOT measured MATCHES "^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]$" OR
   kernels LESS 2)
  message(FATAL_ERROR "rpa tune did not write this CPU's section beside the other:\n${table}")
endif()
# The decode workload's key: 16 batched tokens.
execute_process(
  COMMAND ${RPA} explain --num-q-heads 2 --num-kv-heads 1 --head-dim 32 --max-num-batched-tokens 16
          --max-model-len 1024 --table ${WORK}/table.json
  OUTPUT_VARIABLE explain_out RESULT_VARIABLE explain_status)
message(STATUS "${explain_out}")
if(NOT explain_status EQUAL 0 OR NOT explain_out MATCHES "\\(table;" OR NOT explain_out MATCHES "table.json"
   OR NOT explain_out MATCHES "this CPU's \\(the same")
  message(FATAL_ERROR "rpa explain did not use this CPU's section of the tuned table:\n${explain_out}")
endif()
