# A model whose output is not batch-major (NonMaxSuppression) over HTTP: dynamic batching
# is refused at load naming the output; unbatched it serves.
shoal_cc_test(NAME e2e_batch_major_test SRCS batch_major_test.cc
  DEPS shoal_e2e_util shoal_http_test_client LABELS e2e)
add_dependencies(e2e_batch_major_test shoal)
