# The live dashboard end to end: the real `shoal serve` under load, its page in headless
# Chromium (Debian's chromium) driven by puppeteer-core, which the build's `npm ci`
# installs beside uPlot (src/server/dashboard.cmake). Only with the page built in.
if(SHOAL_DASHBOARD)
  find_program(SHOAL_NODE NAMES node nodejs)
  find_program(SHOAL_CHROMIUM NAMES chromium chromium-browser)
  shoal_cc_test(NAME e2e_dashboard_test SRCS dashboard_test.cc
    DEPS shoal_e2e_util shoal_http_test_client LABELS e2e TIMEOUT 180)
  add_dependencies(e2e_dashboard_test shoal shoal_identity shoal_cost_model)
  # A tool that is missing reaches the test as "...-NOTFOUND", and the test says so.
  set_property(TEST e2e_dashboard_test APPEND PROPERTY ENVIRONMENT
    "SHOAL_NODE=${SHOAL_NODE}" "SHOAL_CHROMIUM=${SHOAL_CHROMIUM}"
    "SHOAL_NODE_MODULES=${SHOAL_NPM_DIR}/node_modules")
endif()
