# The `shoal` command's own checks, end to end: a --config file with an unknown key, options
# that do not apply, and `shoal inspect`'s exit status.
shoal_cc_test(NAME e2e_cli_test SRCS cli_test.cc DEPS shoal_e2e_util LABELS e2e)
add_dependencies(e2e_cli_test shoal)
