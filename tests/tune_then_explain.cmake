# Runs `rpa tune` on a tiny head configuration, then `rpa explain --table`
# on the same configuration, which must report the tuned table as its source.
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/tiny.json
  "{\"configs\": [{\"name\": \"tiny\", \"num_q_heads\": 2, \"num_kv_heads\": 1, \"head_dim\": 32}]}")
execute_process(
  COMMAND ${RPA} tune --config ${WORK}/tiny.json --quick --max-model-len 1024 --output ${WORK}/table.json
  RESULT_VARIABLE tune_status)
if(NOT tune_status EQUAL 0)
  message(FATAL_ERROR "rpa tune failed: ${tune_status}")
endif()
# The decode workload's key: 16 batched tokens.
execute_process(
  COMMAND ${RPA} explain --num-q-heads 2 --num-kv-heads 1 --head-dim 32 --max-num-batched-tokens 16
          --max-model-len 1024 --table ${WORK}/table.json
  OUTPUT_VARIABLE explain_out RESULT_VARIABLE explain_status)
message(STATUS "${explain_out}")
if(NOT explain_status EQUAL 0 OR NOT explain_out MATCHES "\\(table;" OR NOT explain_out MATCHES "table.json")
  message(FATAL_ERROR "rpa explain did not use the tuned table:\n${explain_out}")
endif()
