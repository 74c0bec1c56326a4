# The live dashboard (dashboard.h): the data.json sampler, and the page's files embedded
# into the binary. The page draws with uPlot, which `npm ci` installs from the npm
# registry at the version src/server/dashboard/package-lock.json pins, into the build
# folder; cmake/EmbedFiles.cmake then writes dashboard_assets.cc with the bytes. With
# -DSHOAL_DASHBOARD=OFF nothing is installed and the list of files is empty.
set(dashboard_src ${CMAKE_CURRENT_SOURCE_DIR}/dashboard)
set(dashboard_manifest ${CMAKE_CURRENT_BINARY_DIR}/dashboard_assets.manifest)
set(dashboard_assets_cc ${CMAKE_CURRENT_BINARY_DIR}/dashboard_assets.cc)
set(dashboard_asset_deps)
if(SHOAL_DASHBOARD)
  find_program(SHOAL_NPM npm)
  if(NOT SHOAL_NPM)
    message(FATAL_ERROR
      "The dashboard page embeds uPlot, which the build installs with npm, and npm was not "
      "found. Install nodejs and npm (scripts/install-deps.sh does), or configure with "
      "-DSHOAL_DASHBOARD=OFF to build without the page (docs/dashboard.md).")
  endif()
  # Where node_modules goes; the dashboard's end-to-end test runs puppeteer-core from here.
  set(SHOAL_NPM_DIR ${PROJECT_BINARY_DIR}/npm CACHE INTERNAL "node_modules of the dashboard")
  set(npm_stamp ${SHOAL_NPM_DIR}/node_modules/.shoal-npm-ci)
  # The development dependencies (puppeteer-core) only when the end-to-end tests are built.
  set(npm_omit)
  if(NOT (SHOAL_BUILD_TESTS AND SHOAL_BUILD_E2E))
    set(npm_omit --omit=dev)
  endif()
  set(uplot_dir ${SHOAL_NPM_DIR}/node_modules/uplot)
  add_custom_command(
    # Only the stamp: npm gives the files it extracts an old fixed time, which would make
    # them look out of date forever. Whatever reads them depends on the stamp.
    OUTPUT ${npm_stamp}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${SHOAL_NPM_DIR}
    COMMAND ${CMAKE_COMMAND} -E copy ${dashboard_src}/package.json ${dashboard_src}/package-lock.json
            ${SHOAL_NPM_DIR}
    # Exactly what the lock file pins (integrity-checked), no install scripts run.
    COMMAND ${SHOAL_NPM} ci --prefix ${SHOAL_NPM_DIR} --ignore-scripts --no-audit --no-fund
            --loglevel=error ${npm_omit}
    COMMAND ${CMAKE_COMMAND} -E touch ${npm_stamp}
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    DEPENDS ${dashboard_src}/package.json ${dashboard_src}/package-lock.json
    COMMENT "npm ci: the dashboard's pinned npm packages (uPlot)"
    VERBATIM)
  # <name below /dashboard/>|<file>, one a line.
  set(manifest_text "index.html|${dashboard_src}/index.html
dashboard.js|${dashboard_src}/dashboard.js
dashboard.css|${dashboard_src}/dashboard.css
uplot.min.js|${uplot_dir}/dist/uPlot.iife.min.js
uplot.min.css|${uplot_dir}/dist/uPlot.min.css
uplot-LICENSE.txt|${uplot_dir}/LICENSE")
  set(dashboard_asset_deps ${dashboard_src}/index.html ${dashboard_src}/dashboard.js
      ${dashboard_src}/dashboard.css ${npm_stamp})
else()
  set(manifest_text "")
endif()
file(CONFIGURE OUTPUT ${dashboard_manifest} CONTENT "${manifest_text}\n")
add_custom_command(
  OUTPUT ${dashboard_assets_cc}
  COMMAND ${CMAKE_COMMAND} -DMANIFEST=${dashboard_manifest} -DOUTPUT=${dashboard_assets_cc}
          -P ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
  DEPENDS ${dashboard_manifest} ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
          ${dashboard_asset_deps}
  COMMENT "Embedding the dashboard's files"
  VERBATIM)

shoal_cc_library(NAME dashboard
  SRCS dashboard.cc process_stats.cc ${dashboard_assets_cc}
  HDRS dashboard.h dashboard_assets.h process_stats.h
  DEPS shoal_core shoal_proto shoal_runtime)
shoal_cc_test(NAME server_dashboard_test SRCS dashboard_test.cc
  DEPS shoal_dashboard shoal_runtime_testing)
if(SHOAL_BUILD_TESTS)
  add_dependencies(server_dashboard_test shoal_identity shoal_cost_model)
endif()
