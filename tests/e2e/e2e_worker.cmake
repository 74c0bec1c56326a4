# `shoal worker` end to end: three real workers on one Redis stream (a real redis-server
# the test starts on loopback), one killed with SIGKILL mid-batch; and SIGTERM draining.
shoal_cc_test(NAME e2e_worker_test SRCS worker_test.cc
  DEPS shoal_e2e_util shoal_worker_testing shoal_http_test_client LABELS e2e TIMEOUT 240)
add_dependencies(e2e_worker_test shoal shoal_identity)
