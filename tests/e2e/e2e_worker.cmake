# `shoal worker` end to end: three real workers on one Redis stream (a real redis-server
# the test starts on loopback), one killed with SIGKILL mid-batch; and SIGTERM draining.
shoal_cc_test(NAME e2e_worker_test SRCS worker_test.cc
  DEPS shoal_e2e_util shoal_worker_testing shoal_http_test_client LABELS e2e TIMEOUT 240)
add_dependencies(e2e_worker_test shoal shoal_identity)

# The producer examples of docs/worker.md run as written (Python with Debian's
# python3-redis, and redis-cli) against a real redis-server and `shoal worker` (~3 s).
# The first python3 on PATH may be another installation than Debian's, without its
# python3-redis: take the first of PATH's and Debian's that has the module.
find_program(SHOAL_E2E_PYTHON3 python3)
set(SHOAL_PYTHON3_REDIS "")
foreach(candidate ${SHOAL_E2E_PYTHON3} /usr/bin/python3)
  if(NOT SHOAL_PYTHON3_REDIS AND EXISTS "${candidate}")
    execute_process(COMMAND ${candidate} -c "import redis"
      RESULT_VARIABLE shoal_python_redis_missing OUTPUT_QUIET ERROR_QUIET)
    if(NOT shoal_python_redis_missing)
      set(SHOAL_PYTHON3_REDIS "${candidate}")
    endif()
  endif()
endforeach()
if(SHOAL_PYTHON3_REDIS)
  add_test(NAME e2e_worker_producer_example
    COMMAND ${SHOAL_PYTHON3_REDIS} ${CMAKE_CURRENT_SOURCE_DIR}/worker_producer_example.py)
  set_tests_properties(e2e_worker_producer_example PROPERTIES LABELS e2e TIMEOUT 120
    ENVIRONMENT "SHOAL_SOURCE_DIR=${PROJECT_SOURCE_DIR};SHOAL_BINARY_DIR=${PROJECT_BINARY_DIR}")
else()
  message(WARNING "python3 with the redis module not found (Debian package python3-redis): "
    "e2e_worker_producer_example not registered")
endif()
